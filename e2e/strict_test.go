package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 12 (strict input, browsers, h2c, uploads at shutdown) with real
// curl and the real CLI against the real binary.

// rpcMessage returns the message of a JSON google.rpc.Status body.
func rpcMessage(t *testing.T, r httpResp) (msg, reason string) {
	t.Helper()
	var st struct {
		Message string `json:"message"`
		Details []struct {
			Reason string `json:"reason"`
		} `json:"details"`
	}
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatalf("error body is not a JSON Status: %v\n%s", err, r)
	}
	if len(st.Details) > 0 {
		reason = st.Details[0].Reason
	}
	return st.Message, reason
}

// header returns the value of the last response's header name.
func header(r httpResp, name string) string {
	var v string
	for _, l := range strings.Split(r.headers, "\n") {
		if k, val, ok := strings.Cut(l, ":"); ok && strings.EqualFold(strings.TrimSpace(k), name) {
			v = strings.TrimSpace(val)
		}
	}
	return v
}

// TestStrictRESTInput: misspelled fields and unknown enum values are 400
// naming the camelCase JSON field and what is allowed; query parameters
// likewise; a wrong method is 405 with Allow; GET / leads to the console
// and docs; no Grpc-Metadata-* header leaks.
func TestStrictRESTInput(t *testing.T) {
	g := shared(t)
	base := g.baseURL()
	for _, c := range []struct {
		body string
		want []string
	}{
		{`{"content":"aGk=","contentTyp":"text/plain"}`, []string{`unknown field "contentTyp"`, `did you mean "contentType"`}},
		{`{"content":"aGk=","spilt":{"processor":"textstats"}}`, []string{`unknown field "spilt"`, `did you mean "split"`}},
		{`{"content":"aGk=","split":{"strategy":"SPLIT_LINEZ"}}`, []string{`split.strategy: unknown value "SPLIT_LINEZ"`, "SPLIT_LINES"}},
		{`{"content":"aGk=","split":{"chunkBytes":99999999}}`, []string{"split.chunkBytes"}},
	} {
		r := curlJSON(t, "POST", base+"/v1/documents", c.body)
		msg, _ := rpcMessage(t, r)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: %s, want 400", c.body, r)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: message %q lacks %q", c.body, msg, w)
			}
		}
		if regexp.MustCompile(`[a-z]_[a-z]`).MatchString(msg) {
			t.Errorf("%s: message %q names a field in snake_case", c.body, msg)
		}
	}
	for q, want := range map[string]string{
		"pagesize=5":   `unknown query parameter "pagesize" (did you mean "pageSize"?)`,
		"pageSize=abc": `query parameter pageSize="abc": want an integer`,
		"pageSize=-1":  "pageSize must",
	} {
		r := curl(t, "GET", base+"/v1/documents?"+q, nil)
		if msg, _ := rpcMessage(t, r); r.status != http.StatusBadRequest || !strings.Contains(msg, want) {
			t.Errorf("?%s: %s, want 400 with %q", q, r, want)
		}
	}

	r := curl(t, "DELETE", base+"/v1/documents", nil)
	if r.status != http.StatusMethodNotAllowed || header(r, "Allow") != "GET, OPTIONS, POST" {
		t.Errorf("DELETE /v1/documents: %s Allow %q, want 405 with Allow: GET, OPTIONS, POST", r, header(r, "Allow"))
	}
	r = curl(t, "PUT", base+"/v1/events:window", nil)
	if r.status != http.StatusMethodNotAllowed || header(r, "Allow") != "GET, OPTIONS" {
		t.Errorf("PUT /v1/events:window: %s Allow %q", r, header(r, "Allow"))
	}

	r = curl(t, "GET", base+"/", nil)
	var idx struct{ Links map[string]string }
	if r.status != http.StatusOK || json.Unmarshal(r.body, &idx) != nil || idx.Links["console"] != "/ui/" || idx.Links["docs"] != "/docs/" || idx.Links["openapi"] != "/openapi.json" {
		t.Errorf("GET /: %s, want a JSON index linking /ui/, /docs/, /openapi.json", r)
	}
	r = curl(t, "GET", base+"/", nil, "-H", "Accept: text/html")
	if r.status != http.StatusFound || header(r, "Location") != "/ui/" {
		t.Errorf("browser GET /: %s Location %q, want 302 to /ui/", r, header(r, "Location"))
	}

	r = curlJSON(t, "POST", base+"/v1/documents", `{"content":"aGk=","contentType":"text/plain"}`)
	if r.status != http.StatusOK || strings.Contains(strings.ToLower(r.headers), "grpc-") {
		t.Errorf("submit: %s\nheaders:\n%s\nwant 200 without Grpc-* headers", r, r.headers)
	}
}

// TestBrowserProtectionsNoToken: in the default no-token loopback mode a
// DNS-rebinding Host is 421, a cross-site write 403, a browser's
// text/plain JSON write 415; curl without Origin still works.
func TestBrowserProtectionsNoToken(t *testing.T) {
	g := shared(t)
	base := g.baseURL()
	r := curl(t, "GET", base+"/v1/documents", nil, "-H", "Host: rebind.evil.example")
	if msg, reason := rpcMessage(t, r); r.status != http.StatusMisdirectedRequest || reason != "FOREIGN_HOST" || !strings.Contains(msg, "loopback") {
		t.Errorf("foreign Host: %s, want 421 FOREIGN_HOST", r)
	}
	if r := curl(t, "GET", base+"/v1/documents", nil, "-H", "Host: localhost"); r.status != http.StatusOK {
		t.Errorf("Host localhost: %s", r)
	}
	doc := []byte(`{"content":"aGk=","contentType":"text/plain"}`)
	r = curl(t, "POST", base+"/v1/documents", doc, "-H", "Content-Type: text/plain", "-H", "Origin: https://evil.example")
	if msg, reason := rpcMessage(t, r); r.status != http.StatusForbidden || reason != "CROSS_SITE_REQUEST" || !strings.Contains(msg, "--cors-origins") {
		t.Errorf("cross-site text/plain POST: %s, want 403 CROSS_SITE_REQUEST", r)
	}
	r = curl(t, "POST", base+"/v1/documents:upload", []byte("hello"), "-H", "Content-Type: text/plain", "-H", "Origin: https://evil.example")
	if r.status != http.StatusForbidden {
		t.Errorf("cross-site upload: %s, want 403", r)
	}
	r = curl(t, "POST", base+"/v1/documents", doc, "-H", "Content-Type: text/plain", "-H", "Origin: "+base)
	if r.status != http.StatusUnsupportedMediaType {
		t.Errorf("same-origin text/plain JSON write: %s, want 415", r)
	}
	if r := curl(t, "POST", base+"/v1/documents", doc); r.status != http.StatusOK { // curl -d default: form type, no Origin
		t.Errorf("curl POST without Origin: %s, want 200", r)
	}
}

// TestBrowserCORSOrigins: --cors-origins answers preflights for the listed
// origin (REST), lets it write and accepts its WebSocket handshake;
// another origin gets no CORS headers, a 403 on writes and on the
// WebSocket.
func TestBrowserCORSOrigins(t *testing.T) {
	const app = "http://app.example:3000"
	g := startGateway(t, gwOpts{args: []string{"--cors-origins", app + ",https://other-app.example"}})
	base := g.baseURL()
	r := curl(t, "OPTIONS", base+"/v1/documents", nil, "-H", "Origin: "+app,
		"-H", "Access-Control-Request-Method: POST", "-H", "Access-Control-Request-Headers: authorization,content-type")
	if r.status/100 != 2 || header(r, "Access-Control-Allow-Origin") != app || !strings.Contains(header(r, "Access-Control-Allow-Methods"), "POST") {
		t.Errorf("preflight: %s\n%s", r, r.headers)
	}
	r = curl(t, "OPTIONS", base+"/v1/documents", nil, "-H", "Origin: https://evil.example", "-H", "Access-Control-Request-Method: POST")
	if header(r, "Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from an unlisted origin got CORS headers:\n%s", r.headers)
	}
	r = curl(t, "POST", base+"/v1/documents", []byte(`{"content":"aGk="}`), "-H", "Content-Type: application/json", "-H", "Origin: "+app)
	if r.status != http.StatusOK || header(r, "Access-Control-Allow-Origin") != app {
		t.Errorf("CORS POST: %s\n%s", r, r.headers)
	}
	r = curl(t, "POST", base+"/v1/documents", []byte(`{"content":"aGk="}`), "-H", "Content-Type: application/json", "-H", "Origin: https://evil.example")
	if r.status != http.StatusForbidden {
		t.Errorf("unlisted origin POST: %s, want 403", r)
	}
	ws := func(origin string) int {
		r := curlStreamAuth(t, base+"/v1/events/ws?cursor=0", 2*time.Second, []string{"--http1.1",
			"-H", "Connection: Upgrade", "-H", "Upgrade: websocket", "-H", "Sec-WebSocket-Version: 13",
			"-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "-H", "Origin: " + origin})
		return r.status
	}
	if code := ws(app); code != http.StatusSwitchingProtocols {
		t.Errorf("WebSocket from %s: HTTP %d, want 101", app, code)
	}
	if code := ws("https://evil.example"); code != http.StatusForbidden {
		t.Errorf("WebSocket from an unlisted origin: HTTP %d, want 403", code)
	}
}

// TestH2CWithCurl: the plaintext REST port speaks HTTP/2 with prior
// knowledge (curl --http2-prior-knowledge) for JSON, uploads and errors;
// curl --http2 (Upgrade: h2c) is answered in HTTP/1.1; HTTP/1.1 and the
// smuggling guard are unchanged.
func TestH2CWithCurl(t *testing.T) {
	g := shared(t)
	base := g.baseURL()
	r := curl(t, "GET", base+"/v1/events:window", nil, "--http2-prior-knowledge")
	if r.status != http.StatusOK || !strings.HasPrefix(r.headers, "HTTP/2 200") {
		t.Errorf("h2c GET: %s\n%s", r, r.headers)
	}
	r = curl(t, "POST", base+"/v1/documents:upload?split.strategy=lines", []byte("a\nb\nc\n"), "--http2-prior-knowledge", "-H", "Content-Type: text/plain")
	if r.status != http.StatusOK || !strings.HasPrefix(r.headers, "HTTP/2 200") || !strings.Contains(string(r.body), `"contentType":"text/plain"`) {
		t.Errorf("h2c upload: %s\n%s", r, r.headers)
	}
	r = curl(t, "POST", base+"/v1/documents", []byte(`{"spilt":{}}`), "--http2-prior-knowledge", "-H", "Content-Type: application/json")
	if r.status != http.StatusBadRequest || !strings.HasPrefix(r.headers, "HTTP/2 400") {
		t.Errorf("h2c bad JSON: %s\n%s", r, r.headers)
	}
	r = curl(t, "GET", base+"/v1/events:window", nil, "--http2")
	if r.status != http.StatusOK || !strings.HasPrefix(r.headers, "HTTP/1.1 200") {
		t.Errorf("curl --http2 (Upgrade: h2c): %s\n%s, want an HTTP/1.1 200", r, r.headers)
	}
	// The guard still refuses ambiguous HTTP/1 framing on this port.
	r = curl(t, "POST", base+"/v1/documents", []byte("0\r\n\r\n"), "--http1.1", "-H", "Content-Length: 5", "-H", "Transfer-Encoding: chunked")
	if r.status != http.StatusBadRequest {
		t.Errorf("CL+TE over HTTP/1.1: %s, want 400", r)
	}
}

// TestSubmitCutByShutdown: `gateway submit` of a stream still arriving
// when the server shuts down prints the server's SHUTTING_DOWN status
// (retry later), not a bare EOF.
func TestSubmitCutByShutdown(t *testing.T) {
	g := startGateway(t, gwOpts{args: []string{"--shutdown-timeout", "4s"}})
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), "submit", "--addr", g.grpcAddr, "-")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Feed the CLI 64 KiB every 100 ms until it exits (its stdin closes).
	go func() {
		chunk := []byte(strings.Repeat("line of a long document\n", 64<<10/24))
		for ctx.Err() == nil {
			if _, err := stdin.Write(chunk); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // pacing the input, not synchronisation
		}
	}()
	// The upload is in flight once the server received its first chunk.
	waitFor(t, "the upload to reach the server", time.Minute, func() bool {
		return uploadMessages(t, g) >= 2
	})
	g.proc.stop() // SIGTERM: graceful shutdown
	err = cmd.Wait()
	stdin.Close()
	if err == nil {
		t.Fatalf("submit succeeded through a shutdown; stderr %s", stderr.String())
	}
	out := stderr.String()
	if !strings.Contains(out, "Unavailable") || !strings.Contains(out, "shutting down") || !strings.Contains(out, "retry") || strings.Contains(out, "EOF") {
		t.Errorf("submit cut by shutdown printed %q, want the Unavailable shutting-down status saying to retry", out)
	}
}

// uploadMessages returns grpc_server_msg_received_total for UploadDocument.
func uploadMessages(t *testing.T, g *gatewayProc) int {
	resp, err := http.Get(g.baseURL() + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "grpc_server_msg_received_total") && strings.Contains(l, `grpc_method="UploadDocument"`) {
			n, _ := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
			return int(n)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return 0
}
