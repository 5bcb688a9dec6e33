package gateway

import (
	"crypto/tls"
	"errors"
	"log/slog"
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
	// caller is tenant ""). Plug a token file or OIDC verifier in here.
	Authenticator Authenticator
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
	// (0: grpc-go default).
	MaxConcurrentStreams uint32

	// ReadHeaderTimeout and IdleTimeout protect the HTTP listener against
	// slowloris and idle connections. There is deliberately no WriteTimeout:
	// watch, subscribe and WebSocket responses stream for as long as the
	// client listens.
	ReadHeaderTimeout, IdleTimeout time.Duration

	// GRPCTLS and HTTPTLS, when set, serve TLS on the listeners. With
	// GRPCTLS, InternalDialTLS is what the REST proxy uses to dial the gRPC
	// listener (it must trust GRPCTLS's certificate). Hooks for a later
	// issue; nil serves plaintext (loopback deployments).
	GRPCTLS, HTTPTLS, InternalDialTLS *tls.Config

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
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.GRPCTLS != nil && c.InternalDialTLS == nil {
		return errors.New("gateway: Config.GRPCTLS is set but InternalDialTLS is not: the REST proxy needs a TLS config that trusts the gRPC certificate")
	}
	if c.MaxRecvMsgBytes < uploadChunkBytes+4096 {
		return errors.New("gateway: Config.MaxRecvMsgBytes must be at least 260 KiB so one upload chunk fits")
	}
	return nil
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
