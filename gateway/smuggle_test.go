package gateway_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/gateway"
)

// rawPipeline writes reqs back to back on one TCP connection (pipelining)
// and reads the responses until the server closes it.
func rawPipeline(t *testing.T, addr string, reqs ...string) (codes []int, bodies []string) {
	t.Helper()
	return pipelineOn(t, func() (net.Conn, error) { return net.Dial("tcp", addr) }, reqs...)
}

// pipelineOn is rawPipeline over a connection from dial (TCP or TLS).
func pipelineOn(t *testing.T, dial func() (net.Conn, error), reqs ...string) (codes []int, bodies []string) {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, strings.Join(reqs, "")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return codes, bodies // closed
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		bodies = append(bodies, string(b))
	}
}

// TestSmugglingGuard: a request with both Content-Length and
// Transfer-Encoding (net/http would take the chunked framing and drop
// Content-Length unseen) answers 400 and closes the connection, also as
// the third request of a keep-alive pipeline whose earlier requests (one
// chunked, one with Content-Length, bodies that contain header-like text)
// are served normally; requests after it are not read.
func TestSmugglingGuard(t *testing.T) {
	h := start(t, nil)
	addr := strings.TrimPrefix(h.base, "http://")
	doc := `{"content":"aGVsbG8=","displayName":"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\nGET / HTTP/1.1"}`
	chunked := func(body string) string {
		return fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", 10, body[:10], len(body)-10, body[10:])
	}
	okChunked := "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(doc)
	okLength := fmt.Sprintf("POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(doc), doc)
	smuggle := "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 4\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(doc)
	after := "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

	before := h.fake.submitted()
	codes, bodies := rawPipeline(t, addr, okChunked, okLength, smuggle, after)
	if len(codes) != 3 || codes[0] != 200 || codes[1] != 200 || codes[2] != 400 {
		t.Fatalf("pipeline answered %v, want [200 200 400] and the connection closed: %q", codes, bodies)
	}
	if !strings.Contains(bodies[2], "Content-Length and Transfer-Encoding") {
		t.Errorf("400 body %q does not say what is wrong", bodies[2])
	}
	if n := h.fake.submitted() - before; n != 2 {
		t.Errorf("%d documents submitted, want 2 (the smuggled request must not reach the API)", n)
	}

	// Alone on a connection, and with the headers in the other order.
	alone := "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n" + chunked(doc)
	if codes, bodies := rawPipeline(t, addr, alone); len(codes) != 1 || codes[0] != 400 {
		t.Fatalf("TE before CL: %v %q, want [400]", codes, bodies)
	}
	// The stand-in path is nothing on a connection that sent no such request.
	if code, _, _ := h.do("GET", "/.pipestream/rejected-request", nil); code != http.StatusNotFound {
		t.Errorf("GET of the stand-in path: HTTP %d, want 404", code)
	}
}

// submitted counts the fake bridge's documents.
func (f *fakeBridge) submitted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.docs)
}

// TestSmugglingGuardEveryState: ambiguous framing answers 400 and closes
// the connection in every connection state, on plaintext and on TLS:
// alone, after a request with an Upgrade header that was not upgraded,
// after an HTTP/1.0 keep-alive request, after a chunked request (the two
// bypasses of issue 11 and their relatives). Each kind of ambiguity is
// refused: Content-Length with Transfer-Encoding (either order), two
// Content-Length (equal or not), Transfer-Encoding other than chunked or
// repeated, Transfer-Encoding on HTTP/1.0, obs-fold. No smuggled request
// reaches the API.
func TestSmugglingGuardEveryState(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	tc, err := gateway.ServerTLSFiles(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err := gateway.ClientTLS(caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	plain := start(t, nil)
	secure := start(t, func(c *gateway.Config) { c.GRPCTLS, c.HTTPTLS, c.InternalDialTLS = tc.GRPC, tc.HTTP, tc.InternalDial })

	doc := `{"content":"aGVsbG8="}`
	chunkedBody := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(doc), doc)
	post := "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	bad := map[string]string{
		"CL+TE":          post + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedBody,
		"TE+CL":          post + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunkedBody,
		"two equal CL":   post + fmt.Sprintf("Content-Length: %d\r\nContent-Length: %d\r\n\r\n", len(doc), len(doc)) + doc,
		"TE gzip":        post + "Transfer-Encoding: gzip\r\n\r\n" + chunkedBody,
		"two TE":         post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedBody,
		"TE on HTTP/1.0": "POST /v1/documents HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedBody,
		"obs-fold CL":    post + fmt.Sprintf("X-Note: a\r\n Content-Length: 4\r\nContent-Length: %d\r\n\r\n", len(doc)) + doc,
	}
	before := map[string]string{
		"alone":                "",
		"after Upgrade":        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
		"after Upgrade ws":     "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
		"after 1.0 keep-alive": "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n",
		"after chunked":        post + "Transfer-Encoding: chunked\r\n\r\n" + chunkedBody,
	}
	for _, tr := range []struct {
		name string
		h    *harness
		dial func() (net.Conn, error)
	}{
		{"plaintext", plain, func() (net.Conn, error) { return net.Dial("tcp", plain.srv.HTTPAddr()) }},
		{"TLS", secure, func() (net.Conn, error) { return tls.Dial("tcp", secure.srv.HTTPAddr(), clientTLS) }},
	} {
		for bname, first := range before {
			for kind, req := range bad {
				n0 := tr.h.fake.submitted()
				reqs := []string{req, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"}
				if first != "" {
					reqs = append([]string{first}, reqs...)
				}
				codes, bodies := pipelineOn(t, tr.dial, reqs...)
				want := 1
				if first != "" {
					want = 2
				}
				// net/http's parser itself refuses a Transfer-Encoding
				// other than one "chunked" (501, connection closed); the
				// guard refuses the rest (400).
				wantCode := 400
				if kind == "TE gzip" || kind == "two TE" {
					wantCode = 501
				}
				if len(codes) != want || codes[want-1] != wantCode || (want == 2 && codes[0] != 200) {
					t.Errorf("%s, %s, %s: answered %v %q; want the ambiguous request %d and the connection closed", tr.name, bname, kind, codes, bodies, wantCode)
					continue
				}
				if wantCode == 400 && !strings.Contains(bodies[want-1], "ambiguous request framing") {
					t.Errorf("%s, %s, %s: 400 body %q does not name the cause", tr.name, bname, kind, bodies[want-1])
				}
				wantSubmitted := 0
				if bname == "after chunked" {
					wantSubmitted = 1
				}
				if n := tr.h.fake.submitted() - n0; n != wantSubmitted {
					t.Errorf("%s, %s, %s: %d documents submitted, want %d", tr.name, bname, kind, n, wantSubmitted)
				}
			}
		}
	}
}

// TestGuardPassesWellFormedTraffic: keep-alive requests of every framing
// (Content-Length, chunked with trailers, HTTP/1.0 keep-alive, bodies
// holding header-like text) are served one after the other on one
// connection, plaintext and TLS.
func TestGuardPassesWellFormedTraffic(t *testing.T) {
	h := start(t, nil)
	doc := `{"content":"aGVsbG8=","displayName":"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"}`
	post := "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	reqs := []string{
		post + fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(doc), doc),
		post + "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\nX-T: 1\r\n\r\n", len(doc), doc),
		"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
	}
	codes, bodies := rawPipeline(t, strings.TrimPrefix(h.base, "http://"), reqs...)
	if len(codes) != len(reqs) {
		t.Fatalf("answered %v %q, want %d answers", codes, bodies, len(reqs))
	}
	for i, c := range codes {
		if c != 200 {
			t.Errorf("request %d: HTTP %d %s", i, c, bodies[i])
		}
	}
}

// TestGuardTLSSilentClientCut: on the TLS listener (guarded above TLS) a
// client that connects and never starts the handshake is cut at
// ReadHeaderTimeout, like a plaintext slowloris.
func TestGuardTLSSilentClientCut(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, dir)
	tc, err := gateway.ServerTLSFiles(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) {
		c.GRPCTLS, c.HTTPTLS, c.InternalDialTLS = tc.GRPC, tc.HTTP, tc.InternalDial
		c.ReadHeaderTimeout = 500 * time.Millisecond
	})
	c, err := net.Dial("tcp", h.srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(10 * time.Second))
	_, err = io.ReadAll(c)
	if took := time.Since(start); err != nil || took > 3*time.Second {
		t.Errorf("silent TLS client: closed after %v (%v), want about 500ms", took, err)
	}
}

// TestMalformedRequestsAnswerInShape: requests net/http's parser refuses
// (a malformed request line or header line, a Transfer-Encoding other
// than one chunked, a head over the size limit) are answered with the
// status net/http gives them, but as a google.rpc.Status with an
// ErrorInfo and an X-Request-Id, like every answer, and the connection is
// closed.
func TestMalformedRequestsAnswerInShape(t *testing.T) {
	h := start(t, nil)
	for _, tc := range []struct {
		name, req string
		code      int
		says      string
	}{
		{"request line", "GARBAGE\r\n\r\n", 400, "malformed HTTP/1.1 request"},
		{"header line", "GET /healthz HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400, "malformed HTTP/1.1 request"},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", 400, "missing required Host header"},
		{"two Host", "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "too many Host headers"},
		{"bad Host", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "malformed Host header"},
		{"bad header value", "GET /healthz HTTP/1.1\r\nHost: a\r\nX-A: b\x01c\r\n\r\n", 400, "header"},
		{"Expect", "GET /healthz HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n", 417, "Expect"},
		{"HTTP/0.9", "GET /healthz HTTP/0.9\r\nHost: a\r\n\r\n", 505, "version"},
		{"HTTP/2.0 GET", "GET /healthz HTTP/2.0\r\nHost: a\r\n\r\n", 505, "version"},
		{"TE gzip", "POST /v1/documents HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "unsupported transfer encoding"},
		{"huge head", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: " + strings.Repeat("h", 2<<20) + "\r\n\r\n", 431, "request head is over"},
	} {
		c, err := net.Dial("tcp", h.srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			_, _ = io.WriteString(c, tc.req) // the server stops reading a huge head early
		}()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("%s: no answer: %v", tc.name, err)
			c.Close()
			<-wrote
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		<-wrote
		if resp.StatusCode != tc.code || !resp.Close || len(resp.Header.Get("X-Request-Id")) != 32 || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: HTTP %d close %v X-Request-Id %q %q, want %d application/json with a request id, connection closed", tc.name, resp.StatusCode, resp.Close, resp.Header.Get("X-Request-Id"), resp.Header.Get("Content-Type"), tc.code)
		}
		if st := decodeStatus(t, b); st.reason() == "" || !strings.Contains(st.Message, tc.says) {
			t.Errorf("%s: body %s, want a Status with a reason saying %q", tc.name, b, tc.says)
		}
	}
	// Heads net/http serves pass: the guard is no stricter than it.
	for _, head := range []string{
		"GET /healthz HTTP/1.2\r\nHost: a\r\n\r\n",
		"GET /healthz HTTP/1.0\r\n\r\n",
		"GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: 127.0.0.1:80\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Tab: a\tb\r\n\r\n",
	} {
		resp, body, _ := rawRequest(t, h.srv.HTTPAddr(), nil, head, "", 10*time.Second)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%q: HTTP %d %s, want 200 (net/http serves it)", head, resp.StatusCode, body)
		}
	}
}

// TestHeadSizeLimitAnswersInShape: the guard decides on a head's size
// before net/http does. A head of up to 1 MiB + 4 KiB (net/http's
// MaxHeaderBytes and its read slack) is served; any longer one is answered
// 431 in the one shape, with an X-Request-Id, also in the range just past
// that limit that net/http refused by itself in plain text before the
// guard's limit (up to 1 MiB + 12 KiB), and when the limit cuts the head
// inside its last line or its final CRLF.
func TestHeadSizeLimitAnswersInShape(t *testing.T) {
	h := start(t, nil)
	const limit = http.DefaultMaxHeaderBytes + 4096
	for _, n := range []int{limit - 64, limit, limit + 1, limit + 2, limit + 3, limit + 4, limit + 4096, limit + 8191, limit + 12<<10} {
		const pre, post = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ", "\r\n\r\n"
		head := pre + strings.Repeat("p", n-len(pre)-len(post)) + post
		c, err := net.Dial("tcp", h.srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			_, _ = io.WriteString(c, head) // the server stops reading a head over the limit
		}()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("head of %d bytes: no answer: %v", n, err)
			c.Close()
			<-wrote
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		<-wrote
		if n <= limit {
			if resp.StatusCode != http.StatusOK {
				t.Errorf("head of %d bytes (limit %d): HTTP %d %s, want 200", n, limit, resp.StatusCode, b)
			}
			continue
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || len(resp.Header.Get("X-Request-Id")) != 32 || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("head of %d bytes (limit %d): HTTP %d X-Request-Id %q %q %.80q, want 431 application/json with a request id", n, limit, resp.StatusCode, resp.Header.Get("X-Request-Id"), resp.Header.Get("Content-Type"), b)
			continue
		}
		if st := decodeStatus(t, b); st.reason() == "" || !strings.Contains(st.Message, "request head is over") {
			t.Errorf("head of %d bytes: body %s, want a Status with a reason", n, b)
		}
	}
}
