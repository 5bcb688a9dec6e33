package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
)

// TestStreamHeadersBeforeFirstEvent: NDJSON streams (GET
// /v1/events:subscribe, GET /v1/documents/{id}:watch) answer 200 with their
// headers as soon as the subscription started, although no event is there
// to send; a refused cursor still answers its HTTP error status. Real
// bridge (SQLite store and event log), no peer: documents stay PENDING.
func TestStreamHeadersBeforeFirstEvent(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   t.TempDir(),
		PeerAddr:  "127.0.0.1:9", // discard port: nothing answers QUIC there
		PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b })
	submit := func() string {
		code, _, body := h.do("POST", "/v1/documents", strings.NewReader(`{"content":"aGVsbG8=","contentType":"text/plain"}`))
		var doc struct{ Id string }
		if code != 200 || json.Unmarshal(body, &doc) != nil {
			t.Fatalf("submit: HTTP %d %s", code, body)
		}
		return doc.Id
	}
	first := submit()
	second := submit()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	w, err := b.Events().Window(ctx)
	cancel()
	if err != nil || w.GetLatestSeq() == 0 {
		t.Fatalf("window %v %v", w, err)
	}
	latest := strconv.FormatUint(w.GetLatestSeq(), 10)

	// headers opens path and returns the status once the headers are in;
	// the body stays open (nothing will come) until the test ends.
	headers := func(path string) (int, http.Header) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", h.base+path, nil)
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatalf("GET %s: no response headers while idle: %v", path, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp.StatusCode, resp.Header
	}
	for _, path := range []string{
		"/v1/events:subscribe", // live only
		"/v1/events:subscribe?cursor=" + latest + "&kinds=%23claim", // in the window, nothing matches
		"/v1/documents/" + first + ":watch?cursor=" + latest,        // the first document has no event from there
	} {
		code, hdr := headers(path)
		if code != 200 || hdr.Get("Content-Type") != "application/x-ndjson" {
			t.Errorf("GET %s: HTTP %d, Content-Type %q; want 200 application/x-ndjson before the first event", path, code, hdr.Get("Content-Type"))
		}
		for k := range hdr {
			if strings.Contains(strings.ToLower(k), "subscribed") {
				t.Errorf("GET %s: internal header %s leaked", path, k)
			}
		}
	}
	_ = second

	// Refused before the start: the HTTP status says so.
	for _, path := range []string{"/v1/events:subscribe?cursor=100000", "/v1/documents/" + first + ":watch?cursor=100000"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", h.base+path, nil)
		resp, err := h.http.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != 400 || !strings.Contains(string(body), "FutureCursor") {
			t.Errorf("GET %s: HTTP %d %s, want 400 FutureCursor", path, resp.StatusCode, body)
		}
	}
}
