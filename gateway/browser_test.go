package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pipestream/gateway/gateway"
)

// TestBrowserNoTokenProtections: without tokens (loopback), a DNS-rebinding
// Host is 421, a cross-site write 403, a simple content type from a
// browser 415; same-origin writes, non-browser clients and reads from
// loopback names pass (issue 12).
func TestBrowserNoTokenProtections(t *testing.T) {
	h := start(t, nil)
	port := h.srv.HTTPAddr()[strings.LastIndex(h.srv.HTTPAddr(), ":"):]
	jsonDoc := `{"content":"aGk=","contentType":"text/plain"}`

	// DNS rebinding: a foreign Host reads nothing.
	for _, host := range []string{"rebind.evil.example", "rebind.evil.example" + port, "10.0.0.1" + port} {
		code, body := doHost(t, h, host)
		st := decodeStatus(t, body)
		if code != http.StatusMisdirectedRequest || !strings.Contains(st.Message, "not a loopback name") || st.Details[0].Reason != "FOREIGN_HOST" {
			t.Errorf("Host %s: %d %s, want 421 FOREIGN_HOST", host, code, body)
		}
	}
	for _, host := range []string{"localhost" + port, "127.0.0.1" + port, "[::1]" + port, "LOCALHOST"} {
		if code, body := doHost(t, h, host); code != http.StatusOK {
			t.Errorf("Host %s: %d %s, want 200", host, code, body)
		}
	}

	// Cross-site writes from a browser.
	cases := []struct {
		name   string
		ct     string
		hdr    []string
		want   int
		reason string
	}{
		{"cross-site text/plain", "text/plain", []string{"Origin", "https://evil.example"}, http.StatusForbidden, "CROSS_SITE_REQUEST"},
		{"cross-site json", "application/json", []string{"Origin", "https://evil.example"}, http.StatusForbidden, "CROSS_SITE_REQUEST"},
		{"origin null", "application/json", []string{"Origin", "null"}, http.StatusForbidden, "CROSS_SITE_REQUEST"},
		{"cross-site no Origin", "application/json", []string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden, "CROSS_SITE_REQUEST"},
		{"same-origin form", "application/x-www-form-urlencoded", []string{"Origin", h.base}, http.StatusUnsupportedMediaType, "CROSS_SITE_REQUEST"},
		{"same-origin text/plain", "text/plain;charset=UTF-8", []string{"Origin", h.base}, http.StatusUnsupportedMediaType, "CROSS_SITE_REQUEST"},
		{"same-origin json", "application/json", []string{"Origin", h.base}, http.StatusOK, ""},
		{"curl form default", "application/x-www-form-urlencoded", nil, http.StatusOK, ""},
		{"curl text/plain", "text/plain", nil, http.StatusOK, ""},
	}
	for _, c := range cases {
		hdr := append([]string{"Content-Type", c.ct}, c.hdr...)
		code, _, body := h.do(http.MethodPost, "/v1/documents", strings.NewReader(jsonDoc), hdr...)
		if code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
			continue
		}
		if c.reason != "" {
			if st := decodeStatus(t, body); len(st.Details) == 0 || st.Details[0].Reason != c.reason || st.Message == "" {
				t.Errorf("%s: %s, want reason %s", c.name, body, c.reason)
			}
		}
	}
	// The raw upload route takes any content type, but not cross-site.
	if code, _, body := h.do(http.MethodPost, "/v1/documents:upload", strings.NewReader("hi"), "Content-Type", "text/plain", "Origin", "http://evil.example"); code != http.StatusForbidden {
		t.Errorf("cross-site upload: %d %s, want 403", code, body)
	}
	if code, _, body := h.do(http.MethodPost, "/v1/documents:upload", strings.NewReader("hi"), "Content-Type", "text/plain", "Origin", h.base); code != http.StatusOK {
		t.Errorf("same-origin upload: %d %s, want 200", code, body)
	}
	// A cross-site read is not refused by the gateway (the browser keeps
	// the response from the page without CORS headers).
	code, hdr, _ := h.do(http.MethodGet, "/v1/documents", nil, "Origin", "https://evil.example")
	if code != http.StatusOK || hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("cross-site GET: %d ACAO %q, want 200 without CORS headers", code, hdr.Get("Access-Control-Allow-Origin"))
	}
}

// TestBrowserCORS: --cors-origins answers preflights for the listed
// origins (REST and WebSocket), lets them write, and nobody else.
func TestBrowserCORS(t *testing.T) {
	const app = "http://app.example:3000"
	h := start(t, func(c *gateway.Config) { c.CORSOrigins = []string{app + "/"} })

	code, hdr, _ := h.do(http.MethodOptions, "/v1/documents", nil,
		"Origin", app, "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization,content-type") // as browsers send it: sorted, lowercase
	if code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("preflight: %d", code)
	}
	if hdr.Get("Access-Control-Allow-Origin") != app || !strings.Contains(hdr.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(strings.ToLower(hdr.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Errorf("preflight headers: %v", hdr)
	}
	code, hdr, _ = h.do(http.MethodOptions, "/v1/documents", nil, "Origin", "http://other.example", "Access-Control-Request-Method", "POST")
	if hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from an unlisted origin: %d ACAO %q", code, hdr.Get("Access-Control-Allow-Origin"))
	}
	code, hdr, body := h.do(http.MethodPost, "/v1/documents", strings.NewReader(`{"content":"aGk="}`), "Content-Type", "application/json", "Origin", app)
	if code != http.StatusOK || hdr.Get("Access-Control-Allow-Origin") != app || !strings.Contains(hdr.Get("Access-Control-Expose-Headers"), "X-Request-Id") {
		t.Errorf("CORS POST: %d %v %s", code, hdr, body)
	}
	if code, _, body := h.do(http.MethodPost, "/v1/documents", strings.NewReader(`{"content":"aGk="}`), "Content-Type", "application/json", "Origin", "http://other.example"); code != http.StatusForbidden {
		t.Errorf("unlisted origin POST: %d %s, want 403", code, body)
	}
	// A plain OPTIONS (no preflight) answers the path's Allow.
	code, hdr, _ = h.do(http.MethodOptions, "/v1/documents/x", nil)
	if code != http.StatusNoContent || hdr.Get("Allow") != "GET, OPTIONS" {
		t.Errorf("OPTIONS: %d Allow %q", code, hdr.Get("Allow"))
	}

	// WebSocket: the listed origin is accepted, another refused.
	ws := "ws://" + h.srv.HTTPAddr() + "/v1/events/ws?cursor=0"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {app}}})
	if err != nil {
		t.Fatalf("WebSocket from %s: %v", app, err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	_, resp, err := websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://other.example"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("WebSocket from another origin: %v, want 403", err)
	}
}

// TestCORSOriginsValidated: a malformed --cors-origins entry is refused
// at startup with what to write instead.
func TestCORSOriginsValidated(t *testing.T) {
	for _, o := range []string{"app.example.com", "https://*.example.com", "https://app.example.com/path", "ftp://x"} {
		_, err := gateway.New(gateway.Config{Bridge: newFakeBridge(), CORSOrigins: []string{o}})
		if err == nil || !strings.Contains(err.Error(), "scheme://host") {
			t.Errorf("%q: %v, want an error naming scheme://host", o, err)
		}
	}
}

// doHost sends GET /v1/documents with the given Host header.
func doHost(t *testing.T, h *harness, host string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.base+"/v1/documents", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
