package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pipestream/gateway/bridge"
)

// Admission before any body is read (issue 11): connection caps at
// accept, authentication from the request head, then body deadlines.

// --- connection caps ---

// connLimiter counts open connections in total over both listeners and
// per client IP on the HTTP listener (the gRPC listener multiplexes calls
// on few connections, and the REST proxy's own connections come from
// loopback: it has the total cap only). A connection above a cap is
// closed right after accept (the HTTP listener first writes a 503 with
// Retry-After), so the server keeps file descriptors for the clients it
// serves and never stops accepting for lack of them.
type connLimiter struct {
	perIP, total int // <= 0: no cap

	mu    sync.Mutex
	byIP  map[string]int
	count int
	onCut func(reason string)
}

func newConnLimiter(perIP, total int, onCut func(string)) *connLimiter {
	return &connLimiter{perIP: perIP, total: total, byIP: map[string]int{}, onCut: onCut}
}

// take counts a connection from ip ("": not per IP); "" if it may stay,
// else why not.
func (l *connLimiter) take(ip string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total > 0 && l.count >= l.total:
		return "total"
	case ip != "" && l.perIP > 0 && l.byIP[ip] >= l.perIP:
		return "per_ip"
	}
	l.count++
	l.byIP[ip]++
	return ""
}

func (l *connLimiter) give(ip string) {
	l.mu.Lock()
	l.count--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
	l.mu.Unlock()
}

// open reports the connections counted now.
func (l *connLimiter) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// capListener applies a connLimiter to a listener; refusal, if set,
// gives what is written to a connection refused for a reason ("total",
// "per_ip") before it is closed.
type capListener struct {
	net.Listener
	lim     *connLimiter
	perIP   bool
	refusal func(why string) []byte
}

// ReasonTooManyConnections is the ErrorInfo reason of a connection
// refused at accept for a connection cap.
const ReasonTooManyConnections = "TOO_MANY_CONNECTIONS"

// httpRefusals are the HTTP listener's answers to a connection above a
// cap: 503 with Retry-After and a JSON google.rpc.Status body with
// ErrorInfo TOO_MANY_CONNECTIONS and RetryInfo, naming the flag, as every
// limit answers (issue 22), and an X-Request-Id of its own, as every
// answer. Built once; accept adds the id.
func httpRefusals(perIP, total int) func(string) []byte {
	type refusal struct{ head, body []byte }
	build := func(msg string) refusal {
		st := status.New(codes.Unavailable, msg)
		if d, err := st.WithDetails(
			&errdetails.ErrorInfo{Reason: ReasonTooManyConnections, Domain: errorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}); err == nil {
			st = d
		}
		body, _ := protojson.Marshal(st.Proto())
		head := fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Request-Id: ", len(body))
		return refusal{head, body}
	}
	byIP := build(fmt.Sprintf("too many connections from this address (limit %d, --max-conns-per-ip); close idle ones or retry", perIP))
	all := build(fmt.Sprintf("too many connections to the gateway in total (limit %d, --max-conns); retry", total))
	return func(why string) []byte {
		r := all
		if why == "per_ip" {
			r = byIP
		}
		out := append(append([]byte(nil), r.head...), newRequestID()...)
		out = append(out, "\r\n\r\n"...)
		return append(out, r.body...)
	}
}

func (l capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := ""
		if l.perIP {
			ip = remoteIP(c.RemoteAddr())
		}
		if why := l.lim.take(ip); why != "" {
			if l.refusal != nil {
				_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				_, _ = c.Write(l.refusal(why))
			}
			_ = c.Close()
			if l.lim.onCut != nil {
				l.lim.onCut(why)
			}
			continue
		}
		return &cappedConn{Conn: c, release: sync.OnceFunc(func() { l.lim.give(ip) })}, nil
	}
}

type cappedConn struct {
	net.Conn
	release func()
}

func (c *cappedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// capped wraps lis with the server's connection caps (per IP as well if
// perIP).
func (s *Server) capped(lis net.Listener, perIP bool, refusal func(string) []byte) net.Listener {
	if s.conns.perIP <= 0 && s.conns.total <= 0 {
		return lis
	}
	return capListener{Listener: lis, lim: s.conns, perIP: perIP, refusal: refusal}
}

func remoteIP(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// defaultMaxConns is the total connection cap when none is configured:
// the file descriptor limit less connReserveFDs for the store, spool and
// result files, the QUIC socket and the REST proxy's own connections.
func defaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024 - connReserveFDs
	}
	n := int(min(rl.Cur, 1<<20)) - connReserveFDs
	return max(n, minMaxConns)
}

// --- authentication before the body ---

type tenantKey struct{}

// tenantFrom returns the tenant admit authenticated for this request.
func tenantFrom(ctx context.Context) (bridge.Tenant, bool) {
	t, ok := ctx.Value(tenantKey{}).(bridge.Tenant)
	return t, ok
}

// admit authenticates an API request from its head before anything reads
// its body: a missing or unknown token answers 401 at once and the
// connection is closed rather than drained, so an unauthenticated client
// cannot make the server read (or wait for) its body. The gRPC
// interceptors authenticate the proxied call again (same token, same
// answer); the tenant is kept in the request context for the HTTP-level
// per-tenant limits.
func (s *Server) admit(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := metadata.NewIncomingContext(r.Context(), metadata.Pairs("authorization", r.Header.Get("Authorization")))
		tenant, err := s.cfg.Authenticator.Authenticate(ctx, bearerToken(ctx))
		if err != nil {
			s.metrics.rejected.WithLabelValues("unauthenticated").Inc()
			if st, ok := status.FromError(err); !ok || (st.Code() != codes.Unauthenticated && st.Code() != codes.PermissionDenied) {
				err = status.Errorf(codes.Unauthenticated, "authentication failed: %v", err)
			}
			errorHeaders(w.Header(), err)
			if r.Body != nil && r.Body != http.NoBody {
				w.Header().Set("Connection", "close") // do not read the body
			}
			code := http.StatusUnauthorized
			if status.Code(err) == codes.PermissionDenied {
				code = http.StatusForbidden
			}
			s.writeStatus(w, r, code, err)
			return
		}
		s.attributeH2(r.Context(), tenant)
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// isAPIPath reports whether path is an authenticated API route (not
// /healthz, /metrics, /openapi.json, /docs/).
// The WebSocket route authenticates itself before the upgrade, with its
// own error format, and has no body.
func isAPIPath(path string) bool {
	return strings.HasPrefix(path, "/v1/") && path != "/v1/events/ws"
}

// admitAPI applies admit to API routes only.
func (s *Server) admitAPI(h http.Handler) http.Handler {
	admitted := s.admit(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isAPIPath(r.URL.Path) {
			admitted.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// --- body deadlines ---

// deadlineBody is a JSON request body that must arrive whole within the
// deadline set on the connection when the handler started (the body's
// total deadline, Config.JSONBodyTimeout); at EOF the deadline is cleared
// so that it cannot fire while the handler works (net/http's background
// read would take it for a dead client).
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// bodyTimedOut reports whether err is a body read cut by a deadline.
func bodyTimedOut(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// rateReader cuts an upload body that arrives slower than minRate bytes/s
// on average after grace, or that sends nothing for idle: before each Read
// it sets the connection's read deadline to the earlier of now+idle and
// the time by which the bytes read so far plus one more piece are due.
type rateReader struct {
	r       io.Reader
	rc      *http.ResponseController
	idle    time.Duration
	grace   time.Duration
	minRate int64 // bytes/s; <= 0: idle only
	start   time.Time
	n       int64
	slow    bool // the last deadline was the rate's, not idle's

	// mu orders stop with the deadline a Read sets: once stop returned, no
	// Read sets a later deadline, so a Read in progress returns at once
	// and every later one fails with errBodyStopped.
	mu      sync.Mutex
	stopped bool
}

// errBodyStopped is what a rateReader's Read returns after stop.
var errBodyStopped = errors.New("gateway: the upload body's read was stopped")

// stop makes a Read in progress return now and every later Read fail
// (shutdown cutting uploads; the handler of a local upload returning).
func (rr *rateReader) stop() {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.stopped = true
	_ = rr.rc.SetReadDeadline(time.Now())
}

// lingerAfterStop lets net/http's drain of the unread body (it runs
// after the answer is written, on a connection that closes) read for up
// to drainLinger what the client had already sent: closed with that data
// unread, the socket would send a reset, which can destroy the answer
// still in flight to the client. net/http lingers the same way for the
// bodies it gives up on (closeWriteAndWait). Only after stop: no Read of
// rr sets a deadline again.
func (rr *rateReader) lingerAfterStop() {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.stopped {
		_ = rr.rc.SetReadDeadline(time.Now().Add(drainLinger))
	}
}

// drainLinger bounds lingerAfterStop (net/http's rstAvoidanceDelay).
const drainLinger = 500 * time.Millisecond

func (rr *rateReader) Read(p []byte) (int, error) {
	if err := rr.setDeadline(); err != nil {
		return 0, err
	}
	n, err := rr.r.Read(p)
	rr.n += int64(n)
	return n, err
}

// setDeadline sets the read deadline of the next Read, unless stopped.
func (rr *rateReader) setDeadline() error {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.stopped {
		return errBodyStopped
	}
	now := time.Now()
	if rr.start.IsZero() {
		rr.start = now
	}
	dl := now.Add(rr.idle)
	rr.slow = false
	if rr.minRate > 0 {
		// One byte more than already read must be there by then:
		// start + grace + (n+1)/minRate.
		due := rr.start.Add(rr.grace + time.Duration(float64(rr.n+1)/float64(rr.minRate)*float64(time.Second)))
		if due.Before(dl) {
			dl, rr.slow = due, true
		}
	}
	_ = rr.rc.SetReadDeadline(dl)
	return nil
}

// rateGrace is how long an upload runs before the minimum rate applies:
// bodyRateGrace, or the idle timeout if that is shorter.
func (s *Server) rateGrace() time.Duration {
	return min(bodyRateGrace, s.cfg.UploadIdleTimeout)
}

// uploadTooSlow is the error of an upload body below the minimum rate.
func uploadTooSlow(rate int64, grace time.Duration) error {
	return statusError(codes.DeadlineExceeded, ReasonUploadStalled, fmt.Sprintf(
		"the upload body arrived slower than %d bytes/s after the first %s (--min-body-rate); resend the upload on a faster link", rate, grace))
}

// jsonBodyTooSlow is the error of a JSON body not complete within its deadline.
func jsonBodyTooSlow(d time.Duration) error {
	return statusError(codes.DeadlineExceeded, ReasonUploadStalled, fmt.Sprintf(
		"the request body did not arrive in time: something every %s and on average at least --min-body-rate after the first %s (--json-body-timeout); the connection is closed", d, d))
}
