package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/gateway"
)

// blockingResult is a result of size bytes that hands out the first
// piece, then blocks until released: a download in progress.
type blockingResult struct {
	size    int
	sent    int
	release <-chan struct{}
}

func (b *blockingResult) Read(p []byte) (int, error) {
	if b.sent >= b.size {
		return 0, io.EOF
	}
	if b.sent > 0 {
		<-b.release
	}
	n := min(len(p), b.size-b.sent)
	for i := range p[:n] {
		p[i] = 'r'
	}
	b.sent += n
	return n, nil
}

func (b *blockingResult) Close() error { return nil }

// TestResultDownloadsPerTenant: a tenant holding MaxDownloadsPerTenant
// downloads gets 429 TOO_MANY_DOWNLOADS with Retry-After for one more;
// another tenant downloads meanwhile; a finished download frees its slot.
func TestResultDownloadsPerTenant(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	h := start(t, func(c *gateway.Config) {
		c.MaxDownloadsPerTenant = 2
		c.Authenticator = gateway.StaticTokens{"tok-a": "acme", "tok-b": "globex"}
	})
	h.fake.result = func(id string) (string, int64, io.ReadCloser, bool) {
		if strings.HasPrefix(id, "slow") {
			return "application/octet-stream", 1 << 20, &blockingResult{size: 1 << 20, release: release}, true
		}
		return "text/plain", 2, io.NopCloser(strings.NewReader("ok")), true
	}
	get := func(tok, id string) (*http.Response, net.Conn) {
		c, err := net.Dial("tcp", h.srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /v1/documents/%s/result HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", id, tok)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, c
	}
	for i := range 2 {
		resp, c := get("tok-a", fmt.Sprintf("slow-%d", i))
		defer c.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("download %d: HTTP %d", i, resp.StatusCode)
		}
	}
	resp, c := get("tok-a", "slow-3")
	b, _ := io.ReadAll(resp.Body)
	c.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "TOO_MANY_DOWNLOADS") {
		t.Errorf("third download of one tenant: HTTP %d Retry-After %q %s, want 429 TOO_MANY_DOWNLOADS", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	resp, c = get("tok-b", "fast")
	b, _ = io.ReadAll(resp.Body)
	c.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Errorf("another tenant's download: HTTP %d %q", resp.StatusCode, b)
	}
	once.Do(func() { close(release) })
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, c = get("tok-a", "fast")
		io.Copy(io.Discard, resp.Body)
		c.Close()
		if resp.StatusCode == 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp.StatusCode != 200 {
		t.Errorf("after the downloads finished: HTTP %d, want 200", resp.StatusCode)
	}
}

// TestResultContentTypeSafety: every result carries nosniff and a
// sandboxing CSP; active content types (HTML, SVG, XML, JavaScript...)
// and unparsable ones are attachments, inert ones are not.
func TestResultContentTypeSafety(t *testing.T) {
	h := start(t, nil)
	h.fake.result = func(id string) (string, int64, io.ReadCloser, bool) {
		ct := map[string]string{
			"html": "text/html; charset=utf-8", "svg": "image/svg+xml", "xml": "application/xml", "atom": "application/atom+xml",
			"js": "text/javascript", "xhtml": "application/xhtml+xml", "upper": "TEXT/HTML", "bad": "text/html;;; ===",
			"plain": "text/plain; charset=utf-8", "json": "application/json", "png": "image/png",
		}[id]
		return ct, 5, io.NopCloser(strings.NewReader("<b/>x")), true
	}
	for id, attach := range map[string]bool{"html": true, "svg": true, "xml": true, "atom": true, "js": true, "xhtml": true, "upper": true, "bad": true,
		"plain": false, "json": false, "png": false} {
		code, hdr, _ := h.do("GET", "/v1/documents/"+id+"/result", nil)
		if code != 200 {
			t.Errorf("%s: HTTP %d", id, code)
			continue
		}
		if hdr.Get("X-Content-Type-Options") != "nosniff" || !strings.HasPrefix(hdr.Get("Content-Security-Policy"), "sandbox") {
			t.Errorf("%s: nosniff %q CSP %q, want nosniff and sandbox", id, hdr.Get("X-Content-Type-Options"), hdr.Get("Content-Security-Policy"))
		}
		if got := strings.HasPrefix(hdr.Get("Content-Disposition"), "attachment"); got != attach {
			t.Errorf("%s (%s): Content-Disposition %q, want attachment=%v", id, hdr.Get("Content-Type"), hdr.Get("Content-Disposition"), attach)
		}
	}
}

// TestUnaryNotBehindStreams: with every HTTP/2 stream slot of tenant
// acme's REST proxy lane taken by NDJSON subscriptions
// (MaxConcurrentStreams 2), acme's and globex's REST GETs answer at once
// (unary calls run in-process, on no connection), and globex still
// subscribes at once: each tenant's streams have their own lane (issue
// 22). Before, every tenant's calls shared the proxy's connections.
func TestUnaryNotBehindStreams(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.MaxConcurrentStreams = 2
		c.MaxSubscribersPerTenant = -1
		c.Authenticator = gateway.StaticTokens{"tok-a": "acme", "tok-b": "globex"}
	})
	doc := h.fake.add(0, 1)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	subscribe := func(tok string) error {
		c, err := net.Dial("tcp", h.srv.HTTPAddr())
		if err != nil {
			return err
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /v1/events:subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", tok)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	}
	for i := range 2 {
		if err := subscribe("tok-a"); err != nil {
			t.Fatalf("acme subscription %d: %v", i, err)
		}
	}
	for _, tok := range []string{"tok-a", "tok-b"} {
		start := time.Now()
		code, _, body := h.do("GET", "/v1/documents/"+doc.Id, nil, "Authorization", "Bearer "+tok)
		if took := time.Since(start); code != 404 && code != 200 || took > time.Second {
			t.Errorf("%s: GET with acme's stream slots taken: HTTP %d after %v %s, want an answer at once", tok, code, took, body)
		}
	}
	start := time.Now()
	if err := subscribe("tok-b"); err != nil || time.Since(start) > time.Second {
		t.Errorf("globex subscription with acme's lane full: %v after %v, want 200 at once", err, time.Since(start))
	}
}
