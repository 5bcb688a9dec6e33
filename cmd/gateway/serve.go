package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	"github.com/pipestream/gateway/internal/bench"
	"github.com/pipestream/gateway/quicpeer/peer"
)

const serveHelp = `Run the gateway: gRPC on --grpc-addr, REST/WebSocket/docs/metrics on
--http-addr, backed by a PipeStream peer over QUIC (TLS 1.3). Without --peer it
starts a processing peer in-process on a loopback UDP port and pins its
certificate, so this one command runs the whole system. SIGINT/SIGTERM shut
down gracefully (GOAWAY to the peer, drain, then stop).

Security (docs/security.md): --auth-tokens FILE maps bearer tokens (stored as
SHA-256 hashes, see 'gateway hash-token') to tenants; the file is re-read
when it changes and on SIGHUP. Without tokens the server only listens on
loopback unless --insecure-no-auth. --tls-cert/--tls-key serve TLS on both
listeners. /healthz, /metrics, /openapi.json, /docs/, gRPC health and
reflection need no token.

Example:
  gateway --data-dir /var/lib/pipestream
  gateway serve --peer peer.example:4433 --peer-ca peer-ca.pem \
    --grpc-addr 0.0.0.0:9090 --http-addr 0.0.0.0:8443 \
    --auth-tokens /etc/pipestream/tokens --tls-cert gw.pem --tls-key gw-key.pem`

func runServe(args []string) int {
	fs := newFlags("serve", "gateway [serve] [flags]", serveHelp)
	grpcAddr := fs.String("grpc-addr", "GATEWAY_GRPC_ADDR", gateway.DefaultGRPCAddr, "gRPC listen address")
	httpAddr := fs.String("http-addr", "GATEWAY_HTTP_ADDR", gateway.DefaultHTTPAddr, "HTTP listen address (REST, WebSocket, /healthz, /metrics, /docs/)")
	dataDir := fs.String("data-dir", "GATEWAY_DATA_DIR", "./data", "directory for the store, spool and results (the embedded peer uses <data-dir>/peer)")
	storeURL := fs.String("store", "GATEWAY_STORE", "", storeFlagHelp)
	peerAddr := fs.String("peer", "GATEWAY_PEER", "", "UDP host:port of an external PipeStream peer (empty: start one in-process)")
	peerCA := fs.String("peer-ca", "GATEWAY_PEER_CA", "", "PEM file of the CA or certificate that verifies --peer (required with --peer)")
	peerName := fs.String("peer-server-name", "GATEWAY_PEER_SERVER_NAME", "", "TLS server name of --peer (default: its host)")
	peerCert := fs.String("peer-cert", "GATEWAY_PEER_CLIENT_CERT", "", "PEM client certificate presented to --peer (mutual TLS; with --peer-key)")
	peerKey := fs.String("peer-key", "GATEWAY_PEER_CLIENT_KEY", "", "PEM private key of --peer-cert")
	preferPB := fs.Bool("prefer-protobuf", "GATEWAY_PREFER_PROTOBUF", false, "offer the Protobuf serialization format (CBOR otherwise)")
	peerFraming := fs.String("peer-framing", "GATEWAY_PEER_FRAMING", "auto", "control-stream framing toward --peer: auto (draft-02, and draft-04 when the peer refuses the draft-02 handshake or shows draft-04), draft-02 or draft-04 (the reference suite: one document per connection)")
	peerProfile := fs.String("peer-profile", "GATEWAY_PEER_PROFILE", "auto", "use this project's profile toward --peer: auto (when the peer answers its discovery member), on, or off (plain draft-02 entities; docs/profile.md 9)")
	peerWait := fs.Duration("peer-wait", "GATEWAY_PEER_WAIT", 5*time.Minute, "how long a document may wait for a peer session before it fails")
	authTokens := fs.String("auth-tokens", "GATEWAY_AUTH_TOKENS", "", "file of \"sha256:<hex> <tenant>\" lines (see gateway hash-token); empty: no authentication, loopback only")
	insecureNoAuth := fs.Bool("insecure-no-auth", "GATEWAY_INSECURE_NO_AUTH", false, "allow listening beyond loopback without --auth-tokens (only behind a proxy that authenticates)")
	corsOrigins := fs.String("cors-origins", "GATEWAY_CORS_ORIGINS", "", "comma-separated web origins (scheme://host[:port]) whose pages may call the REST API and WebSocket (CORS); empty: same-origin only")
	tlsCert := fs.String("tls-cert", "GATEWAY_TLS_CERT", "", "PEM certificate chain for TLS on the gRPC and HTTP listeners (with --tls-key)")
	tlsKey := fs.String("tls-key", "GATEWAY_TLS_KEY", "", "PEM private key of --tls-cert")
	maxUpload := fs.Int64("max-upload-bytes", "GATEWAY_MAX_UPLOAD_BYTES", gateway.DefaultMaxUploadBytes, "largest document accepted (REST body and gRPC upload)")
	maxJSON := fs.Int64("max-json-body-bytes", "GATEWAY_MAX_JSON_BODY_BYTES", gateway.DefaultMaxJSONBodyBytes, "largest REST request body other than uploads")
	maxRecv := fs.Int64("max-recv-msg-bytes", "GATEWAY_MAX_RECV_MSG_BYTES", gateway.DefaultMaxRecvMsgBytes, "largest gRPC request message")
	maxSend := fs.Int64("max-send-msg-bytes", "GATEWAY_MAX_SEND_MSG_BYTES", gateway.DefaultMaxSendMsgBytes, "largest gRPC response message (results stream in 256 KiB messages, so any size of result fits)")
	maxStreams := fs.Uint("max-concurrent-streams", "GATEWAY_MAX_CONCURRENT_STREAMS", gateway.DefaultMaxConcurrentStreams, "concurrent gRPC streams per connection (the REST proxy shares one connection)")
	rateLimit := fs.Float64("rate-limit", "GATEWAY_RATE_LIMIT", gateway.DefaultRateLimit, "requests per second per tenant (0: unlimited)")
	rateBurst := fs.Uint("rate-burst", "GATEWAY_RATE_BURST", gateway.DefaultRateBurst, "burst of requests per tenant above --rate-limit")
	maxUploads := fs.Uint("max-uploads-per-tenant", "GATEWAY_MAX_UPLOADS_PER_TENANT", gateway.DefaultMaxUploadsPerTenant, "concurrent uploads per tenant (0: unlimited)")
	maxSubs := fs.Uint("max-subscribers-per-tenant", "GATEWAY_MAX_SUBSCRIBERS_PER_TENANT", gateway.DefaultMaxSubscribersPerTenant, "concurrent event streams (subscribe, watch, WebSocket) per tenant (0: unlimited)")
	maxDownloads := fs.Uint("max-downloads-per-tenant", "GATEWAY_MAX_DOWNLOADS_PER_TENANT", gateway.DefaultMaxDownloadsPerTenant, "concurrent result downloads (REST and gRPC) per tenant (0: unlimited)")
	maxClientIDs := fs.Uint("max-client-ids-per-tenant", "GATEWAY_MAX_CLIENT_IDS_PER_TENANT", gateway.DefaultMaxClientIDsPerTenant, "X-Client-Id values per tenant tracked for event retention at once; more are tracked by address (0: unbounded)")
	uploadIdle := fs.Duration("upload-idle-timeout", "GATEWAY_UPLOAD_IDLE_TIMEOUT", gateway.DefaultUploadIdleTimeout, "cut an upload whose body sends nothing for this long")
	streamWrite := fs.Duration("stream-write-timeout", "GATEWAY_STREAM_WRITE_TIMEOUT", gateway.DefaultStreamWriteTimeout, "cut a streaming client (gRPC stream, REST response, WebSocket) that takes nothing of a pending message for this long")
	keepaliveTime := fs.Duration("grpc-keepalive-time", "GATEWAY_GRPC_KEEPALIVE_TIME", gateway.DefaultGRPCKeepaliveTime, "ping gRPC connections idle for this long")
	keepaliveTimeout := fs.Duration("grpc-keepalive-timeout", "GATEWAY_GRPC_KEEPALIVE_TIMEOUT", gateway.DefaultGRPCKeepaliveTimeout, "close a gRPC connection whose keepalive ping is not answered within this")
	jsonBodyTimeout := fs.Duration("json-body-timeout", "GATEWAY_JSON_BODY_TIMEOUT", gateway.DefaultJSONBodyTimeout, "a JSON request body may send nothing for this long, and must average --min-body-rate after it")
	minBodyRate := fs.Int64("min-body-rate", "GATEWAY_MIN_BODY_RATE", gateway.DefaultMinBodyRate, "slowest average upload body rate in bytes/s after the first 10 s (0: off)")
	maxConnsPerIP := fs.Uint("max-conns-per-ip", "GATEWAY_MAX_CONNS_PER_IP", gateway.DefaultMaxConnsPerIP, "open connections per client IP address over both listeners (0: unlimited)")
	maxConns := fs.Uint("max-conns", "GATEWAY_MAX_CONNS", 0, "open client connections in total over both listeners (0: the file descriptor limit less 256)")
	minFreeDisk := fs.Int64("min-free-disk", "GATEWAY_MIN_FREE_DISK", gateway.DefaultMinFreeDiskBytes, "below this much free space in --data-dir, /healthz reports low disk and new documents get 503 DISK_FULL (0: off)")
	readHeader := fs.Duration("read-header-timeout", "GATEWAY_READ_HEADER_TIMEOUT", gateway.DefaultReadHeaderTimeout, "time an HTTP client has to send its request headers")
	idleTimeout := fs.Duration("idle-timeout", "GATEWAY_IDLE_TIMEOUT", gateway.DefaultIdleTimeout, "close idle HTTP keep-alive connections after this long")
	inline := fs.Int64("inline-threshold", "GATEWAY_INLINE_THRESHOLD", 1<<20, "documents up to this size without a split strategy are sent whole")
	shutdown := fs.Duration("shutdown-timeout", "GATEWAY_SHUTDOWN_TIMEOUT", gateway.DefaultShutdownTimeout, "how long a graceful shutdown may take")
	logLevel := fs.String("log-level", "GATEWAY_LOG_LEVEL", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "GATEWAY_LOG_FORMAT", "text", "text or json")
	pprofAddr := fs.String("pprof-addr", "GATEWAY_PPROF_ADDR", "", "serve net/http/pprof on this loopback address (empty: off; see docs/performance.md)")
	eventLogOpts := retentionFlags(fs) // docs/retention.md
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
	evOpts, err := eventLogOpts()
	if err != nil {
		return fail(os.Stderr, "serve", err)
	}

	// The data dir's lock comes before anything in it is touched (the
	// bridge cleans the upload spool at start): a second gateway on the
	// same dir exits here, naming the holder.
	lock, err := lockDataDir(*dataDir, "--data-dir")
	if err != nil {
		return fail(os.Stderr, "serve", err)
	}
	defer lock.release()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	forceOnSecondSignal(ctx, log)
	if *pprofAddr != "" {
		addr, stopPprof, err := bench.ServePprof(*pprofAddr)
		if err != nil {
			return fail(os.Stderr, "serve", err)
		}
		defer stopPprof()
		log.Info("pprof listening", "addr", addr.String())
	}

	gcfg := gateway.Config{
		GRPCAddr:                *grpcAddr,
		HTTPAddr:                *httpAddr,
		Logger:                  log,
		AllowInsecureNoAuth:     *insecureNoAuth,
		CORSOrigins:             strings.Split(*corsOrigins, ","),
		MaxUploadBytes:          *maxUpload,
		MaxJSONBodyBytes:        *maxJSON,
		MaxRecvMsgBytes:         int(min(*maxRecv, 1<<31-1)),
		MaxSendMsgBytes:         int(min(*maxSend, 1<<31-1)),
		MaxConcurrentStreams:    uint32(*maxStreams),
		RateLimit:               orUnlimited(*rateLimit),
		RateBurst:               int(*rateBurst),
		MaxUploadsPerTenant:     int(orUnlimited(float64(*maxUploads))),
		MaxSubscribersPerTenant: int(orUnlimited(float64(*maxSubs))),
		MaxDownloadsPerTenant:   int(orUnlimited(float64(*maxDownloads))),
		MaxClientIDsPerTenant:   int(orUnlimited(float64(*maxClientIDs))),
		UploadIdleTimeout:       *uploadIdle,
		StreamWriteTimeout:      *streamWrite,
		GRPCKeepaliveTime:       *keepaliveTime,
		GRPCKeepaliveTimeout:    *keepaliveTimeout,
		ReadHeaderTimeout:       *readHeader,
		JSONBodyTimeout:         *jsonBodyTimeout,
		DataDir:                 *dataDir,
		MinFreeDiskBytes:        int64(orUnlimited(float64(*minFreeDisk))),
		MinBodyRate:             int64(orUnlimited(float64(*minBodyRate))),
		MaxConnsPerIP:           int(orUnlimited(float64(*maxConnsPerIP))),
		MaxConns:                int(min(*maxConns, 1<<24)),
		IdleTimeout:             *idleTimeout,
	}
	if *authTokens != "" {
		tf, err := loadTokens(ctx, *authTokens, log)
		if err != nil {
			return fail(os.Stderr, "serve", err)
		}
		gcfg.Authenticator = tf
	}
	if *tlsCert != "" || *tlsKey != "" {
		tc, err := gateway.ServerTLSFiles(*tlsCert, *tlsKey)
		if err != nil {
			return fail(os.Stderr, "serve", err)
		}
		gcfg.GRPCTLS, gcfg.HTTPTLS, gcfg.InternalDialTLS = tc.GRPC, tc.HTTP, tc.InternalDial
	}

	if err := gcfg.CheckExposure(); err != nil {
		return fail(os.Stderr, "serve", err)
	}

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
		EventLog:         evOpts,
		PeerWait:         *peerWait,
	}
	if err := peerModes(&bopts, *peerFraming, *peerProfile); err != nil {
		return fail(os.Stderr, "serve", err)
	}
	if err := readPeerClientCert(&bopts, *peerCert, *peerKey); err != nil {
		return fail(os.Stderr, "serve", err)
	}
	if *peerAddr == "" && (*peerCA != "" || *peerName != "" || *peerCert != "") {
		return fail(os.Stderr, "serve", errors.New("--peer-ca, --peer-server-name and --peer-cert need --peer (the embedded peer is pinned and loopback-only)"))
	}
	stopPeer, err := connectPeer(&bopts, *peerCA, *preferPB, *shutdown, log)
	if err != nil {
		return fail(os.Stderr, "serve", err)
	}

	if err := useStore(ctx, &bopts, *storeURL, log); err != nil {
		stopPeer()
		return fail(os.Stderr, "serve", err)
	}
	b, err := bridge.New(ctx, bopts)
	if err != nil {
		stopPeer()
		return fail(os.Stderr, "serve", err)
	}
	gcfg.Bridge, gcfg.Registry = b, reg
	srv, err := gateway.New(gcfg)
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

// orUnlimited maps the command line's "0 = unlimited" to the gateway
// Config's "negative = unlimited" (where 0 takes the default).
func orUnlimited(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

func ptr[T any](v T) *T { return &v }

// peerModes parses --peer-framing and --peer-profile into o.
func peerModes(o *bridge.Options, framing, profile string) error {
	f, err := bridge.ParseFraming(framing)
	if err != nil {
		return fmt.Errorf("--peer-framing: %w", err)
	}
	p, err := bridge.ParseProfileMode(profile)
	if err != nil {
		return fmt.Errorf("--peer-profile: %w", err)
	}
	o.PeerFraming, o.PeerProfile = f, p
	return nil
}

// loadTokens loads the token file, reloads it when it changes (polled)
// and on SIGHUP until ctx ends.
func loadTokens(ctx context.Context, path string, log *slog.Logger) (*gateway.TokenFile, error) {
	tf, err := gateway.LoadTokenFile(path, log.With("component", "auth"))
	if err != nil {
		return nil, fmt.Errorf("--auth-tokens: %w", err)
	}
	if tf.Len() == 0 {
		log.Warn("the token file has no entries: every API call will be refused until lines from 'gateway hash-token' are added", "path", path)
	}
	go tf.Watch(ctx, gateway.DefaultTokenPollInterval)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = tf.Reload()
			}
		}
	}()
	log.Info("bearer token authentication on", "tokens", tf.Len(), "file", path)
	return tf, nil
}

// connectPeer fills the peer fields of bopts: with bopts.PeerAddr set, the
// CA of peerCA; otherwise it locks <data-dir>/peer and starts the embedded
// peer there, pinned. stop shuts the embedded peer down (a no-op for an
// external one).
func connectPeer(bopts *bridge.Options, peerCA string, preferPB bool, shutdown time.Duration, log *slog.Logger) (stop func(), err error) {
	if bopts.PeerAddr != "" {
		if peerCA == "" {
			return nil, errors.New("--peer needs --peer-ca FILE: the PEM CA or certificate that verifies the peer")
		}
		if bopts.PeerCAPEM, err = os.ReadFile(peerCA); err != nil {
			return nil, fmt.Errorf("read --peer-ca: %w", err)
		}
		return func() {}, nil
	}
	dir := filepath.Join(bopts.DataDir, "peer")
	lock, err := lockDataDir(dir, "embedded peer --data-dir")
	if err != nil {
		return nil, err
	}
	embedded, err := peer.Start(peer.Options{
		ListenAddr: "127.0.0.1:0",
		DataDir:    dir,
		Logger:     log.With("component", "peer"),
		Offer:      ptr(peer.DefaultOffer(preferPB)),
	})
	if err != nil {
		lock.release()
		return nil, fmt.Errorf("start embedded peer: %w", err)
	}
	bopts.PeerAddr = embedded.Addr().String()
	bopts.PeerCAPEM = embedded.CertPEM()
	log.Info("embedded peer listening (QUIC, certificate pinned)", "addr", bopts.PeerAddr)
	return func() {
		defer lock.release()
		pctx, cancel := context.WithTimeout(context.Background(), shutdown)
		defer cancel()
		if err := embedded.Shutdown(pctx); err != nil {
			log.Warn("embedded peer shutdown", "error", err)
		}
	}, nil
}

// readPeerClientCert loads the client certificate presented to the peer
// (mutual TLS), if any.
func readPeerClientCert(bopts *bridge.Options, certFile, keyFile string) (err error) {
	if (certFile == "") != (keyFile == "") {
		return errors.New("set both --peer-cert and --peer-key, or neither")
	}
	if certFile == "" {
		return nil
	}
	if bopts.PeerClientCertPEM, err = os.ReadFile(certFile); err != nil {
		return fmt.Errorf("read --peer-cert: %w", err)
	}
	if bopts.PeerClientKeyPEM, err = os.ReadFile(keyFile); err != nil {
		return fmt.Errorf("read --peer-key: %w", err)
	}
	return nil
}

// forceOnSecondSignal: once ctx ended with the first SIGINT/SIGTERM (a
// graceful shutdown within --shutdown-timeout), a second one ends the
// process at once with exit code 1, as Go tools and servers people like do.
// Accepted work is durable in the store; a restart resumes it.
func forceOnSecondSignal(ctx context.Context, log *slog.Logger) {
	go func() {
		<-ctx.Done()
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		<-again
		log.Warn("second signal: exiting now without finishing the graceful shutdown")
		os.Exit(1)
	}()
}
