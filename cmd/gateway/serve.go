package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/gateway"
	"github.com/pipestream/gateway/internal/serve"
	"github.com/pipestream/gateway/quicpeer"
)

const serveHelp = `Run the gateway: gRPC on --grpc-addr, REST/WebSocket/docs/metrics on
--http-addr, backed by PipeStream peers over QUIC (TLS 1.3): --peer, repeated
for several (new documents go to the least-loaded healthy one; see
docs/scale-out.md). Without --peer it starts a processing peer in-process,
reached over quicpeer's in-process transport (--embedded-peer-transport quic:
on a loopback UDP port, its certificate pinned), so this one command runs
the whole system. SIGINT/SIGTERM shut
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
    --auth-tokens /etc/pipestream/tokens --tls-cert gw.pem --tls-key gw-key.pem
  gateway serve --peer 10.0.0.7:4433 --peer 10.0.0.8:4433 \
    --peer-ca peer7-cert.pem --peer-ca peer8-cert.pem   # several peers`

// runServe is `gateway serve`, in named steps: the flags become a
// serve.Config (config), --store opens the PostgreSQL store if given
// (store), and serve.Run starts the bridge and the servers and waits for a
// signal (bridge, servers, wait).
func runServe(args []string) int {
	f, code, ok := parseServeFlags(args)
	if !ok {
		return code
	}
	cfg, err := f.config()
	if err != nil {
		return fail(os.Stderr, "serve", err)
	}
	ctx := context.Background()
	if err := useStore(ctx, &cfg.Bridge, *f.storeURL, cfg.Logger); err != nil {
		return fail(os.Stderr, "serve", err)
	}
	if err := serve.Run(ctx, cfg); err != nil {
		return fail(os.Stderr, "serve", err)
	}
	return 0
}

// serveFlags are the flags of `gateway serve` (values after parsing).
type serveFlags struct {
	grpcAddr         *string
	httpAddr         *string
	dataDir          *string
	storeURL         *string
	peerAddrs        *[]string
	peerCAs          *[]string
	peerNames        *[]string
	peerCert         *string
	peerKey          *string
	preferPB         *bool
	peerFramings     *[]string
	peerProfile      *string
	peerIdle         *time.Duration
	peerWait         *time.Duration
	createHold       *time.Duration
	peerD04Conns     *int64
	embeddedPeer     *string
	authTokens       *string
	insecureNoAuth   *bool
	corsOrigins      *string
	tlsCert          *string
	tlsKey           *string
	maxUpload        *int64
	maxJSON          *int64
	maxRecv          *int64
	maxSend          *int64
	maxStreams       *uint
	rateLimit        *float64
	rateBurst        *uint
	maxUploads       *uint
	maxSubs          *uint
	maxDownloads     *uint
	maxTickets       *uint
	maxClientIDs     *uint
	uploadIdle       *time.Duration
	wsPing           *time.Duration
	streamWrite      *time.Duration
	keepaliveTime    *time.Duration
	keepaliveTimeout *time.Duration
	jsonBodyTimeout  *time.Duration
	minBodyRate      *int64
	maxConnsPerIP    *uint
	maxConns         *uint
	minFreeDisk      *int64
	readHeader       *time.Duration
	idleTimeout      *time.Duration
	inline           *int64
	shutdown         *time.Duration
	logLevel         *string
	logFormat        *string
	pprofAddr        *string
	// eventLog builds the event log's options (retention flags).
	eventLog func() (eventlog.Options, error)
}

// newServeFlags defines serve's flags on fs.
func newServeFlags(fs *flagSet) *serveFlags {
	return &serveFlags{
		grpcAddr:         fs.String("grpc-addr", "GATEWAY_GRPC_ADDR", gateway.DefaultGRPCAddr, "gRPC listen address"),
		httpAddr:         fs.String("http-addr", "GATEWAY_HTTP_ADDR", gateway.DefaultHTTPAddr, "HTTP listen address (REST, WebSocket, /healthz, /metrics, /docs/)"),
		dataDir:          fs.String("data-dir", "GATEWAY_DATA_DIR", "./data", "directory for the store, spool and results (the embedded peer uses <data-dir>/peer)"),
		storeURL:         fs.String("store", "GATEWAY_STORE", "", storeFlagHelp),
		peerAddrs:        fs.Strings("peer", "GATEWAY_PEER", "UDP host:port of an external PipeStream peer, once per peer: new documents go to the least-loaded healthy one (none: start one in-process)"),
		peerCAs:          fs.Strings("peer-ca", "GATEWAY_PEER_CA", "PEM file of the CA or certificate(s) that verify --peer (required with --peer): once for every peer, or once per --peer in the same order"),
		peerNames:        fs.Strings("peer-server-name", "GATEWAY_PEER_SERVER_NAME", "TLS server name of --peer (default: its host): once for every peer, or once per --peer in the same order"),
		peerCert:         fs.String("peer-cert", "GATEWAY_PEER_CLIENT_CERT", "", "PEM client certificate presented to --peer (mutual TLS; with --peer-key)"),
		peerKey:          fs.String("peer-key", "GATEWAY_PEER_CLIENT_KEY", "", "PEM private key of --peer-cert"),
		preferPB:         fs.Bool("prefer-protobuf", "GATEWAY_PREFER_PROTOBUF", false, "offer the Protobuf serialization format (CBOR otherwise)"),
		peerFramings:     fs.Strings("peer-framing", "GATEWAY_PEER_FRAMING", "control-stream framing toward --peer: auto (the default: draft-02, and draft-04 when the peer refuses the draft-02 handshake or shows draft-04), draft-02 or draft-04 (the reference suite: one document per connection); once for every peer, or once per --peer in the same order"),
		peerProfile:      fs.String("peer-profile", "GATEWAY_PEER_PROFILE", "auto", "use this project's profile toward --peer: auto (when the peer answers its discovery member), on, or off (plain draft-02 entities; docs/profile.md 9)"),
		peerIdle:         fs.Duration("peer-idle-timeout", "GATEWAY_PEER_IDLE_TIMEOUT", quicpeer.DefaultIdleTimeout, "a peer session that hears nothing from the peer (not even ACKs of the QUIC PINGs sent every third of this) for this long is lost: its documents are re-dispatched"),
		peerWait:         fs.Duration("peer-wait", "GATEWAY_PEER_WAIT", 5*time.Minute, "how long a document may wait for a peer session before it fails"),
		createHold:       fs.Duration("create-hold", "GATEWAY_CREATE_HOLD", 20*time.Millisecond, "how long a small document's creation may wait to commit together with its result (0: commit the creation first; at most 5s)"),
		embeddedPeer:     fs.String("embedded-peer-transport", "GATEWAY_EMBEDDED_PEER_TRANSPORT", "", "how the gateway reaches its embedded peer (without --peer; refused with it): inproc (the default: PipeStream streams and frames between the two in memory, no packets) or quic (QUIC with TLS 1.3 on a loopback UDP port, as an external peer)"),
		peerD04Conns:     fs.Int64("peer-draft04-conns", "GATEWAY_PEER_DRAFT04_CONNS", 4, "connections open at once to one draft-04 peer (one document each; 1-64): the next handshakes overlap the running conversation"),
		authTokens:       fs.String("auth-tokens", "GATEWAY_AUTH_TOKENS", "", "file of \"sha256:<hex> <tenant>\" lines (see gateway hash-token); empty: no authentication, loopback only"),
		insecureNoAuth:   fs.Bool("insecure-no-auth", "GATEWAY_INSECURE_NO_AUTH", false, "allow listening beyond loopback without --auth-tokens (only behind a proxy that authenticates)"),
		corsOrigins:      fs.String("cors-origins", "GATEWAY_CORS_ORIGINS", "", "comma-separated web origins (scheme://host[:port]) whose pages may call the REST API and WebSocket (CORS); empty: same-origin only"),
		tlsCert:          fs.String("tls-cert", "GATEWAY_TLS_CERT", "", "PEM certificate chain for TLS on the gRPC and HTTP listeners (with --tls-key)"),
		tlsKey:           fs.String("tls-key", "GATEWAY_TLS_KEY", "", "PEM private key of --tls-cert"),
		maxUpload:        fs.Int64("max-upload-bytes", "GATEWAY_MAX_UPLOAD_BYTES", gateway.DefaultMaxUploadBytes, "largest document accepted (REST body and gRPC upload)"),
		maxJSON:          fs.Int64("max-json-body-bytes", "GATEWAY_MAX_JSON_BODY_BYTES", gateway.DefaultMaxJSONBodyBytes, "largest REST request body other than uploads"),
		maxRecv:          fs.Int64("max-recv-msg-bytes", "GATEWAY_MAX_RECV_MSG_BYTES", gateway.DefaultMaxRecvMsgBytes, "largest gRPC request message"),
		maxSend:          fs.Int64("max-send-msg-bytes", "GATEWAY_MAX_SEND_MSG_BYTES", gateway.DefaultMaxSendMsgBytes, "largest gRPC response message (results stream in 256 KiB messages, so any size of result fits)"),
		maxStreams:       fs.Uint("max-concurrent-streams", "GATEWAY_MAX_CONCURRENT_STREAMS", gateway.DefaultMaxConcurrentStreams, "concurrent gRPC streams per connection (the REST proxy shares one connection)"),
		rateLimit:        fs.Float64("rate-limit", "GATEWAY_RATE_LIMIT", gateway.DefaultRateLimit, "requests per second per tenant (0: unlimited)"),
		rateBurst:        fs.Uint("rate-burst", "GATEWAY_RATE_BURST", gateway.DefaultRateBurst, "burst of requests per tenant above --rate-limit"),
		maxUploads:       fs.Uint("max-uploads-per-tenant", "GATEWAY_MAX_UPLOADS_PER_TENANT", gateway.DefaultMaxUploadsPerTenant, "concurrent uploads per tenant (0: unlimited)"),
		maxSubs:          fs.Uint("max-subscribers-per-tenant", "GATEWAY_MAX_SUBSCRIBERS_PER_TENANT", gateway.DefaultMaxSubscribersPerTenant, "concurrent event streams (subscribe, watch, WebSocket) per tenant (0: unlimited)"),
		maxDownloads:     fs.Uint("max-downloads-per-tenant", "GATEWAY_MAX_DOWNLOADS_PER_TENANT", gateway.DefaultMaxDownloadsPerTenant, "concurrent result downloads (REST and gRPC) per tenant (0: unlimited)"),
		maxTickets:       fs.Uint("max-tickets-per-tenant", "GATEWAY_MAX_TICKETS_PER_TENANT", gateway.DefaultMaxTicketsPerTenant, "outstanding WebSocket tickets per tenant (0: unlimited)"),
		maxClientIDs:     fs.Uint("max-client-ids-per-tenant", "GATEWAY_MAX_CLIENT_IDS_PER_TENANT", gateway.DefaultMaxClientIDsPerTenant, "X-Client-Id values per tenant tracked for event retention at once; more are tracked by address (0: unbounded)"),
		uploadIdle:       fs.Duration("upload-idle-timeout", "GATEWAY_UPLOAD_IDLE_TIMEOUT", gateway.DefaultUploadIdleTimeout, "cut an upload whose body sends nothing for this long"),
		wsPing:           fs.Duration("ws-ping-interval", "GATEWAY_WS_PING_INTERVAL", gateway.DefaultWSPingInterval, "ping WebSocket subscribers this often; one that leaves a ping unanswered for half of it (at most 10s) is cut"),
		streamWrite:      fs.Duration("stream-write-timeout", "GATEWAY_STREAM_WRITE_TIMEOUT", gateway.DefaultStreamWriteTimeout, "cut a streaming client (gRPC stream, REST response, WebSocket) that takes nothing of a pending message for this long"),
		keepaliveTime:    fs.Duration("grpc-keepalive-time", "GATEWAY_GRPC_KEEPALIVE_TIME", gateway.DefaultGRPCKeepaliveTime, "ping gRPC connections idle for this long"),
		keepaliveTimeout: fs.Duration("grpc-keepalive-timeout", "GATEWAY_GRPC_KEEPALIVE_TIMEOUT", gateway.DefaultGRPCKeepaliveTimeout, "close a gRPC connection whose keepalive ping is not answered within this"),
		jsonBodyTimeout:  fs.Duration("json-body-timeout", "GATEWAY_JSON_BODY_TIMEOUT", gateway.DefaultJSONBodyTimeout, "a JSON request body may send nothing for this long, and must average --min-body-rate after it"),
		minBodyRate:      fs.Int64("min-body-rate", "GATEWAY_MIN_BODY_RATE", gateway.DefaultMinBodyRate, "slowest average upload body rate in bytes/s after the first 10 s (0: off)"),
		maxConnsPerIP:    fs.Uint("max-conns-per-ip", "GATEWAY_MAX_CONNS_PER_IP", gateway.DefaultMaxConnsPerIP, "open connections per client IP address over both listeners (0: unlimited)"),
		maxConns:         fs.Uint("max-conns", "GATEWAY_MAX_CONNS", 0, "open client connections in total over both listeners (0: the file descriptor limit less 256)"),
		minFreeDisk:      fs.Int64("min-free-disk", "GATEWAY_MIN_FREE_DISK", gateway.DefaultMinFreeDiskBytes, "below this much free space in --data-dir, /healthz reports low disk and new documents get 503 DISK_FULL (0: off)"),
		readHeader:       fs.Duration("read-header-timeout", "GATEWAY_READ_HEADER_TIMEOUT", gateway.DefaultReadHeaderTimeout, "time an HTTP client has to send its request headers"),
		idleTimeout:      fs.Duration("idle-timeout", "GATEWAY_IDLE_TIMEOUT", gateway.DefaultIdleTimeout, "close idle HTTP keep-alive connections after this long"),
		inline:           fs.Int64("inline-threshold", "GATEWAY_INLINE_THRESHOLD", 1<<20, "documents up to this size without a split strategy are sent whole"),
		shutdown:         fs.Duration("shutdown-timeout", "GATEWAY_SHUTDOWN_TIMEOUT", gateway.DefaultShutdownTimeout, "how long a graceful shutdown may take"),
		logLevel:         fs.String("log-level", "GATEWAY_LOG_LEVEL", "info", "debug, info, warn or error"),
		logFormat:        fs.String("log-format", "GATEWAY_LOG_FORMAT", "text", "text or json"),
		pprofAddr:        fs.String("pprof-addr", "GATEWAY_PPROF_ADDR", "", "serve net/http/pprof on this loopback address (empty: off; see docs/performance.md)"),
		eventLog:         retentionFlags(fs), // docs/retention.md
	}
}

// parseServeFlags parses serve's command line; ok false: exit with code
// (help, or a usage error already printed).
func parseServeFlags(args []string) (f *serveFlags, code int, ok bool) {
	fs := newFlags("serve", "gateway [serve] [flags]", serveHelp)
	f = newServeFlags(fs)
	if code, ok := fs.parse(args); !ok {
		return nil, code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gateway serve: unexpected argument %q (flags only; see --help)\n", fs.Arg(0))
		return nil, 2, false
	}
	if err := checkPeerFlags(*f.peerAddrs, *f.peerCAs, *f.peerNames, *f.peerFramings); err != nil {
		fmt.Fprintf(os.Stderr, "gateway serve: %v (see 'gateway serve --help')\n", err)
		return nil, 2, false
	}
	return f, 0, true
}

// config turns the flags into what serve.Run takes (the store is opened
// after, from --store).
func (f *serveFlags) config() (serve.Config, error) {
	log, err := newLogger(*f.logLevel, *f.logFormat)
	if err != nil {
		return serve.Config{}, err
	}
	bopts, err := f.bridgeOptions()
	if err != nil {
		return serve.Config{}, err
	}
	return serve.Config{
		Gateway:         f.gatewayConfig(log),
		Bridge:          bopts,
		Logger:          log,
		PeerAddrs:       *f.peerAddrs,
		PeerCAFiles:     *f.peerCAs,
		PeerServerNames: *f.peerNames,
		PeerFramings:    *f.peerFramings,
		PeerCertFile:    *f.peerCert,
		PeerKeyFile:     *f.peerKey,
		AuthTokensFile:  *f.authTokens,
		TLSCertFile:     *f.tlsCert,
		TLSKeyFile:      *f.tlsKey,
		PprofAddr:       *f.pprofAddr,
		EmbeddedPeer:    *f.embeddedPeer,
		ShutdownTimeout: *f.shutdown,
	}, nil
}

// gatewayConfig is the gateway's part of the flags. The command line's
// limits take 0 for unlimited, the gateway's Config a negative value
// (unlimited).
func (f *serveFlags) gatewayConfig(log *slog.Logger) gateway.Config {
	return gateway.Config{
		GRPCAddr:                *f.grpcAddr,
		HTTPAddr:                *f.httpAddr,
		Logger:                  log,
		AllowInsecureNoAuth:     *f.insecureNoAuth,
		CORSOrigins:             strings.Split(*f.corsOrigins, ","),
		MaxUploadBytes:          *f.maxUpload,
		MaxJSONBodyBytes:        *f.maxJSON,
		MaxRecvMsgBytes:         int(min(*f.maxRecv, 1<<31-1)),
		MaxSendMsgBytes:         int(min(*f.maxSend, 1<<31-1)),
		MaxConcurrentStreams:    uint32(*f.maxStreams),
		RateLimit:               unlimited[float64](*f.rateLimit),
		RateBurst:               int(*f.rateBurst),
		MaxUploadsPerTenant:     unlimited[int](*f.maxUploads),
		MaxSubscribersPerTenant: unlimited[int](*f.maxSubs),
		MaxDownloadsPerTenant:   unlimited[int](*f.maxDownloads),
		MaxClientIDsPerTenant:   unlimited[int](*f.maxClientIDs),
		MaxTicketsPerTenant:     unlimited[int](*f.maxTickets),
		UploadIdleTimeout:       *f.uploadIdle,
		StreamWriteTimeout:      *f.streamWrite,
		WSPingInterval:          *f.wsPing,
		GRPCKeepaliveTime:       *f.keepaliveTime,
		GRPCKeepaliveTimeout:    *f.keepaliveTimeout,
		ReadHeaderTimeout:       *f.readHeader,
		JSONBodyTimeout:         *f.jsonBodyTimeout,
		DataDir:                 *f.dataDir,
		MinFreeDiskBytes:        unlimited[int64](*f.minFreeDisk),
		MinBodyRate:             unlimited[int64](*f.minBodyRate),
		MaxConnsPerIP:           unlimited[int](*f.maxConnsPerIP),
		MaxConns:                int(min(*f.maxConns, 1<<24)),
		IdleTimeout:             *f.idleTimeout,
	}
}

// bridgeOptions is the bridge's part of the flags (the store is set
// later by useStore).
func (f *serveFlags) bridgeOptions() (bridge.Options, error) {
	evOpts, err := f.eventLog()
	if err != nil {
		return bridge.Options{}, err
	}
	hold, err := createHold(*f.createHold)
	if err != nil {
		return bridge.Options{}, err
	}
	bopts := bridge.Options{
		CreateHold:       hold,
		DataDir:          *f.dataDir,
		PreferProtobuf:   *f.preferPB,
		InlineThreshold:  *f.inline,
		MaxDocumentBytes: *f.maxUpload,
		EventLog:         evOpts,
		PeerWait:         *f.peerWait,
		PeerIdleTimeout:  *f.peerIdle,
		PeerDraft04Conns: int(min(max(*f.peerD04Conns, -1), 1<<20)), // the bridge checks the range
	}
	if err := peerModes(&bopts, *f.peerFramings, *f.peerProfile); err != nil {
		return bridge.Options{}, err
	}
	return bopts, nil
}

// unlimited maps a command-line limit, where 0 means unlimited, to the
// gateway Config's convention, where a negative value means unlimited
// (and 0 takes the default), in the Config field's type.
func unlimited[To int | int64 | float64, From uint | int64 | float64](v From) To {
	if v == 0 {
		return -1
	}
	return To(v)
}

func ptr[T any](v T) *T { return &v }

// checkPeerFlags checks how the repeated peer flags pair up (a usage
// error otherwise).
func checkPeerFlags(addrs, cas, names, framings []string) error {
	specs, err := serve.MatchPeers(addrs, cas, names)
	if err != nil {
		return err
	}
	if len(specs) == 0 && len(framings) > 1 {
		return fmt.Errorf("--peer-framing is given %d times without --peer: give it once (the embedded peer) or once per --peer", len(framings))
	}
	return serve.MatchFramings(specs, framings)
}

// peerModes parses --peer-framing (given once: for every peer; given per
// peer, serve applies each) and --peer-profile into o.
func peerModes(o *bridge.Options, framings []string, profile string) error {
	framing := "auto"
	if len(framings) == 1 {
		framing = framings[0]
	}
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

// createHold maps --create-hold to bridge.Options.CreateHold, where 0
// means the default: the flag's 0 turns the hold off. The bridge bounds
// it above.
func createHold(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("--create-hold %v: must not be negative (0 turns the hold off)", d)
	case d == 0:
		return -1, nil
	}
	return d, nil
}
