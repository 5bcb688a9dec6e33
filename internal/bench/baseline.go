package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"

	"github.com/quic-go/quic-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pipestream/gateway/quicpeer"
)

// rawQUIC is the quic-go baseline: one loopback connection with the
// PipeStream TLS 1.3 configuration (same certificate kind, same ALPN, same
// uni-stream cap as quicpeer) and no protocol on top. The server reads
// every uni stream to EOF and reports its length on got; with echo it
// sends what it read back on a uni stream of its own, which the client
// reads to EOF (reported on got instead).
type rawQUIC struct {
	ln   *quic.Listener
	cc   *quic.Conn
	echo bool
	got  chan int64
	done chan struct{}
}

func newRawQUIC(ctx context.Context) (*rawQUIC, error) { return newRawQUICMode(ctx, false) }

func newRawQUICMode(ctx context.Context, echo bool) (*rawQUIC, error) {
	cert, pem, err := quicpeer.SelfSignedCert()
	if err != nil {
		return nil, err
	}
	ctls, err := quicpeer.ClientTLS(pem)
	if err != nil {
		return nil, err
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", quicpeer.ServerTLS(cert), &quic.Config{MaxIncomingUniStreams: 1024})
	if err != nil {
		return nil, err
	}
	r := &rawQUIC{ln: ln, echo: echo, got: make(chan int64, 1<<16), done: make(chan struct{})}
	go r.serve()
	r.cc, err = quic.DialAddr(ctx, ln.Addr().String(), ctls, &quic.Config{MaxIncomingUniStreams: 1024})
	if err != nil {
		r.close()
		return nil, err
	}
	if echo {
		go r.readBack()
	}
	return r, nil
}

// drainStream reads st to EOF and returns its length (-1: an error).
func drainStream(st *quic.ReceiveStream) int64 {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, err := st.Read(buf)
		n += int64(k)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return -1
			}
			return n
		}
	}
}

// readBack reads the echo streams on the client and reports their lengths.
func (r *rawQUIC) readBack() {
	for {
		st, err := r.cc.AcceptUniStream(context.Background())
		if err != nil {
			return
		}
		go func() { r.got <- drainStream(st) }()
	}
}

// echoBack sends b back on a new uni stream of sc.
func echoBack(sc *quic.Conn, b []byte) int64 {
	st, err := sc.OpenUniStreamSync(context.Background())
	if err != nil {
		return -1
	}
	if _, err := st.Write(b); err != nil {
		return -1
	}
	if st.Close() != nil {
		return -1
	}
	return 0
}

func (r *rawQUIC) serve() {
	defer close(r.done)
	sc, err := r.ln.Accept(context.Background())
	if err != nil {
		return
	}
	for {
		st, err := sc.AcceptUniStream(context.Background())
		if err != nil {
			return
		}
		go func() {
			if !r.echo {
				r.got <- drainStream(st)
				return
			}
			b, err := io.ReadAll(io.LimitReader(st, 1<<20))
			if err != nil || echoBack(sc, b) < 0 {
				r.got <- -1 // the client counts the echoes it reads
			}
		}()
	}
}

func (r *rawQUIC) close() {
	if r.cc != nil {
		r.cc.CloseWithError(0, "")
	}
	r.ln.Close()
	<-r.done
}

// rawCodec sends a *[]byte as the gRPC message itself: the grpc-go
// baseline has no protobuf layer.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = data
	return nil
}
func (rawCodec) Name() string { return "bench-raw" }

// baselineDesc is the hand-registered grpc-go baseline service: a unary
// call answering 256 octets (about a Document's size) and a client-stream
// upload answering the byte count.
var baselineDesc = grpc.ServiceDesc{
	ServiceName: "pipestream.bench.Baseline",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Unary", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		var in []byte
		if err := dec(&in); err != nil {
			return nil, err
		}
		out := make([]byte, 256)
		return &out, nil
	}}},
	Streams: []grpc.StreamDesc{{StreamName: "Upload", ClientStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
		var n uint64
		for {
			var b []byte
			if err := st.RecvMsg(&b); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return err
			}
			n += uint64(len(b))
		}
		out := binary.BigEndian.AppendUint64(nil, n)
		return st.SendMsg(&out)
	}}},
}

const (
	unaryMethod  = "/pipestream.bench.Baseline/Unary"
	uploadMethod = "/pipestream.bench.Baseline/Upload"
)

// grpcBaseline is a bare grpc-go server and a client connection to it.
type grpcBaseline struct {
	srv  *grpc.Server
	conn *grpc.ClientConn
}

// newGRPCBaseline serves the baseline on loopback, over TLS 1.3 with a
// self-signed certificate when useTLS, else plaintext (as the gateway's
// listener in the bench).
func newGRPCBaseline(useTLS bool) (*grpcBaseline, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sopts := []grpc.ServerOption{grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(16 << 20), grpc.MaxConcurrentStreams(4096)}
	ccreds := insecure.NewCredentials()
	if useTLS {
		cert, pem, err := quicpeer.SelfSignedCert()
		if err != nil {
			lis.Close()
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})))
		ccreds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
	}
	srv := grpc.NewServer(sopts...)
	srv.RegisterService(&baselineDesc, struct{}{})
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(ccreds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return &grpcBaseline{srv: srv, conn: conn}, nil
}

func (g *grpcBaseline) close() {
	g.conn.Close()
	g.srv.Stop()
}
