package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestResultHonoursAccept: GET /v1/documents/{id}/result serves the
// result's own type when Accept is absent or allows it, the same bytes as
// application/octet-stream when the client asks for that (generated
// clients do), and 406 with a google.rpc.Status naming both types
// otherwise. Vary: Accept on every answer.
func TestResultHonoursAccept(t *testing.T) {
	h := start(t, nil)
	want := []byte(`{"words":3}`)
	h.fake.result = func(id string) (string, int64, io.ReadCloser, bool) {
		return "application/json", int64(len(want)), io.NopCloser(bytes.NewReader(want)), true
	}
	path := "/v1/documents/d1/result"
	for _, tc := range []struct {
		accept, wantType string
	}{
		{"", "application/json"},
		{"*/*", "application/json"},
		{"application/*", "application/json"},
		{"application/json", "application/json"},
		{"application/octet-stream", "application/octet-stream"},
		{"text/plain, application/octet-stream;q=0.5", "application/octet-stream"},
		{"application/json;q=0.2, application/octet-stream;q=0.9", "application/octet-stream"},
		{"application/octet-stream;q=0.5, */*", "application/json"},
		{"application/json, application/octet-stream", "application/octet-stream"},
		{"application/octet-stream, application/json, text/plain", "application/octet-stream"},
		{"application/octet-stream;q=0.9, application/json", "application/json"},
		{"*", "application/json"},
		{"text/html, application/json;q=0.1", "application/json"},
		{"text/plain", ""},
		{"image/png, text/*", ""},
		{"application/json;q=0, application/octet-stream;q=0", ""},
	} {
		var hdr []string
		if tc.accept != "" {
			hdr = []string{"Accept", tc.accept}
		}
		code, rh, b := h.do("GET", path, nil, hdr...)
		if !strings.Contains(rh.Get("Vary"), "Accept") {
			t.Errorf("Accept %q: Vary %q, want Accept", tc.accept, rh.Get("Vary"))
		}
		if tc.wantType == "" {
			if code != http.StatusNotAcceptable || rh.Get("Content-Type") != "application/json" {
				t.Errorf("Accept %q: HTTP %d %s %s, want 406 application/json", tc.accept, code, rh.Get("Content-Type"), b)
				continue
			}
			st := decodeStatus(t, b)
			if st.reason() != gateway.ReasonNotAcceptable || !strings.Contains(st.Message, "application/json") ||
				!strings.Contains(st.Message, "application/octet-stream") {
				t.Errorf("Accept %q: 406 body %s, want reason %s naming both types", tc.accept, b, gateway.ReasonNotAcceptable)
			}
			continue
		}
		if code != http.StatusOK || rh.Get("Content-Type") != tc.wantType || !bytes.Equal(b, want) {
			t.Errorf("Accept %q: HTTP %d %q %q, want 200 %q with the result bytes", tc.accept, code, rh.Get("Content-Type"), b, tc.wantType)
		}
		if rh.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("Accept %q: nosniff missing", tc.accept)
		}
	}
}

// TestStreamsAreNDJSONWithOneErrorShape: watch answers
// application/x-ndjson lines of {"result": ...}; a stream refused before it
// started (unknown document) answers 404 with a bare google.rpc.Status as
// application/json, the shape unary routes and the spec use.
func TestStreamsAreNDJSONWithOneErrorShape(t *testing.T) {
	h := start(t, nil)
	d := h.fake.add(gatewayv1.State_PENDING, 1)
	code, rh, b := h.do("GET", "/v1/documents/"+d.GetId()+":watch", nil)
	if code != 200 || rh.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("watch: HTTP %d Content-Type %q, want 200 application/x-ndjson: %s", code, rh.Get("Content-Type"), b)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var env map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &env); err != nil || len(env) != 1 || env["result"] == nil {
			t.Errorf("watch line %q: want exactly {\"result\": ...}", line)
		}
	}
	for _, path := range []string{"/v1/documents/nope:watch", "/v1/events:subscribe?cursor=999999"} {
		code, rh, b = h.do("GET", path, nil)
		if code < 400 || rh.Get("Content-Type") != "application/json" {
			t.Errorf("%s: HTTP %d %q, want an error status as application/json", path, code, rh.Get("Content-Type"))
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(b, &top); err != nil || top["error"] != nil || top["code"] == nil || top["message"] == nil {
			t.Errorf("%s: body %s, want a bare google.rpc.Status {code, message, details}", path, b)
		}
	}
}

// TestWebSocketRejectionsAreJSONStatus: every rejection before the
// upgrade, whether the gateway's (bad cursor) or the WebSocket handshake's
// (not an upgrade 426, bad version 400, foreign Origin 403), is a JSON
// google.rpc.Status with the matching gRPC code, plus the AT sync draft's
// "error" name.
func TestWebSocketRejectionsAreJSONStatus(t *testing.T) {
	h := start(t, nil)
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	for _, tc := range []struct {
		name     string
		query    string
		hdr      []string
		httpCode int
		grpcCode int
		says     string
	}{
		{"bad cursor", "?cursor=abc", nil, 400, 3, "cursor"},
		{"plain GET", "", nil, 426, 9, "Upgrade"},
		{"bad version", "", append(upgrade, "Sec-WebSocket-Version", "7"), 400, 3, "version"},
		{"foreign origin", "", append(upgrade, "Sec-WebSocket-Version", "13", "Origin", "http://evil.example"), 403, 7, "Origin"},
	} {
		code, rh, b := h.do("GET", "/v1/events/ws"+tc.query, nil, tc.hdr...)
		var body struct {
			Code    int
			Message string
			Error   string
		}
		if err := json.Unmarshal(b, &body); err != nil || code != tc.httpCode || rh.Get("Content-Type") != "application/json" {
			t.Errorf("%s: HTTP %d %q %s, want %d application/json", tc.name, code, rh.Get("Content-Type"), b, tc.httpCode)
			continue
		}
		if body.Code != tc.grpcCode || body.Error == "" || !strings.Contains(body.Message, tc.says) {
			t.Errorf("%s: body %s, want code %d, an error name and a message about %q", tc.name, b, tc.grpcCode, tc.says)
		}
	}
}
