package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	"github.com/pipestream/gateway/quicpeer/peer"
)

const serveHelp = `Run the gateway: gRPC on --grpc-addr, REST/WebSocket/docs/metrics on
--http-addr, backed by a PipeStream peer over QUIC (TLS 1.3). Without --peer it
starts a processing peer in-process on a loopback UDP port and pins its
certificate, so this one command runs the whole system. SIGINT/SIGTERM shut
down gracefully (GOAWAY to the peer, drain, then stop).

Example:
  gateway --data-dir /var/lib/pipestream
  gateway serve --peer peer.example:4433 --peer-ca peer-ca.pem`

func runServe(args []string) int {
	fs := newFlags("serve", "gateway [serve] [flags]", serveHelp)
	grpcAddr := fs.String("grpc-addr", "GATEWAY_GRPC_ADDR", gateway.DefaultGRPCAddr, "gRPC listen address")
	httpAddr := fs.String("http-addr", "GATEWAY_HTTP_ADDR", gateway.DefaultHTTPAddr, "HTTP listen address (REST, WebSocket, /healthz, /metrics, /docs/)")
	dataDir := fs.String("data-dir", "GATEWAY_DATA_DIR", "./data", "directory for the store, spool and results (the embedded peer uses <data-dir>/peer)")
	peerAddr := fs.String("peer", "GATEWAY_PEER", "", "UDP host:port of an external PipeStream peer (empty: start one in-process)")
	peerCA := fs.String("peer-ca", "GATEWAY_PEER_CA", "", "PEM file of the CA or certificate that verifies --peer (required with --peer)")
	peerName := fs.String("peer-server-name", "GATEWAY_PEER_SERVER_NAME", "", "TLS server name of --peer (default: its host)")
	preferPB := fs.Bool("prefer-protobuf", "GATEWAY_PREFER_PROTOBUF", false, "offer the Protobuf serialization format (CBOR otherwise)")
	maxUpload := fs.Int64("max-upload-bytes", "GATEWAY_MAX_UPLOAD_BYTES", gateway.DefaultMaxUploadBytes, "largest document accepted (REST body and gRPC upload)")
	maxSend := fs.Int64("max-send-msg-bytes", "GATEWAY_MAX_SEND_MSG_BYTES", gateway.DefaultMaxSendMsgBytes, "largest gRPC response message (bounds GetDocumentResult)")
	inline := fs.Int64("inline-threshold", "GATEWAY_INLINE_THRESHOLD", 1<<20, "documents up to this size without a split strategy are sent whole")
	shutdown := fs.Duration("shutdown-timeout", "GATEWAY_SHUTDOWN_TIMEOUT", gateway.DefaultShutdownTimeout, "how long a graceful shutdown may take")
	logLevel := fs.String("log-level", "GATEWAY_LOG_LEVEL", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "GATEWAY_LOG_FORMAT", "text", "text or json")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gateway serve: unexpected argument %q (flags only; see --help)\n", fs.Arg(0))
		return 2
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return fail(os.Stderr, "serve", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	bopts := bridge.Options{
		DataDir:          *dataDir,
		PeerAddr:         *peerAddr,
		PeerServerName:   *peerName,
		PreferProtobuf:   *preferPB,
		InlineThreshold:  *inline,
		MaxDocumentBytes: *maxUpload,
		Logger:           log.With("component", "bridge"),
		Registerer:       reg,
	}
	var embedded *peer.Server
	if *peerAddr == "" {
		if *peerCA != "" || *peerName != "" {
			return fail(os.Stderr, "serve", errors.New("--peer-ca and --peer-server-name need --peer"))
		}
		embedded, err = peer.Start(peer.Options{
			ListenAddr: "127.0.0.1:0",
			DataDir:    filepath.Join(*dataDir, "peer"),
			Logger:     log.With("component", "peer"),
			Offer:      ptr(peer.DefaultOffer(*preferPB)),
		})
		if err != nil {
			return fail(os.Stderr, "serve", fmt.Errorf("start embedded peer: %w", err))
		}
		bopts.PeerAddr = embedded.Addr().String()
		bopts.PeerCAPEM = embedded.CertPEM()
		log.Info("embedded peer listening (QUIC, certificate pinned)", "addr", bopts.PeerAddr)
	} else {
		if *peerCA == "" {
			return fail(os.Stderr, "serve", errors.New("--peer needs --peer-ca FILE: the PEM CA or certificate that verifies the peer"))
		}
		if bopts.PeerCAPEM, err = os.ReadFile(*peerCA); err != nil {
			return fail(os.Stderr, "serve", fmt.Errorf("read --peer-ca: %w", err))
		}
	}
	stopPeer := func() {
		if embedded == nil {
			return
		}
		pctx, cancel := context.WithTimeout(context.Background(), *shutdown)
		defer cancel()
		if err := embedded.Shutdown(pctx); err != nil {
			log.Warn("embedded peer shutdown", "error", err)
		}
	}

	b, err := bridge.New(ctx, bopts)
	if err != nil {
		stopPeer()
		return fail(os.Stderr, "serve", err)
	}
	srv, err := gateway.New(gateway.Config{
		GRPCAddr:        *grpcAddr,
		HTTPAddr:        *httpAddr,
		Bridge:          b,
		Logger:          log,
		Registry:        reg,
		MaxUploadBytes:  *maxUpload,
		MaxSendMsgBytes: int(*maxSend),
	})
	if err != nil {
		closeBridge(b, *shutdown)
		stopPeer()
		return fail(os.Stderr, "serve", err)
	}
	err = srv.Serve(ctx, *shutdown) // closes the bridge on the way out
	stopPeer()
	if err != nil {
		return fail(os.Stderr, "serve", err)
	}
	return 0
}

func closeBridge(b *bridge.Bridge, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_ = b.Close(ctx)
}

func ptr[T any](v T) *T { return &v }
