package gateway

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway/h2guard"
)

// HTTP/2 abuse (issue 22): both listeners' HTTP/2 connections (h2c on
// the HTTP listener, gRPC) pass through h2guard, which cuts a connection
// whose client sends RST_STREAM, SETTINGS or PING frames above their
// budgets with GOAWAY ENHANCE_YOUR_CALM. Resets also draw from a bucket
// per tenant, shared by all of the tenant's connections, once a request
// on the connection authenticated (admit; identify for gRPC). The REST
// proxy's own connections are exempt: their resets are the HTTP
// clients' cancellations, which the HTTP side counts.

// newH2Guard is the guard both listeners share (so a cooldown earned on
// one applies on the other).
func (s *Server) newH2Guard() *h2guard.Guard {
	return &h2guard.Guard{
		Limits:       h2guard.Limits{Resets: h2ResetBudget, Settings: h2SettingsBudget, Pings: h2PingBudget},
		TenantResets: h2TenantResetBudget,
		Cooldown:     h2AbuseCooldown,
		OnCut:        s.h2Cut,
	}
}

// h2Cut records a connection cut for HTTP/2 abuse (or refused in
// cooldown).
func (s *Server) h2Cut(reason string) {
	s.metrics.rejected.WithLabelValues("h2_" + reason).Inc()
	if reason != "cooldown" {
		s.log.Warn("HTTP/2 connection cut: control frames above their rate (GOAWAY ENHANCE_YOUR_CALM); its address and tenant cool down",
			"frames", reason, "cooldown", h2AbuseCooldown)
	}
}

// guardHTTP2 wraps the plaintext HTTP listener (h2c is detected by its
// preface; HTTP/1 connections pass uncounted).
func (s *Server) guardHTTP2(lis net.Listener) net.Listener { return s.h2guard.Listener(lis) }

// guardCreds guards the gRPC listener's connections after their
// handshake (TLS or none), so frames are read in the clear.
type guardCreds struct {
	credentials.TransportCredentials
	s *Server
}

func (g guardCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, ai, err := g.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return c, ai, err
	}
	// An address in cooldown is cut at its first frame, not here: the
	// REST proxy's own connections (exempt) are known only once their
	// dial returned.
	hc := g.s.h2guard.Wrap(c, true)
	hc.Exempt(func(a net.Addr) bool { _, ok := g.s.proxyConns.Load(a.String()); return ok })
	key := raw.RemoteAddr().String()
	g.s.h2Conns.Store(key, hc)
	return &forgetConn{Conn: hc, forget: sync.OnceFunc(func() { g.s.h2Conns.Delete(key) })}, ai, nil
}

func (g guardCreds) Clone() credentials.TransportCredentials {
	return guardCreds{TransportCredentials: g.TransportCredentials.Clone(), s: g.s}
}

type forgetConn struct {
	net.Conn
	forget func()
}

func (c *forgetConn) Close() error {
	c.forget()
	return c.Conn.Close()
}

type h2ConnKey struct{}

// attributeH2 makes the resets of the connection that carried a call of
// tenant draw from tenant's bucket too: an HTTP request's connection
// (guardContext put it in the request context) or a gRPC call's (by its
// peer address).
func (s *Server) attributeH2(ctx context.Context, tenant bridge.Tenant) {
	hc, ok := ctx.Value(h2ConnKey{}).(*h2guard.Conn)
	if !ok {
		p, found := peer.FromContext(ctx)
		if !found || p.Addr == nil {
			return
		}
		v, found := s.h2Conns.Load(p.Addr.String())
		if !found {
			return
		}
		hc = v.(*h2guard.Conn)
	}
	hc.Attribute(string(tenant))
}

// withH2Conn is http.Server.ConnContext's part for h2guard.
func withH2Conn(ctx context.Context, c net.Conn) context.Context {
	if hc, ok := c.(*h2guard.Conn); ok {
		return context.WithValue(ctx, h2ConnKey{}, hc)
	}
	return ctx
}
