package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/openapi"
)

// Config configures a Server. Zero values take the defaults in params.go;
// New validates everything in one place.
type Config struct {
	// GRPCAddr and HTTPAddr are the listen addresses (default loopback
	// :9090 / :8080). Port 0 picks a free port; Server.GRPCAddr() and
	// Server.HTTPAddr() report the real ones after Start.
	GRPCAddr, HTTPAddr string
	// GRPCListener and HTTPListener, when set, are used instead of listening
	// on the addresses (tests, socket activation). The Server closes them.
	GRPCListener, HTTPListener net.Listener

	// Bridge is the service behind the API. Required. Server.Shutdown closes it.
	Bridge bridge.Service
	// Logger receives one structured line per RPC (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the gRPC metrics and is served on /metrics (default:
	// a new registry). Register process/Go collectors on it yourself.
	Registry *prometheus.Registry

	// Authenticator maps bearer tokens to tenants (default NoAuth: every
	// caller is tenant ""). TokenFile reads a file of token hashes; plug an
	// OIDC verifier in here.
	Authenticator Authenticator
	// AllowInsecureNoAuth lets a NoAuth server listen beyond loopback.
	// Without it Start refuses (ErrInsecureListen): with no tokens anyone
	// who reaches the port is every tenant at once. Set it only behind a
	// proxy that authenticates.
	AllowInsecureNoAuth bool
	// Limiter, if set, runs after authentication on every RPC (per-tenant
	// rate limits and quotas). nil allows everything.
	Limiter Limiter

	// MaxRecvMsgBytes / MaxSendMsgBytes bound one gRPC message in each
	// direction, on the server and on the REST proxy's client connection.
	MaxRecvMsgBytes, MaxSendMsgBytes int
	// MaxUploadBytes caps one upload (REST body: 413; gRPC stream:
	// InvalidArgument with reason TOO_LARGE).
	MaxUploadBytes int64
	// MaxJSONBodyBytes caps every other REST request body (413).
	MaxJSONBodyBytes int64
	// MaxConcurrentStreams per HTTP/2 connection on the gRPC listener
	// (0: DefaultMaxConcurrentStreams). REST unary calls run in-process;
	// the REST streams (watch, subscribe, upload, WebSocket) of one tenant
	// share that tenant's own connection to the gRPC listener, so this
	// bounds one tenant's concurrent REST streams (pool.go).
	MaxConcurrentStreams uint32

	// RateLimit is each tenant's sustained request rate per second over
	// gRPC and REST alike (a stream counts once, when it opens) and
	// RateBurst its bucket size. Over the limit: ResourceExhausted / HTTP
	// 429 with RetryInfo, a retry-after trailer and a Retry-After header.
	// 0 takes the default; negative disables the limit.
	RateLimit float64
	RateBurst int
	// MaxUploadsPerTenant caps concurrent UploadDocument streams (REST
	// uploads included) per tenant; MaxSubscribersPerTenant caps concurrent
	// event streams (SubscribeEvents, WatchDocument, WebSocket). 0 takes the
	// default; negative disables the cap.
	MaxUploadsPerTenant, MaxSubscribersPerTenant int
	// MaxDownloadsPerTenant caps concurrent result downloads (REST and
	// GetDocumentResult) per tenant (429 / ResourceExhausted, reason
	// TOO_MANY_DOWNLOADS, Retry-After 1). 0 takes the default; negative
	// disables the cap.
	MaxDownloadsPerTenant int
	// MaxTicketsPerTenant caps a tenant's outstanding WebSocket tickets
	// (429 TOO_MANY_TICKETS with Retry-After above it; ticket.go). 0 takes
	// the default; negative disables the cap.
	MaxTicketsPerTenant int
	// MaxClientIDsPerTenant bounds the X-Client-Id values of one tenant
	// tracked by the event log's retention at once (others are tracked by
	// address). 0 takes the default; negative: no bound.
	MaxClientIDsPerTenant int
	// UploadIdleTimeout cuts an upload whose body stalls: no bytes (REST)
	// or no message (gRPC) for this long ends it with HTTP 408 /
	// DeadlineExceeded, reason UPLOAD_STALLED.
	UploadIdleTimeout time.Duration

	// StreamWriteTimeout bounds how long one write to a streaming client may
	// block: a gRPC Send on SubscribeEvents, WatchDocument or
	// GetDocumentResult (ResourceExhausted, reason ConsumerTooSlow), a
	// write or flush of any REST response (NDJSON streams, result
	// downloads; the connection is closed) and a WebSocket frame (the
	// ConsumerTooSlow error frame). An idle stream with nothing to send is
	// never cut. 0: DefaultStreamWriteTimeout.
	StreamWriteTimeout time.Duration
	// GRPCKeepaliveTime and GRPCKeepaliveTimeout: the gRPC server pings a
	// connection idle for GRPCKeepaliveTime and closes it when the ping is
	// not answered within GRPCKeepaliveTimeout (dead peers). 0 takes the
	// defaults.
	GRPCKeepaliveTime, GRPCKeepaliveTimeout time.Duration
	// WSPingInterval: a WebSocket subscriber is pinged this often and cut
	// when it leaves a ping unanswered for half the interval (at most
	// 10 s): dead or stalled consumers are found, NAT bindings kept
	// alive. 0: DefaultWSPingInterval.
	WSPingInterval time.Duration

	// ReadHeaderTimeout and IdleTimeout protect the HTTP listener against
	// slowloris and idle connections. There is deliberately no WriteTimeout:
	// watch, subscribe and WebSocket responses stream for as long as the
	// client listens; StreamWriteTimeout bounds each write instead.
	ReadHeaderTimeout, IdleTimeout time.Duration

	// JSONBodyTimeout bounds a JSON request body (every REST body but
	// uploads): nothing may arrive for this long, and after it the body
	// must average MinBodyRate, so a small body has this plus its length
	// at MinBodyRate in total; a slower one answers 408 and the connection
	// is closed. 0: DefaultJSONBodyTimeout.
	JSONBodyTimeout time.Duration
	// MinBodyRate (bytes/s) is the slowest an upload body may arrive on
	// average after bodyRateGrace (408, reason UPLOAD_STALLED). 0 takes the
	// default; negative disables it (UploadIdleTimeout still applies).
	MinBodyRate int64
	// MaxConnsPerIP caps open connections per client IP address and
	// MaxConns in total, over both listeners; one more is closed at accept
	// (HTTP: after a 503 with Retry-After). 0 takes the defaults
	// (DefaultMaxConnsPerIP; the file descriptor limit less
	// connReserveFDs); negative disables the cap.
	MaxConnsPerIP, MaxConns int

	// DataDir, when set, is watched for free space (statfs): below
	// MinFreeDiskBytes /healthz answers 503 "low disk" and new documents
	// are refused with ResourceExhausted / HTTP 503, reason DISK_FULL,
	// Retry-After. 0 MinFreeDiskBytes: DefaultMinFreeDiskBytes; negative:
	// no threshold (a disk that is actually full still refuses).
	DataDir          string
	MinFreeDiskBytes int64

	// GRPCTLS and HTTPTLS, when set, serve TLS on the listeners. With
	// GRPCTLS, InternalDialTLS is what the REST proxy uses to dial the gRPC
	// listener (it must trust GRPCTLS's certificate); ServerTLSFiles builds
	// all three from a certificate and key. nil serves plaintext.
	GRPCTLS, HTTPTLS, InternalDialTLS *tls.Config

	// CORSOrigins are the web origins (scheme://host[:port]) whose pages
	// may call the REST API and open the WebSocket (--cors-origins): CORS
	// preflights and headers for them, their WebSocket handshakes
	// accepted. Empty: same-origin pages only, no CORS headers. Without
	// tokens on loopback they are also the only cross-site origins whose
	// writes are not refused (browser.go).
	CORSOrigins []string

	// Docs serves /openapi.json and /docs/ (default openapi.Handler(): the
	// embedded spec and Swagger UI).
	Docs http.Handler
}

func (c *Config) setDefaults() error {
	if c.Bridge == nil {
		return errors.New("gateway: Config.Bridge is required")
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = DefaultGRPCAddr
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Docs == nil {
		c.Docs = openapi.Handler()
	}
	if c.Authenticator == nil {
		c.Authenticator = NoAuth{}
	}
	if c.MaxRecvMsgBytes <= 0 {
		c.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if c.MaxSendMsgBytes <= 0 {
		c.MaxSendMsgBytes = DefaultMaxSendMsgBytes
	}
	if c.MaxUploadBytes <= 0 {
		c.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if c.MaxJSONBodyBytes <= 0 {
		c.MaxJSONBodyBytes = DefaultMaxJSONBodyBytes
	}
	if c.RateLimit == 0 {
		c.RateLimit = DefaultRateLimit
	}
	if c.RateBurst <= 0 {
		c.RateBurst = max(DefaultRateBurst, int(math.Ceil(c.RateLimit)))
	}
	c.setAdmissionDefaults()
	c.setStreamDefaults()
	c.CORSOrigins = normalizeOrigins(c.CORSOrigins)
	if err := checkCORSOrigins(c.CORSOrigins); err != nil {
		return err
	}
	if c.GRPCTLS != nil && c.InternalDialTLS == nil {
		return errors.New("gateway: Config.GRPCTLS is set but InternalDialTLS is not: the REST proxy needs a TLS config that trusts the gRPC certificate")
	}
	if c.MaxRecvMsgBytes < uploadChunkBytes+4096 {
		return errors.New("gateway: Config.MaxRecvMsgBytes must be at least 260 KiB so one upload chunk fits")
	}
	if c.MaxSendMsgBytes < resultChunkBytes+4096 {
		return errors.New("gateway: Config.MaxSendMsgBytes must be at least 260 KiB so one result chunk fits")
	}
	return nil
}

// setStreamDefaults fills the stream, keepalive and connection timeouts.
func (c *Config) setStreamDefaults() {
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.StreamWriteTimeout <= 0 {
		c.StreamWriteTimeout = DefaultStreamWriteTimeout
	}
	if c.WSPingInterval <= 0 {
		c.WSPingInterval = DefaultWSPingInterval
	}
	if c.GRPCKeepaliveTime <= 0 {
		c.GRPCKeepaliveTime = DefaultGRPCKeepaliveTime
	}
	if c.GRPCKeepaliveTimeout <= 0 {
		c.GRPCKeepaliveTimeout = DefaultGRPCKeepaliveTimeout
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
}

// setAdmissionDefaults fills the per-tenant, body and connection limits.
func (c *Config) setAdmissionDefaults() {
	if c.MaxUploadsPerTenant == 0 {
		c.MaxUploadsPerTenant = DefaultMaxUploadsPerTenant
	}
	if c.MaxSubscribersPerTenant == 0 {
		c.MaxSubscribersPerTenant = DefaultMaxSubscribersPerTenant
	}
	if c.MaxDownloadsPerTenant == 0 {
		c.MaxDownloadsPerTenant = DefaultMaxDownloadsPerTenant
	}
	if c.MaxTicketsPerTenant == 0 {
		c.MaxTicketsPerTenant = DefaultMaxTicketsPerTenant
	}
	if c.MaxClientIDsPerTenant == 0 {
		c.MaxClientIDsPerTenant = DefaultMaxClientIDsPerTenant
	}
	if c.UploadIdleTimeout <= 0 {
		c.UploadIdleTimeout = DefaultUploadIdleTimeout
	}
	if c.JSONBodyTimeout <= 0 {
		c.JSONBodyTimeout = DefaultJSONBodyTimeout
	}
	if c.MinBodyRate == 0 {
		c.MinBodyRate = DefaultMinBodyRate
	}
	if c.MinFreeDiskBytes == 0 {
		c.MinFreeDiskBytes = DefaultMinFreeDiskBytes
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.MaxConns == 0 {
		c.MaxConns = defaultMaxConns()
	}
}

// ErrInsecureListen is returned by Start when no authentication is
// configured and a listener would accept connections beyond loopback.
var ErrInsecureListen = errors.New("refusing to listen beyond loopback without authentication")

// CheckExposure enforces docs/architecture.md, "Security and limits": with NoAuth (no
// Authenticator) the server listens on loopback only unless
// AllowInsecureNoAuth. New calls it; callers may call it earlier to fail
// before starting anything else. "localhost", 127.0.0.0/8 and ::1 are
// loopback; 0.0.0.0, :: and an empty host (":8080") are not.
func (c *Config) CheckExposure() error {
	if !isNoAuth(c.Authenticator) || c.AllowInsecureNoAuth {
		return nil
	}
	for _, l := range []struct {
		name, flag, addr string
		lis              net.Listener
	}{
		{"gRPC", "--grpc-addr", c.GRPCAddr, c.GRPCListener},
		{"HTTP", "--http-addr", c.HTTPAddr, c.HTTPListener},
	} {
		addr := l.addr
		if l.lis != nil {
			addr = l.lis.Addr().String()
		}
		if !isLoopback(addr) {
			return fmt.Errorf("gateway: %w: %s %s %s is not a loopback address, and with no bearer tokens anyone who reaches it can read and submit every document. Configure tokens with --auth-tokens FILE (see `gateway hash-token`), listen on 127.0.0.1, or pass --insecure-no-auth if a proxy in front authenticates",
				ErrInsecureListen, l.name, l.flag, addr)
		}
	}
	return nil
}

func isNoAuth(a Authenticator) bool {
	switch a.(type) {
	case nil, NoAuth, *NoAuth:
		return true
	}
	return false
}

// isLoopback reports whether addr (host:port) only listens on loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
