package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Request smuggling guard (RFC 9112 sections 5.2, 6.1, 6.3, 11.2).
// net/http accepts a request with both Content-Length and
// Transfer-Encoding: chunked (it frames by chunked and deletes
// Content-Length before any handler runs), a repeated identical
// Content-Length (it keeps one) and obs-fold header lines (it unfolds
// them), so a front proxy that frames such a request differently would
// disagree with us about where it ends.
//
// guardConn follows the request framing of every HTTP/1 connection with
// net/http's own parser: a follower goroutine runs http.ReadRequest and
// reads each body to its end over the connection's bytes, exactly as the
// server will, and releases bytes to the server only once the parser has
// consumed them: a request head is held back until it is complete and
// checked. A head with ambiguous framing (ambiguousFraming) is replaced by
// a synthetic request for smuggledPath with Connection: close, which the
// handler answers 400 (rejectSmuggled); nothing after it is served. There
// is no second HTTP parser that could disagree with the server: the only
// text the guard reads itself is the header lines of a head the parser has
// just delimited.
//
// The guard stays on for the whole connection: after an Upgrade request
// that was not upgraded, after HTTP/1.0 keep-alive, after pipelining. It
// passes the bytes through unchanged only when the connection stops being
// HTTP/1 requests: the handler hijacked it (WebSocket; http.Server's
// ConnState hook), or the parser refused the bytes (net/http refuses them
// the same way and closes the connection), or the request closes the
// connection (net/http reads no further request). TLS listeners are
// guarded too: the guard sits above the TLS layer (serveHTTP), which is
// why that listener speaks HTTP/1.1 only (ALPN http/1.1).

// smuggledPath is the path of the synthetic request; it is answered 400
// only on a connection whose guard rejected a request.
const smuggledPath = "/.pipestream/rejected-request"

var smuggledRequest = []byte("GET " + smuggledPath + " HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")

const (
	guardBuf     = 4 << 10  // the follower's bufio (net/http's own is 4 KiB too)
	guardBodyBuf = 32 << 10 // body reads, from guardBodyBufs while a body is read
	guardMaxOut  = 64 << 10 // released bytes not yet read by the server (backpressure)
)

// guardBodyBufs holds the follower's body buffers: a connection only needs
// one while it reads a body, so an idle or waiting connection costs its
// bufio and goroutine only.
var guardBodyBufs = sync.Pool{New: func() any { b := make([]byte, guardBodyBuf); return &b }}

var errHeadTooLarge = errors.New("request head above the limit")

type guardListener struct {
	net.Listener
	maxHead int
}

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newGuardConn(c, l.maxHead), nil
}

// guardConn is a net.Conn whose Read returns what the follower released
// (see above). Read deadlines (net/http's header timeout, its background
// read abort) apply to Read, not to the underlying connection, which only
// the follower reads.
type guardConn struct {
	net.Conn
	maxHead int
	start   sync.Once

	mu          sync.Mutex
	out         byteQueue // released, not yet read by the server
	pending     byteQueue // read from the connection, not yet released
	relPos      int64     // stream offset of pending[0]
	rerr        error     // after out drains: the connection's read error
	closed      bool
	passthrough bool // not inspecting: bytes go to out as they arrive
	direct      bool // detached: Read reads the connection (smuggle_detach.go)
	deadline    time.Time
	reason      string     // why a request was rejected
	rejectCode  int        // the HTTP status of the rejection
	rejectGRPC  codes.Code // and its gRPC code
	rejectLabel string     // and its label in the rejected-requests metric

	ready     chan struct{} // out grew, rerr set, closed, or a deadline changed
	space     chan struct{} // out shrank
	rejected  atomic.Bool
	rawReadN  int64 // bytes read from the connection (follower only)
	headLimit int64 // stream offset the follower may not read past (0: none)
	// headCut: the follower's reads stopped at headLimit (follower only).
	// The parser may then fail on the partial last line rather than with
	// errHeadTooLarge (bufio.Reader.ReadLine drops the error of a line it
	// returns in part), and the head is over the limit all the same.
	headCut bool

	detaching atomic.Bool // hijacked: the follower is to end (smuggle_detach.go)
}

func newGuardConn(c net.Conn, maxHead int) *guardConn {
	return &guardConn{Conn: c, maxHead: maxHead, ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *guardConn) Read(p []byte) (int, error) {
	c.start.Do(func() { go c.follow() })
	for {
		c.mu.Lock()
		if c.out.len() > 0 {
			n := copy(p, c.out.bytes())
			c.out.consume(n)
			c.mu.Unlock()
			wake(c.space)
			return n, nil
		}
		if c.rerr != nil || c.closed {
			err := c.rerr
			c.mu.Unlock()
			if err == nil {
				err = net.ErrClosed
			}
			return 0, err
		}
		if c.direct {
			c.out.drop()
			c.mu.Unlock()
			return c.Conn.Read(p)
		}
		dl := c.deadline
		c.mu.Unlock()
		if dl.IsZero() {
			<-c.ready
			continue
		}
		d := time.Until(dl)
		if d <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		select {
		case <-c.ready:
		case <-t.C:
		}
		t.Stop()
	}
}

func (c *guardConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	var err error
	if c.direct {
		err = c.Conn.SetReadDeadline(t)
	}
	c.mu.Unlock()
	wake(c.ready)
	return err
}

func (c *guardConn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *guardConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	wake(c.ready)
	wake(c.space)
	return c.Conn.Close()
}

// stopInspecting releases everything held back and lets later bytes
// through as they arrive (a hijacked connection, or bytes the parser
// refused).
func (c *guardConn) stopInspecting() {
	c.mu.Lock()
	if !c.passthrough && !c.rejected.Load() {
		c.passthrough = true
		c.out.write(c.pending.bytes())
		c.relPos += int64(c.pending.len())
		c.pending.drop() // nothing is held back any more
	}
	c.mu.Unlock()
	wake(c.ready)
}

// rawReader is what the follower's parser reads: the connection, with
// every byte also kept in pending until released.
type rawReader struct{ c *guardConn }

func (r rawReader) Read(p []byte) (int, error) {
	c := r.c
	if c.headLimit > 0 {
		room := c.headLimit - c.rawReadN
		if room <= 0 {
			c.headCut = true
			return 0, errHeadTooLarge
		}
		p = p[:min(int64(len(p)), room)]
	}
	n, err := c.Conn.Read(p)
	c.rawReadN += int64(n)
	c.mu.Lock()
	through := c.passthrough
	if through {
		c.out.write(p[:n])
		c.relPos += int64(n)
	} else {
		c.pending.write(p[:n])
	}
	c.mu.Unlock()
	if through && n > 0 {
		wake(c.ready)
	}
	return n, err
}

// release moves the held bytes up to stream offset pos to out, waiting
// while the server has guardMaxOut bytes unread; false if the connection
// closed meanwhile.
func (c *guardConn) release(pos int64) bool {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return false
		}
		if c.passthrough {
			c.mu.Unlock()
			return true
		}
		if c.out.len() < guardMaxOut || pos <= c.relPos {
			n := pos - c.relPos
			if n > 0 {
				c.out.write(c.pending.bytes()[:n])
				c.pending.consume(int(n))
				c.relPos = pos
			}
			c.mu.Unlock()
			wake(c.ready)
			return true
		}
		c.mu.Unlock()
		<-c.space
	}
}

// fail ends the follower on a read error of the connection: what is held
// goes out (net/http reports the partial request), then the error.
func (c *guardConn) fail(err error) {
	c.mu.Lock()
	c.out.write(c.pending.bytes())
	c.pending.drop()
	c.rerr = err
	c.mu.Unlock()
	wake(c.ready)
}

// reject replaces the held head by the synthetic request, answered
// code with reason (rejectSmuggled); nothing after it is read.
func (c *guardConn) reject(code int, grpcCode codes.Code, label, reason string) {
	c.mu.Lock()
	c.reason, c.rejectCode, c.rejectGRPC, c.rejectLabel = reason, code, grpcCode, label
	c.rejected.Store(true)
	c.out.write(smuggledRequest)
	c.pending.drop()
	c.mu.Unlock()
	wake(c.ready)
}

// follow runs net/http's parser over the connection (see above).
func (c *guardConn) follow() {
	br := bufio.NewReaderSize(rawReader{c}, guardBuf)
	pos := func() int64 { return c.rawReadN - int64(br.Buffered()) }
	for {
		start := pos()
		c.headLimit = start + int64(c.maxHead)
		req, err := http.ReadRequest(br)
		c.headLimit = 0
		if c.stopped() {
			c.passThrough()
			return
		}
		if err != nil {
			c.parserStopped(err)
			return
		}
		c.mu.Lock()
		head := string(c.pending.bytes()[:pos()-c.relPos])
		c.mu.Unlock()
		if reason := ambiguousFraming(head, req); reason != "" {
			c.reject(http.StatusBadRequest, codes.InvalidArgument, "smuggling", "ambiguous request framing: "+reason)
			return
		}
		if code, grpcCode, why := refusedHead(head, req); code != 0 {
			c.reject(code, grpcCode, "malformed_request", why)
			return
		}
		if !c.release(pos()) {
			return
		}
		if req.Method == http.MethodConnect || req.ProtoMajor != 1 {
			c.stopInspecting() // the connection stops being HTTP/1 requests
			c.passThrough()
			return
		}
		if ok, err := c.followBody(req, pos); !ok {
			if err != nil {
				c.parserStopped(err)
			}
			return
		}
		if req.Close {
			c.stopInspecting() // net/http reads no request after this one
			c.passThrough()
			return
		}
	}
}

// followBody reads req's body to its end, releasing the bytes the parser
// consumed as it goes; ok is false when the follower must stop (err: the
// parser's error, nil: the connection closed).
func (c *guardConn) followBody(req *http.Request, pos func() int64) (ok bool, err error) {
	if req.Body == nil || req.Body == http.NoBody {
		return true, nil
	}
	bp := guardBodyBufs.Get().(*[]byte)
	defer guardBodyBufs.Put(bp)
	for {
		_, err := req.Body.Read(*bp)
		if !c.release(pos()) {
			return false, nil
		}
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// stopped reports whether inspection ended meanwhile (hijack).
func (c *guardConn) stopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.passthrough || c.closed
}

// parserStopped handles an error of the parser: a read error of the
// connection ends it; anything else is a head net/http refuses as well
// (malformed, or over the size limit), answered by the gateway in the one
// error shape, with an X-Request-Id, instead of net/http's plain text,
// with the status net/http gives it: a head over the limit 431, a
// Transfer-Encoding other than one "chunked" 501, anything else 400.
func (c *guardConn) parserStopped(err error) {
	if c.detaching.Load() { // the hijack's kick, not the client's bytes
		c.passThrough()
		return
	}
	var ne net.Error
	switch msg := err.Error(); {
	case errors.Is(err, errHeadTooLarge) || c.headCut:
		c.reject(http.StatusRequestHeaderFieldsTooLarge, codes.InvalidArgument, "malformed_request", fmt.Sprintf(
			"the request head is over %d bytes: send fewer or shorter header lines", c.maxHead))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne):
		c.fail(err)
	case strings.HasPrefix(msg, "unsupported transfer encoding") || strings.HasPrefix(msg, "too many transfer encodings"):
		// net/http's unsupportedTEError (unexported), which it answers 501.
		c.reject(http.StatusNotImplemented, codes.Unimplemented, "malformed_request",
			msg+": send the body with Content-Length or with one Transfer-Encoding: chunked")
	default:
		c.reject(http.StatusBadRequest, codes.InvalidArgument, "malformed_request",
			"malformed HTTP/1.1 request ("+msg+"): send a request as RFC 9112 defines it")
	}
}

// passThrough copies the connection to out until it fails (the bytes the
// follower's bufio holds were released with pending).
func (c *guardConn) passThrough() {
	var buf []byte
	for {
		if c.detaching.Load() {
			c.finishDetach()
			return
		}
		if buf == nil {
			buf = make([]byte, guardBuf)
		}
		c.mu.Lock()
		for c.out.len() >= guardMaxOut && !c.closed && !c.detaching.Load() {
			c.mu.Unlock()
			<-c.space
			c.mu.Lock()
		}
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		n, err := c.Conn.Read(buf)
		c.mu.Lock()
		c.out.write(buf[:n])
		if err != nil && c.detaching.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
			c.mu.Unlock()
			c.finishDetach() // the kick
			return
		}
		if err != nil {
			c.rerr = err
		}
		c.mu.Unlock()
		wake(c.ready)
		if err != nil {
			return
		}
	}
}

// refusedHead returns how net/http's server refuses a head h that
// http.ReadRequest accepted as req (its conn.readRequest and serve checks:
// the protocol version, the Host header, header names and values, Expect),
// so that the guard answers it in the one error shape instead
// (parserStopped); 0 when net/http serves it. http.ReadRequest drops the
// Host field from req.Header: its values are read from h.
func refusedHead(h string, req *http.Request) (int, codes.Code, string) {
	if req.ProtoMajor != 1 { // net/http's http1ServerSupportsRequest
		if req.ProtoMajor == 2 && req.ProtoMinor == 0 && req.Method == "PRI" && req.RequestURI == "*" {
			return 0, codes.OK, "" // the HTTP/2 preface, for net/http's h2c
		}
		return http.StatusHTTPVersionNotSupported, codes.Unimplemented, fmt.Sprintf("unsupported protocol version %s: use HTTP/1.1", quoteForMessage(req.Proto))
	}
	hosts := headerValues(h, "host")
	if req.ProtoAtLeast(1, 1) && len(hosts) == 0 && req.Method != http.MethodConnect {
		return http.StatusBadRequest, codes.InvalidArgument, "missing required Host header (RFC 9112 section 3.2): send Host with the server's name"
	}
	if len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]) {
		return http.StatusBadRequest, codes.InvalidArgument, "malformed Host header: send Host as host[:port]"
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest, codes.InvalidArgument, "invalid header name: use tokens (RFC 9110 section 5.1)"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest, codes.InvalidArgument, fmt.Sprintf("invalid value of header %s: no control characters (RFC 9110 section 5.5)", k)
			}
		}
	}
	if e := req.Header["Expect"]; len(e) > 0 && e[0] != "" && !httpguts.HeaderValuesContainsToken(e[:1], "100-continue") { // net/http reads the first
		return http.StatusExpectationFailed, codes.FailedPrecondition, "unsupported Expect header: the server supports Expect: 100-continue only"
	}
	return 0, codes.OK, ""
}

// ambiguousFraming returns why the request head h (as the parser
// delimited it, req as it parsed it) has framing that another HTTP/1
// implementation could read differently, or "" if it has none:
// Content-Length with Transfer-Encoding, a repeated Content-Length or
// Transfer-Encoding, a Transfer-Encoding other than chunked or on
// HTTP/1.0, an obs-fold line.
func ambiguousFraming(h string, req *http.Request) string {
	h = strings.TrimLeft(h, "\r\n")
	_, h, _ = strings.Cut(h, "\n") // the request line
	var cls, tes []string
	for _, l := range strings.Split(h, "\n") {
		l = strings.TrimSuffix(l, "\r")
		if l == "" {
			break
		}
		if l[0] == ' ' || l[0] == '\t' {
			return "a header line starts with whitespace (obs-fold, RFC 9112 section 5.2): send each field on one line"
		}
		name, v, _ := strings.Cut(l, ":")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "content-length":
			cls = append(cls, strings.TrimSpace(v))
		case "transfer-encoding":
			tes = append(tes, strings.TrimSpace(v))
		}
	}
	switch {
	case len(cls) > 0 && len(tes) > 0:
		return "the request has both Content-Length and Transfer-Encoding (RFC 9112 section 6.3: a request smuggling pattern): send one of them"
	case len(cls) > 1:
		return "the request has more than one Content-Length (RFC 9112 section 6.3): send one"
	case len(tes) > 1:
		return "the request has more than one Transfer-Encoding field: send one, Transfer-Encoding: chunked"
	case len(tes) == 1 && !strings.EqualFold(tes[0], "chunked"):
		return "Transfer-Encoding " + quoteForMessage(tes[0]) + " is not supported: send Transfer-Encoding: chunked or a Content-Length"
	case len(tes) == 1 && !req.ProtoAtLeast(1, 1):
		return "Transfer-Encoding on an HTTP/1.0 request (RFC 9112 section 6.1: ambiguous framing): send a Content-Length"
	}
	return ""
}

// headerValues returns the values of the header field name (lower case)
// in the head h, as net/http reads them (trimmed).
func headerValues(h, name string) []string {
	h = strings.TrimLeft(h, "\r\n")
	_, h, _ = strings.Cut(h, "\n") // the request line
	var vs []string
	for _, l := range strings.Split(h, "\n") {
		l = strings.TrimSuffix(l, "\r")
		if l == "" {
			break
		}
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, name) {
			vs = append(vs, strings.Trim(v, " \t"))
		}
	}
	return vs
}

// quoteForMessage quotes a header value for an error message, cut short.
func quoteForMessage(v string) string {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return "\"" + strings.ToValidUTF8(v, "?") + "\""
}

type guardKey struct{}

// guardContext puts the connection's guard into the request contexts
// (http.Server.ConnContext).
func guardContext(ctx context.Context, c net.Conn) context.Context {
	if g, ok := c.(*guardConn); ok {
		return withH2Conn(context.WithValue(ctx, guardKey{}, g), g.Conn)
	}
	return ctx
}

// guardConnState ends the inspection of a hijacked connection
// (http.Server.ConnState): it no longer carries HTTP/1 requests.
func guardConnState(c net.Conn, st http.ConnState) {
	if g, ok := c.(*guardConn); ok && st == http.StateHijacked {
		g.stopInspecting()
		g.detach() // smuggle_detach.go
	}
}

// rejectSmuggled answers the synthetic request of a guard that rejected a
// request with 400; everything else goes on to h.
func (s *Server) rejectSmuggled(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == smuggledPath {
			if g, ok := r.Context().Value(guardKey{}).(*guardConn); ok && g.rejected.Load() {
				g.mu.Lock()
				reason, code, grpcCode, label := g.reason, g.rejectCode, g.rejectGRPC, g.rejectLabel
				g.mu.Unlock()
				s.metrics.rejected.WithLabelValues(label).Inc()
				w.Header().Set("Connection", "close")
				s.writeStatus(w, r, code, status.Error(grpcCode, reason+"; the connection is closed"))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// byteQueue is a FIFO of bytes that reuses its storage: what was read is
// dropped from the front, the buffer starts over once empty and moves its
// rest to the front before it grows. (A slice that is resliced forward
// and appended to allocates a new array every few requests: 16 KiB per
// small document on a keep-alive connection, the guard's largest cost.)
type byteQueue struct {
	b []byte
	r int // b[:r] was consumed
}

// byteQueueKeep is the most storage an emptied queue keeps for the
// connection's next request (a small document's request is ~6 KiB); a
// larger buffer (a body that arrived faster than the server read it) is
// let go, so an idle keep-alive connection holds at most this per queue.
const byteQueueKeep = 8 << 10

func (q *byteQueue) len() int      { return len(q.b) - q.r }
func (q *byteQueue) bytes() []byte { return q.b[q.r:] }

func (q *byteQueue) write(p []byte) {
	if q.r > 0 && len(q.b)+len(p) > cap(q.b) {
		n := copy(q.b, q.b[q.r:])
		q.b, q.r = q.b[:n], 0
	}
	q.b = append(q.b, p...)
}

func (q *byteQueue) consume(n int) {
	q.r += n
	if q.r == len(q.b) {
		q.release()
	}
}

// drop empties the queue and lets its storage go (a queue no longer used:
// the guard stopped inspecting, or the connection is detached or failed).
func (q *byteQueue) drop() { q.b, q.r = nil, 0 }

// release empties the queue, keeping up to byteQueueKeep of storage.
func (q *byteQueue) release() {
	if cap(q.b) > byteQueueKeep {
		q.b = nil
	}
	q.b, q.r = q.b[:0], 0
}
