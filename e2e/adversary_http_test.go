package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// HTTP adversary over raw TCP (net.Dial) against the running binary
// (docs/security.md Limits): each attack gets its documented answer while a
// well-behaved client keeps submitting and reading documents.

const (
	advReadHeaderTimeout = time.Second
	advUploadIdleTimeout = time.Second
	advJSONLimit         = 64 << 10
)

// rawExchange writes req on a fresh TCP connection, optionally trickles
// more, and returns the status line (empty if the server closed without a
// response), the whole response, and how long until the server closed or
// answered.
func rawExchange(t *testing.T, addr string, req []byte, trickle func(net.Conn) error) (statusLine string, resp []byte, took time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write(req); err != nil {
		t.Fatalf("write: %v", err)
	}
	done := make(chan struct{})
	if trickle != nil {
		go func() {
			defer close(done)
			_ = trickle(c) // ends with a write error once the server closed
		}()
	} else {
		close(done)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(c)
	took = time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server neither answered nor closed the connection within 30 s")
	}
	c.Close()
	<-done
	line, _, _ := bytes.Cut(b, []byte("\r\n"))
	return string(line), b, took
}

func wantStatusLine(t *testing.T, what, line string, code int) {
	t.Helper()
	if !strings.HasPrefix(line, fmt.Sprintf("HTTP/1.1 %d ", code)) {
		t.Errorf("%s: got %q, want HTTP/1.1 %d", what, line, code)
	}
}

// bystander submits and reads documents until stop, counting failures:
// "other clients are unaffected".
type bystander struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop       chan struct{}
	done       chan struct{}
}

func startBystander(t *testing.T, g *gatewayProc) *bystander {
	b := &bystander{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second}
	fail := func(format string, args ...any) {
		b.failed.Add(1)
		b.mu.Lock()
		if len(b.errs) < 5 {
			b.errs = append(b.errs, fmt.Sprintf(format, args...))
		}
		b.mu.Unlock()
	}
	go func() {
		defer close(b.done)
		for i := 0; ; i++ {
			select {
			case <-b.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			body := fmt.Sprintf(`{"content":%q,"contentType":"text/plain"}`, b64([]byte(fmt.Sprintf("bystander %d", i))))
			resp, err := client.Post(g.baseURL()+"/v1/documents", "application/json", strings.NewReader(body))
			if err != nil {
				fail("submit: %v", err)
				continue
			}
			var d struct{ Id string }
			err = json.NewDecoder(resp.Body).Decode(&d)
			resp.Body.Close()
			if resp.StatusCode != 200 || err != nil || d.Id == "" {
				fail("submit: HTTP %d %v", resp.StatusCode, err)
				continue
			}
			resp, err = client.Get(g.baseURL() + "/v1/documents/" + d.Id)
			if err != nil {
				fail("get: %v", err)
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				fail("get: HTTP %d", resp.StatusCode)
				continue
			}
			b.ok.Add(1)
		}
	}()
	t.Cleanup(func() { b.finish(t) })
	return b
}

func (b *bystander) finish(t *testing.T) {
	select {
	case <-b.stop:
		return
	default:
	}
	close(b.stop)
	<-b.done
	if b.failed.Load() > 0 || b.ok.Load() == 0 {
		t.Errorf("well-behaved client during the attacks: %d ok, %d failed: %v", b.ok.Load(), b.failed.Load(), b.errs)
	}
}

func TestHTTPAdversary(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gwOpts{args: []string{
		"--read-header-timeout", advReadHeaderTimeout.String(),
		"--upload-idle-timeout", advUploadIdleTimeout.String(),
		"--max-json-body-bytes", fmt.Sprint(advJSONLimit),
	}})
	by := startBystander(t, g)
	addr := g.httpAddr

	t.Run("slowloris headers", func(t *testing.T) {
		// One header line every 300 ms: never finishes within
		// --read-header-timeout, so the server closes the connection.
		line, _, took := rawExchange(t, addr, []byte("GET /healthz HTTP/1.1\r\nHost: x\r\n"), func(c net.Conn) error {
			for i := 0; ; i++ {
				time.Sleep(300 * time.Millisecond)
				if _, err := fmt.Fprintf(c, "X-Slow-%d: a\r\n", i); err != nil {
					return err
				}
			}
		})
		if strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Errorf("slowloris headers got %q", line)
		}
		if took < advReadHeaderTimeout-100*time.Millisecond || took > advReadHeaderTimeout+3*time.Second {
			t.Errorf("slowloris connection closed after %v, want about --read-header-timeout %v", took, advReadHeaderTimeout)
		}
	})
	t.Run("slow upload body", func(t *testing.T) {
		req := "POST /v1/documents:upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("x", 1000)
		line, resp, took := rawExchange(t, addr, []byte(req), nil)
		wantStatusLine(t, "upload body that stalls", line, 408)
		if !bytes.Contains(resp, []byte("UPLOAD_STALLED")) {
			t.Errorf("408 body does not carry reason UPLOAD_STALLED: %s", resp)
		}
		if took > advUploadIdleTimeout+3*time.Second {
			t.Errorf("stalled upload cut after %v, want about --upload-idle-timeout %v", took, advUploadIdleTimeout)
		}
	})
	t.Run("huge headers", func(t *testing.T) {
		req := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: " + strings.Repeat("h", 2<<20) + "\r\n\r\n"
		line, _, _ := rawExchange(t, addr, []byte(req), nil)
		wantStatusLine(t, "2 MiB of headers", line, 431)
	})
	t.Run("malformed JSON", func(t *testing.T) {
		for _, body := range []string{`{"content":`, `{"content":"aGk="`, `nul`, `{"content":12}`, `{"content":"aGk=","split":{"chunkBytes":"many"}}`} {
			r := curl(t, "POST", g.baseURL()+"/v1/documents", []byte(body), "-H", "Content-Type: application/json")
			wantError(t, "malformed JSON "+body, r, 400, 3, "")
		}
	})
	t.Run("wrong content types", func(t *testing.T) {
		r := curl(t, "POST", g.baseURL()+"/v1/documents", []byte("content=aGk%3D"), "-H", "Content-Type: application/x-www-form-urlencoded")
		wantError(t, "form-encoded submit", r, 400, 3, "")
		r = curl(t, "POST", g.baseURL()+"/v1/documents", []byte("<doc>aGk=</doc>"), "-H", "Content-Type: application/xml")
		wantError(t, "XML submit", r, 400, 3, "")
		r = curl(t, "POST", g.baseURL()+"/v1/documents", []byte{0xff, 0xfe, 0, 0x7b}, "-H", "Content-Type: application/octet-stream")
		wantError(t, "binary body on the JSON route", r, 400, 3, "")
	})
	t.Run("absurd page sizes", func(t *testing.T) {
		for _, ps := range []string{"-1", "-2147483648", "99999999999", "1e3", "NaN"} {
			r := curl(t, "GET", g.baseURL()+"/v1/documents?pageSize="+ps, nil)
			wantError(t, "pageSize="+ps, r, 400, 3, "")
		}
		// Above the maximum: coerced (AIP-158), never more than 1000 back.
		r := curl(t, "GET", g.baseURL()+"/v1/documents?pageSize=2147483647", nil)
		if r.status == 200 {
			var l struct{ Documents []json.RawMessage }
			if err := json.Unmarshal(r.body, &l); err != nil || len(l.Documents) > 1000 {
				t.Errorf("pageSize=2147483647: %d documents, %v", len(l.Documents), err)
			}
		} else {
			wantError(t, "pageSize=2147483647", r, 400, 3, "")
		}
		wantError(t, "garbage page token", curl(t, "GET", g.baseURL()+"/v1/documents?pageToken=%2e%2e%2f%00", nil), 400, 3, "")
	})
	t.Run("path traversal ids", func(t *testing.T) {
		for _, id := range []string{"..%2f..%2fetc%2fpasswd", "..%2F..%2Fdata%2Fstore.db", "%2e%2e%2f%2e%2e%2f", "a%00b", "..%5c..%5c"} {
			for _, p := range []string{"/v1/documents/" + id, "/v1/documents/" + id + "/result", "/v1/claims/" + id} {
				r := curl(t, "GET", g.baseURL()+p, nil, "--path-as-is")
				if r.status != 404 && r.status != 400 {
					t.Errorf("GET %s: %s, want 404 or 400", p, r)
				}
				if bytes.Contains(r.body, []byte("root:")) || bytes.Contains(r.body, []byte("SQLite format")) {
					t.Errorf("GET %s leaked a file: %s", p, r)
				}
			}
		}
	})
	t.Run("oversize JSON body", func(t *testing.T) {
		big := []byte(`{"content":"` + strings.Repeat("QUFB", advJSONLimit/4) + `"}`)
		wantError(t, "JSON body over --max-json-body-bytes", curl(t, "POST", g.baseURL()+"/v1/documents", big, "-H", "Content-Type: application/json"),
			413, 3, "TOO_LARGE", "limit")
		wantError(t, "chunked JSON body over the limit", curl(t, "POST", g.baseURL()+"/v1/documents", big, "-H", "Content-Type: application/json", "-H", "Transfer-Encoding: chunked"),
			413, 3, "TOO_LARGE")
	})
	t.Run("smuggling", func(t *testing.T) {
		doc := fmt.Sprintf(`{"content":%q}`, b64([]byte("smuggled")))
		chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(doc), doc)
		req := "POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked
		line, resp, _ := rawExchange(t, addr, []byte(req), nil)
		wantStatusLine(t, "Content-Length with Transfer-Encoding: chunked", line, 400)
		if t.Failed() {
			t.Logf("response: %.300s", resp)
		}
		req = "POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(doc)) + "\r\nContent-Length: 4\r\nConnection: close\r\n\r\n" + doc
		line, _, _ = rawExchange(t, addr, []byte(req), nil)
		wantStatusLine(t, "two different Content-Length headers", line, 400)
		req = "POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n" + chunked
		line, _, _ = rawExchange(t, addr, []byte(req), nil)
		if !strings.HasPrefix(line, "HTTP/1.1 400") && !strings.HasPrefix(line, "HTTP/1.1 501") {
			t.Errorf("Transfer-Encoding gzip, chunked: %q, want 400 or 501", line)
		}
	})
	by.finish(t)
	t.Logf("well-behaved client: %d documents submitted and read during the attacks", by.ok.Load())
}
