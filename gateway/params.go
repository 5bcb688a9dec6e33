package gateway

import (
	"time"

	"github.com/pipestream/gateway/gateway/h2guard"
)

// Tunables. Each has one line of rationale; Config fields override the ones
// that operators need to change.
const (
	// DefaultGRPCAddr and DefaultHTTPAddr listen on loopback only: with no
	// authentication configured the server must not be reachable from other
	// hosts (docs/architecture.md, "Security and limits").
	DefaultGRPCAddr = "127.0.0.1:9090"
	DefaultHTTPAddr = "127.0.0.1:8080"

	// DefaultMaxRecvMsgBytes bounds one inbound gRPC message; uploads stream
	// in chunks, so nothing legitimate needs more than a few MiB.
	DefaultMaxRecvMsgBytes = 16 << 20
	// DefaultMaxSendMsgBytes bounds one outbound gRPC message (results are
	// streamed in resultChunkBytes messages, so any size passes).
	DefaultMaxSendMsgBytes = 64 << 20
	// DefaultMaxUploadBytes caps one REST upload body and one gRPC upload
	// stream (the bridge applies its own MaxDocumentBytes as well).
	DefaultMaxUploadBytes = 1 << 30
	// DefaultMaxJSONBodyBytes caps every other REST request body; inline
	// SubmitDocument content is base64 inside it.
	DefaultMaxJSONBodyBytes = 32 << 20

	// streamWorkers is how many goroutines the gRPC server keeps to run
	// calls (grpc.NumStreamWorkers): a call runs on a worker whose stack
	// has grown already, instead of a fresh goroutine that grows its
	// stack (runtime.copystack) down the interceptors, the bridge and the
	// store on every call; a call finding every worker busy gets a fresh
	// goroutine as before. Measured: docs/performance.md "gRPC stream
	// workers".
	streamWorkers = 128
	// uploadChunkBytes is the size of one UploadDocument message the REST
	// upload handler sends: big enough to amortize framing, small enough to
	// stay far below the message limit and keep memory per upload flat.
	uploadChunkBytes = 256 << 10
	// resultChunkBytes is the size of one GetDocumentResult message, for
	// the same reasons.
	resultChunkBytes = 256 << 10

	// DefaultRateLimit (requests/s per tenant) and DefaultRateBurst leave
	// room for busy polling clients and batch submitters while stopping one
	// tenant from saturating the store's single writer.
	DefaultRateLimit = 200
	DefaultRateBurst = 400
	// DefaultMaxUploadsPerTenant: each upload holds a spool file, a
	// goroutine and a QUIC entity stream; a handful per tenant is plenty.
	DefaultMaxUploadsPerTenant = 8
	// DefaultMaxSubscribersPerTenant bounds event streams (subscribe, watch,
	// WebSocket): each holds a goroutine and an event-log subscription.
	DefaultMaxSubscribersPerTenant = 64
	// DefaultUploadIdleTimeout cuts an upload body that stops arriving, so
	// a stalled client cannot hold a spool file and an upload slot forever.
	DefaultUploadIdleTimeout = 30 * time.Second
	// DefaultJSONBodyTimeout: a JSON request body (a few KiB normally)
	// must arrive within this, plus its declared length at the minimum body
	// rate, so a client trickling one cannot hold a connection.
	DefaultJSONBodyTimeout = 10 * time.Second
	// DefaultMinBodyRate (bytes/s, average after bodyRateGrace): an upload
	// slower than a very poor mobile link is an attack or a dead client.
	DefaultMinBodyRate = 1024
	// bodyRateGrace is how long an upload may take before the minimum
	// rate applies (TCP slow start, a client that opens its file late).
	bodyRateGrace = 10 * time.Second
	// DefaultMinFreeDiskBytes: below this much free space in the data
	// directory new documents are refused, so what is left goes to the
	// results of documents already accepted.
	DefaultMinFreeDiskBytes = 256 << 20
	// DefaultMaxConnsPerIP: browsers open 6 connections per host and busy
	// services a few dozen; 256 leaves room for proxies, while one address
	// cannot take the file descriptors of everyone else.
	DefaultMaxConnsPerIP = 256
	// connReserveFDs is kept from the file descriptor limit for everything
	// but client connections (store, spool and result files, the QUIC
	// socket, the REST proxy's connections, logs); minMaxConns is the
	// floor of the derived total cap.
	connReserveFDs = 256
	minMaxConns    = 64
	// proxyLaneIdle: a tenant's REST proxy connection for streams
	// (pool.go) closes after this long without a call and redials on the
	// next; its slots and windows are that tenant's alone.
	proxyLaneIdle = 5 * time.Minute
	// proxyStreamWindow and proxyConnWindow are the proxy connections'
	// fixed HTTP/2 receive windows: a stream whose client stopped reading
	// holds at most proxyStreamWindow in the proxy (BDP estimation, which
	// grows windows to several MiB, is off when they are set).
	proxyStreamWindow = 64 << 10
	proxyConnWindow   = 4 << 20
	// DefaultMaxDownloadsPerTenant caps concurrent result downloads (REST
	// and gRPC) per tenant: each holds an open file and a goroutine.
	DefaultMaxDownloadsPerTenant = 16
	// resultCopyBytes is the buffer of a REST result download, which
	// streams from the result file: what a stalled download costs besides
	// the socket.
	resultCopyBytes = 32 << 10
	// DefaultMaxTicketsPerTenant: a console asks for one WebSocket ticket
	// per connect and spends it within a second; 64 outstanding covers
	// many tabs and retries.
	DefaultMaxTicketsPerTenant = 64
	// DefaultMaxClientIDsPerTenant bounds the X-Client-Id values one
	// tenant can have tracked by the event log's retention at once; more
	// are tracked by address instead. clientIDIdle frees an unused one.
	DefaultMaxClientIDsPerTenant = 256
	clientIDIdle                 = time.Hour
	// DefaultMaxConcurrentStreams per HTTP/2 connection on the gRPC
	// listener; each tenant's REST proxy lane has as many, well above a
	// tenant's stream caps (subscribers + uploads + downloads).
	DefaultMaxConcurrentStreams = 1024
	// DefaultTokenPollInterval is how often the token file is checked for
	// changes: quick enough that a revoked token stops working within seconds.
	DefaultTokenPollInterval = 3 * time.Second

	// DefaultReadHeaderTimeout defeats slowloris clients that trickle headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout closes keep-alive connections nobody uses.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultStreamWriteTimeout bounds one blocked write to a streaming
	// client (gRPC Send, NDJSON write, WebSocket frame): a consumer that
	// cannot take one message in this time is too slow and is cut, freeing
	// its goroutines; the event log's own ConsumerTooSlow check normally
	// fires first for consumers that read, only slower than events arrive.
	DefaultStreamWriteTimeout = 30 * time.Second
	// DefaultWSPingInterval keeps NAT bindings alive and detects dead
	// WebSocket consumers.
	DefaultWSPingInterval = 20 * time.Second
	// DefaultSSEKeepAlive is below the idle timeouts of common proxies
	// (nginx proxy_read_timeout 60 s).
	DefaultSSEKeepAlive = 15 * time.Second
	// deadlineWriteBytes is the largest piece of a REST response written
	// under one write deadline: a client must take 64 KiB per
	// StreamWriteTimeout (about 2 KiB/s at 30 s), whatever the size of the
	// message being written (result chunks are 256 KiB).
	deadlineWriteBytes = 64 << 10
	// DefaultGRPCKeepaliveTime: the gRPC server pings a connection idle this
	// long, so dead peers (and NAT bindings that dropped them) are noticed
	// within minutes, not at the next TCP retransmit timeout.
	DefaultGRPCKeepaliveTime = 2 * time.Minute
	// DefaultGRPCKeepaliveTimeout is how long a ping may go unanswered
	// before the connection is closed.
	DefaultGRPCKeepaliveTimeout = 20 * time.Second
	// grpcKeepaliveMinTime: clients may ping at most this often (with or
	// without open streams: CLI watchers keep idle connections alive);
	// faster pingers get GOAWAY "too_many_pings".
	grpcKeepaliveMinTime = 15 * time.Second

	// DefaultShutdownTimeout is how long Shutdown drains before forcing.
	DefaultShutdownTimeout = 30 * time.Second

	// healthPollInterval is how often bridge.Ready() is mirrored into the
	// grpc.health.v1 status; cheap and fast enough for load balancers.
	healthPollInterval = time.Second

	// diskFreshAge is how long a free-space reading far from the threshold
	// stands in for a new one at admission (disk.go): 100 ms at 10,000
	// submissions a second saves ~1,000 statfs calls per reading.
	diskFreshAge = 100 * time.Millisecond

	// wsMaxFrameBytes: draft-holmgren-at-synchronization-00, Frame Format:
	// "A frame MUST NOT exceed 5 MB in total size".
	wsMaxFrameBytes = 5_000_000
	// wsPongTimeout is the longest a consumer has to answer a ping
	// (Config.WSPingInterval / 2 when that is shorter).
	wsPongTimeout = 10 * time.Second

	// requestIDHeader is the metadata key (and HTTP header) carrying the
	// request id in and out.
	requestIDHeader = "x-request-id"
	// subscribedHeader is the response header SubscribeEvents and
	// WatchDocument send once the subscription started (auth and limits
	// passed, cursor accepted); it is not forwarded to HTTP clients.
	subscribedHeader = "x-pipestream-subscribed"
	// resultSizeHeader is the GetDocumentResult response header with the
	// result's total size in bytes (REST: Content-Length).
	resultSizeHeader = "x-pipestream-result-size"
	// admittedHeader marks a gRPC call the REST side admitted already
	// (upload_http.go, preAdmitted); its value is Server.admitNonce.
	admittedHeader = "x-pipestream-admitted"
	// maxRequestIDLen bounds a client-supplied request id; longer ones are
	// replaced, not trusted.
	maxRequestIDLen = 128

	// errorDomain is the ErrorInfo domain of every error this API returns.
	errorDomain = "pipestream.gateway.v1"
)

// HTTP/2 control-frame budgets (h2abuse.go, issue 22). A client cancels a
// stream now and then (a closed tab, a cancelled watch), changes its
// SETTINGS once or twice and pings for liveness every few seconds;
// rapid reset (CVE-2023-44487) sends tens of thousands of resets a
// second, settings and ping floods as many control frames. Above a
// budget the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed.
var (
	// h2ResetBudget: RST_STREAM per connection.
	h2ResetBudget = h2guard.Budget{PerSecond: 50, Burst: 100}
	// h2TenantResetBudget: RST_STREAM per tenant over all its
	// connections, so more connections do not buy more resets.
	h2TenantResetBudget = h2guard.Budget{PerSecond: 100, Burst: 200}
	// h2SettingsBudget: SETTINGS (not ACKs) per connection.
	h2SettingsBudget = h2guard.Budget{PerSecond: 2, Burst: 10}
	// h2PingBudget: PING (not ACKs) per connection; grpc-go's BDP
	// estimator pings once per window of received data.
	h2PingBudget = h2guard.Budget{PerSecond: 20, Burst: 50}
)

// h2AbuseCooldown: after a cut, new connections from the client's
// address are closed at accept and the connection's tenant has any
// connection cut at its first authenticated request, for this long; an
// abuser then costs an accept per connection, not a connection's worth
// of streams. Clients behind the same address (NAT) wait it out too.
const h2AbuseCooldown = 10 * time.Second
