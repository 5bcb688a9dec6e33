package gateway

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Request smuggling guard (RFC 9112 section 6.3, 11.2). net/http accepts a
// request with both Content-Length and Transfer-Encoding: chunked, uses the
// chunked framing and deletes Content-Length before any handler runs, so a
// front proxy that frames by Content-Length would disagree with us about
// where the request ends. guardConn reads the plaintext HTTP/1 byte stream
// ahead of net/http: it follows the framing of every request on the
// connection (keep-alive and pipelining included: heads, Content-Length
// bodies, chunked bodies with trailers), holds each request head back
// until it is complete, and replaces a head that carries both headers by
// a synthetic request for smuggledPath with Connection: close, which the
// handler answers 400 (writeSmuggled); nothing after it is read. Whatever
// it cannot follow (a head above the size limit, a bad chunk size,
// framing net/http refuses itself, a protocol upgrade, the HTTP/2
// preface) ends the inspection for that connection and passes the bytes
// through unchanged: net/http then rejects or serves them as before.
//
// TLS listeners are not wrapped (the guard would see ciphertext):
// docs/security.md says so.

// smuggledPath is the path of the synthetic request; it is answered 400
// only on a connection whose guard rejected a request.
const smuggledPath = "/.pipestream/rejected-request"

var smuggledRequest = []byte("GET " + smuggledPath + " HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")

type guardListener struct {
	net.Listener
	maxHead int
}

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, maxHead: l.maxHead}, nil
}

const (
	gsHead      = iota // reading a request head (held back)
	gsBody             // remain bytes of a Content-Length body
	gsChunkSize        // a chunk-size line
	gsChunkData        // remain bytes of chunk data
	gsChunkEnd         // the CRLF after chunk data
	gsTrailer          // trailer lines up to the empty line
	gsOff              // not inspecting: pass through
	gsRejected         // the synthetic request is out; then EOF
)

// guardConn is a net.Conn whose Read follows HTTP/1 request framing (see
// above). net/http reads a connection from one goroutine at a time, so
// Read needs no lock; rejected is read by the handler.
type guardConn struct {
	net.Conn
	maxHead  int
	state    int
	remain   int64
	head     []byte // the held-back head, or the current chunk/trailer line
	out      []byte // bytes ready for net/http
	buf      []byte
	err      error // sticky error of the underlying Read (not timeouts)
	rejected atomic.Bool
}

func (c *guardConn) Read(p []byte) (int, error) {
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			c.out = c.out[n:]
			return n, nil
		}
		if c.state == gsRejected {
			// Nothing after the rejected request is served: discard
			// what arrives, but block like a live connection (net/http's
			// background read takes an error for a closed connection
			// and would cancel the requests before the rejected one).
			if c.buf == nil {
				c.buf = make([]byte, 16<<10)
			}
			if _, err := c.Conn.Read(c.buf); err != nil {
				return 0, err
			}
			continue
		}
		if c.err != nil {
			return 0, c.err
		}
		if c.state == gsOff && len(c.head) == 0 {
			return c.Conn.Read(p)
		}
		if c.buf == nil {
			c.buf = make([]byte, 16<<10)
		}
		n, err := c.Conn.Read(c.buf)
		c.out = c.out[:0]
		c.feed(c.buf[:n])
		if err != nil {
			var ne net.Error
			if !(errors.As(err, &ne) && ne.Timeout()) {
				// EOF or a broken connection: what is held back goes
				// out (net/http reports the partial request) and the
				// error after it.
				c.out = append(c.out, c.head...)
				c.head = nil
				c.err = err
			}
			if len(c.out) == 0 {
				return 0, err // a timeout (deadline or net/http's read abort) is not sticky
			}
		}
	}
}

// feed runs b through the framing state machine, appending what may be
// released to c.out.
func (c *guardConn) feed(b []byte) {
	for len(b) > 0 {
		switch c.state {
		case gsOff:
			c.out = append(c.out, c.head...)
			c.head = nil
			c.out = append(c.out, b...)
			return
		case gsRejected:
			return
		case gsBody, gsChunkData:
			n := int(min(int64(len(b)), c.remain))
			c.out = append(c.out, b[:n]...)
			b = b[n:]
			if c.remain -= int64(n); c.remain == 0 {
				if c.state == gsBody {
					c.state = gsHead
				} else {
					c.state = gsChunkEnd
				}
			}
		case gsChunkSize, gsChunkEnd, gsTrailer:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				c.out = append(c.out, b...)
				c.head = append(c.head, b...)
				if len(c.head) > 4096 {
					c.state, c.head = gsOff, nil
				}
				return
			}
			c.out = append(c.out, b[:i+1]...)
			line := strings.TrimRight(string(append(c.head, b[:i]...)), "\r")
			c.head = c.head[:0]
			b = b[i+1:]
			c.line(line)
		case gsHead:
			c.head = append(c.head, b...)
			b = nil
			end := headEnd(c.head)
			if end < 0 {
				if len(c.head) > c.maxHead {
					c.state = gsOff // net/http answers 431
				}
				continue
			}
			rest := c.head[end:]
			head := c.head[:end]
			c.head = nil
			if c.checkHead(head) {
				c.out = append(c.out, head...)
				b = rest
			} else {
				c.out = append(c.out, smuggledRequest...)
				c.state = gsRejected
				c.rejected.Store(true)
				return
			}
		}
	}
}

// line handles one chunk-size, chunk-end or trailer line.
func (c *guardConn) line(l string) {
	switch c.state {
	case gsChunkSize:
		size, _, _ := strings.Cut(l, ";")
		n, err := strconv.ParseUint(strings.TrimSpace(size), 16, 62)
		switch {
		case err != nil:
			c.state = gsOff // net/http refuses it
		case n == 0:
			c.state = gsTrailer
		default:
			c.state, c.remain = gsChunkData, int64(n)
		}
	case gsChunkEnd:
		if l != "" {
			c.state = gsOff
			return
		}
		c.state = gsChunkSize
	case gsTrailer:
		if l == "" {
			c.state = gsHead
		}
	}
}

// headEnd returns the length of the head in b (up to and including the
// empty line), or -1 if it is not complete. Empty lines before the
// request line are part of the head.
func headEnd(b []byte) int {
	start := 0
	for start < len(b) && (b[start] == '\r' || b[start] == '\n') {
		start++
	}
	for i := start; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// checkHead sets the state for the body of the request whose head is h
// and reports false if the head carries both Content-Length and
// Transfer-Encoding.
func (c *guardConn) checkHead(h []byte) bool {
	lines := strings.Split(strings.TrimLeft(string(h), "\r\n"), "\n")
	reqLine := strings.TrimRight(lines[0], "\r")
	if strings.HasPrefix(reqLine, "PRI ") || strings.HasSuffix(reqLine, "HTTP/1.0") {
		c.state = gsOff // HTTP/2 preface; HTTP/1.0 ignores Transfer-Encoding
		return true
	}
	var cls, tes []string
	upgrade := false
	for _, l := range lines[1:] {
		name, v, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "content-length":
			cls = append(cls, v)
		case "transfer-encoding":
			tes = append(tes, v)
		case "upgrade":
			upgrade = true
		}
	}
	switch {
	case len(cls) > 0 && len(tes) > 0:
		return false
	case upgrade || strings.HasPrefix(reqLine, "CONNECT "):
		c.state = gsOff // the connection may stop being HTTP/1
	case len(tes) > 0:
		if len(tes) != 1 || !strings.EqualFold(tes[0], "chunked") {
			c.state = gsOff // net/http refuses it (501/400)
			return true
		}
		c.state = gsChunkSize
	case len(cls) > 0:
		n, err := strconv.ParseInt(cls[0], 10, 64)
		for _, v := range cls[1:] {
			if v != cls[0] {
				err = errors.New("differing Content-Length")
			}
		}
		switch {
		case err != nil || n < 0:
			c.state = gsOff // net/http refuses it
		case n == 0:
			c.state = gsHead
		default:
			c.state, c.remain = gsBody, n
		}
	default:
		c.state = gsHead
	}
	return true
}

type guardKey struct{}

// guardContext puts the connection's guard into the request contexts
// (http.Server.ConnContext).
func guardContext(ctx context.Context, c net.Conn) context.Context {
	if g, ok := c.(*guardConn); ok {
		return context.WithValue(ctx, guardKey{}, g)
	}
	return ctx
}

// rejectSmuggled answers the synthetic request of a guard that rejected a
// request with 400; everything else goes on to h.
func (s *Server) rejectSmuggled(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == smuggledPath {
			if g, ok := r.Context().Value(guardKey{}).(*guardConn); ok && g.rejected.Load() {
				w.Header().Set("Connection", "close")
				s.writeStatus(w, r, http.StatusBadRequest, status.Error(codes.InvalidArgument,
					"the request has both Content-Length and Transfer-Encoding (RFC 9112 section 6.3: a request smuggling pattern): send one of them; the connection is closed"))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
