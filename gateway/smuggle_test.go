package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawPipeline writes reqs back to back on one TCP connection (pipelining)
// and reads the responses until the server closes it.
func rawPipeline(t *testing.T, addr string, reqs ...string) (codes []int, bodies []string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
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
	okChunked := "POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(doc)
	okLength := fmt.Sprintf("POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(doc), doc)
	smuggle := "POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(doc)
	after := "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

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
	alone := "POST /v1/documents HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n" + chunked(doc)
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
