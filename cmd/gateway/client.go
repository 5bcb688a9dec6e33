package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// clientFlags are shared by the client verbs.
type clientFlags struct {
	addr, token, tlsCA, tlsName *string
}

func addClientFlags(fs *flagSet) clientFlags {
	return clientFlags{
		addr:    fs.String("addr", "GATEWAY_ADDR", "127.0.0.1:9090", "gRPC address of the gateway"),
		token:   fs.String("token", "GATEWAY_TOKEN", "", "bearer token, sent as \"authorization: Bearer <token>\""),
		tlsCA:   fs.String("tls-ca", "GATEWAY_TLS_CA", "", "PEM CA bundle (or the server's certificate) that verifies a gateway serving TLS; empty: plaintext"),
		tlsName: fs.String("tls-server-name", "GATEWAY_TLS_SERVER_NAME", "", "TLS server name to verify (default: the host of --addr)"),
	}
}

// client is a connected DocumentService client; ctx ends on SIGINT/SIGTERM.
type client struct {
	conn *grpc.ClientConn
	docs gatewayv1.DocumentServiceClient
	ctx  context.Context
	stop context.CancelFunc
}

func (c clientFlags) dial() (*client, error) {
	creds := insecure.NewCredentials()
	if *c.tlsCA != "" {
		tc, err := gateway.ClientTLS(*c.tlsCA, *c.tlsName)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	} else if *c.tlsName != "" {
		return nil, errors.New("--tls-server-name needs --tls-ca")
	}
	conn, err := grpc.NewClient(*c.addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", *c.addr, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if *c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+*c.token)
	}
	return &client{conn: conn, docs: gatewayv1.NewDocumentServiceClient(conn), ctx: ctx, stop: stop}, nil
}

func (c *client) Close() {
	c.stop()
	c.conn.Close()
}

// rpcError formats a gRPC error as "Code: message".
func rpcError(err error) error {
	if st, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %s", st.Code(), st.Message())
	}
	return err
}

// oneArg checks that exactly one positional argument was given.
func oneArg(fs *flagSet, what string) (string, bool) {
	if fs.NArg() != 1 {
		fmt.Fprintf(os.Stderr, "gateway %s: want exactly one %s (see --help)\n", fs.Name(), what)
		return "", false
	}
	return fs.Arg(0), true
}

// printJSON prints m as indented JSON (protojson field names; stable
// two-space indentation, unlike protojson's deliberately unstable spacing).
func printJSON(m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = os.Stdout.Write(out.Bytes())
	return err
}
