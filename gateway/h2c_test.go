package gateway_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestH2CPlaintextREST: the plaintext REST port speaks HTTP/2 with prior
// knowledge (h2c) next to HTTP/1.1; an Upgrade: h2c request is answered in
// HTTP/1.1; the smuggling guard still refuses ambiguous HTTP/1 framing.
func TestH2CPlaintextREST(t *testing.T) {
	h := start(t, nil)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}

	resp, err := c.Post(h.base+"/v1/documents", "application/json", strings.NewReader(`{"content":"aGk=","contentType":"text/plain"}`))
	if err != nil {
		t.Fatalf("h2c POST: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"documents/`) {
		t.Fatalf("h2c POST: %s %d %s", resp.Proto, resp.StatusCode, body)
	}
	// Strict input and the raw upload route over h2c too.
	resp, err = c.Post(h.base+"/v1/documents", "application/json", strings.NewReader(`{"contentTyp":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "contentTyp") {
		t.Errorf("h2c bad body: %s %d %s", resp.Proto, resp.StatusCode, body)
	}
	resp, err = c.Post(h.base+"/v1/documents:upload?split.strategy=lines", "text/plain", strings.NewReader("a\nb\n"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Errorf("h2c upload: %s %d %s", resp.Proto, resp.StatusCode, body)
	}

	// Upgrade: h2c is not taken up: an HTTP/1.1 answer.
	conn, err := net.DialTimeout("tcp", h.srv.HTTPAddr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /v1/events:window HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
	r, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.ProtoMajor != 1 || r.StatusCode != http.StatusOK {
		t.Errorf("Upgrade: h2c answered %s %d, want HTTP/1.1 200", r.Proto, r.StatusCode)
	}

	// HTTP/1 smuggling is still refused on the same port.
	conn2, err := net.DialTimeout("tcp", h.srv.HTTPAddr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	_ = conn2.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn2, "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	r, err = http.ReadResponse(bufio.NewReader(conn2), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("CL+TE on the h2c-enabled port: %d, want 400", r.StatusCode)
	}
}
