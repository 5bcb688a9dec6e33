package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestRESTRoutesStatusAndErrors(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.MaxJSONBodyBytes = 4096 })
	running := h.fake.add(gatewayv1.State_RUNNING, 10)
	done := h.fake.add(gatewayv1.State_SUCCEEDED, 10)

	tests := []struct {
		name, method, path, body string
		wantHTTP                 int
		wantCode                 int    // google.rpc.Code, 0 = success
		wantMsg                  string // substring of the message
		wantReason               string
	}{
		{"submit ok", "POST", "/v1/documents", `{"content":"aGVsbG8=","contentType":"text/plain"}`, 200, 0, "", ""},
		{"submit invalid base64", "POST", "/v1/documents", `{"content":"!!not base64!!"}`, 400, 3, "base64", "INVALID_ARGUMENT"},
		{"submit without content", "POST", "/v1/documents", `{"contentType":"text/plain"}`, 400, 3, "content is required", "INVALID_ARGUMENT"},
		{"submit bridge invalid", "POST", "/v1/documents", `{"content":"aGk=","contentType":"bad/type"}`, 400, 3, "use e.g. text/plain", "INVALID_ARGUMENT"},
		{"submit request id reused", "POST", "/v1/documents", `{"content":"aGk=","requestId":"reused"}`, 409, 6, "use a new requestId", "ALREADY_EXISTS"},
		{"submit body too large", "POST", "/v1/documents", `{"content":"` + strings.Repeat("A", 8192) + `"}`, 413, 3, "documents:upload", "TOO_LARGE"},
		{"get unknown", "GET", "/v1/documents/nope", "", 404, 5, `"nope"`, "NOT_FOUND"},
		{"get ok", "GET", "/v1/documents/" + running.GetId(), "", 200, 0, "", ""},
		{"list", "GET", "/v1/documents?pageSize=10", "", 200, 0, "", ""},
		{"list negative page size", "GET", "/v1/documents?pageSize=-1", "", 400, 3, "pageSize", "INVALID_ARGUMENT"},
		{"cancel terminal", "POST", "/v1/documents/" + done.GetId() + ":cancel", `{}`, 400, 9, "cannot be cancelled", "FAILED_PRECONDITION"},
		{"cancel running", "POST", "/v1/documents/" + running.GetId() + ":cancel", `{}`, 200, 0, "", ""},
		{"result not ready", "GET", "/v1/documents/" + running.GetId() + "/result", "", 400, 9, "wait until", "FAILED_PRECONDITION"},
		{"result unknown", "GET", "/v1/documents/nope/result", "", 404, 5, "nope", "NOT_FOUND"},
		{"claim ok", "GET", "/v1/claims/42", "", 200, 0, "", ""},
		{"claim unknown", "GET", "/v1/claims/9", "", 404, 5, "claim 9", "NOT_FOUND"},
		{"redeem replay", "POST", "/v1/claims/1:redeem", `{}`, 400, 9, "exactly once", "CLAIM_ALREADY_REDEEMED"},
		{"redeem expired", "POST", "/v1/claims/2:redeem", `{}`, 400, 9, "expired", "CLAIM_EXPIRED"},
		{"redeem at a dead peer", "POST", "/v1/claims/3:redeem", `{}`, 503, 14, "unreachable since", "PEER_UNAVAILABLE"},
		{"window", "GET", "/v1/events:window", "", 200, 0, "", ""},
		{"snapshot", "GET", "/v1/events:snapshot", "", 200, 0, "", ""},
		{"subscribe future cursor", "GET", "/v1/events:subscribe?cursor=999", "", 400, 11, "FutureCursor", "FutureCursor"},
		{"unknown route", "GET", "/v1/nothing", "", 404, 5, "no route", "ROUTE_NOT_FOUND"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body *strings.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			var code int
			var b []byte
			if body != nil {
				code, _, b = h.do(tc.method, tc.path, body, "Content-Type", "application/json")
			} else {
				code, _, b = h.do(tc.method, tc.path, nil)
			}
			if code != tc.wantHTTP {
				t.Fatalf("HTTP %d, want %d: %s", code, tc.wantHTTP, b)
			}
			if tc.wantCode == 0 {
				if !json.Valid(b) {
					t.Fatalf("body is not JSON: %s", b)
				}
				return
			}
			st := decodeStatus(t, b)
			if st.Code != tc.wantCode {
				t.Errorf("google.rpc.Status code %d, want %d: %s", st.Code, tc.wantCode, b)
			}
			if !strings.Contains(st.Message, tc.wantMsg) {
				t.Errorf("message %q does not contain %q", st.Message, tc.wantMsg)
			}
			if st.reason() != tc.wantReason {
				t.Errorf("ErrorInfo reason %q, want %q", st.reason(), tc.wantReason)
			}
		})
	}

	t.Run("result bytes", func(t *testing.T) {
		code, hdr, b := h.do("GET", "/v1/documents/"+done.GetId()+"/result", nil)
		if code != 200 || string(b) != "result of "+done.GetId() {
			t.Fatalf("HTTP %d %q", code, b)
		}
		if ct := hdr.Get("Content-Type"); ct != "text/plain" {
			t.Errorf("Content-Type %q, want text/plain", ct)
		}
	})
}

func TestRESTRequestIDPropagation(t *testing.T) {
	h := start(t, nil)
	_, hdr, _ := h.do("GET", "/v1/documents/nope", nil, "X-Request-Id", "req-abc-123")
	if got := hdr.Get("X-Request-Id"); got != "req-abc-123" {
		t.Errorf("X-Request-Id %q, want the caller's req-abc-123", got)
	}
	_, hdr, _ = h.do("GET", "/v1/documents", nil)
	if got := hdr.Get("X-Request-Id"); len(got) != 32 {
		t.Errorf("generated X-Request-Id %q, want 32 hex characters", got)
	}
	if !strings.Contains(h.logs.String(), `"request_id":"req-abc-123"`) {
		t.Errorf("the call log does not carry the request id:\n%s", h.logs.String())
	}
}

// ndjson reads {"result": ...} / {"error": ...} lines.
type ndjsonLine struct {
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

func TestRESTWatchStreamsNDJSON(t *testing.T) {
	h := start(t, nil)
	d := h.fake.add(gatewayv1.State_PENDING, 1)
	code, _, b := h.do("GET", "/v1/documents/"+d.GetId()+":watch", nil)
	if code != 200 {
		t.Fatalf("HTTP %d: %s", code, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 updates:\n%s", len(lines), b)
	}
	var last struct {
		Result struct {
			Event    struct{ Seq string }
			Document struct{ State string }
		}
	}
	if err := json.Unmarshal([]byte(lines[2]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Result.Document.State != "SUCCEEDED" || last.Result.Event.Seq != "3" {
		t.Errorf("last update %s, want SUCCEEDED at seq 3", lines[2])
	}

	code, _, b = h.do("GET", "/v1/documents/nope:watch", nil)
	if code != 404 {
		t.Fatalf("watch unknown: HTTP %d, want 404: %s", code, b)
	}
	decodeStatus(t, b)
}

func TestRESTSubscribeNDJSON(t *testing.T) {
	h := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	read := func(path string, n int, push func()) []map[string]any {
		req, _ := http.NewRequestWithContext(ctx, "GET", h.base+path, nil)
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("HTTP %d", resp.StatusCode)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "json") {
			t.Errorf("Content-Type %q", ct)
		}
		sc := bufio.NewScanner(resp.Body)
		var out []map[string]any
		for len(out) < n {
			if len(out) == n-1 && push != nil {
				push()
			}
			if !sc.Scan() {
				t.Fatalf("stream ended after %d lines: %v", len(out), sc.Err())
			}
			var l ndjsonLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Result == nil {
				t.Fatalf("line %q is not a result: %v", sc.Text(), err)
			}
			var m map[string]any
			_ = json.Unmarshal(l.Result, &m)
			out = append(out, m)
		}
		return out
	}

	// Outdated cursor: #info OutdatedCursor, then the whole window 10..20.
	evs := read("/v1/events:subscribe?cursor=5", 12, nil)
	if evs[0]["kind"] != "#info" || evs[0]["name"] != "OutdatedCursor" {
		t.Errorf("first event %v, want #info OutdatedCursor", evs[0])
	}
	if evs[1]["seq"] != "10" || evs[11]["seq"] != "20" {
		t.Errorf("window replay from %v to %v, want 10..20", evs[1]["seq"], evs[11]["seq"])
	}
	// In the window: replay from the cursor inclusive, then live. The
	// first subscription must have ended (its client is gone), or it
	// could take the live event.
	for deadline := time.Now().Add(5 * time.Second); h.fake.log.waiting.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first subscription did not end after its client left")
		}
	}
	evs = read("/v1/events:subscribe?cursor=18", 4, func() {
		h.fake.log.live <- h.fake.log.event(21)
	})
	var seqs []string
	for _, e := range evs {
		seqs = append(seqs, e["seq"].(string))
	}
	if strings.Join(seqs, ",") != "18,19,20,21" {
		t.Errorf("seqs %v, want 18,19,20 then live 21", seqs)
	}
}

// TestRESTChunkedJSONBodyTooLarge: a JSON body without Content-Length
// (chunked) above MaxJSONBodyBytes answers 413 TOO_LARGE like one that
// declares its length (docs/security.md), not 400 "request body too large".
func TestRESTChunkedJSONBodyTooLarge(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.MaxJSONBodyBytes = 4096 })
	big := `{"content":"` + strings.Repeat("A", 8192) + `"}`
	// io.MultiReader hides the length: net/http sends it chunked.
	code, _, b := h.do("POST", "/v1/documents", io.MultiReader(strings.NewReader(big)), "Content-Type", "application/json")
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked %d-byte body: HTTP %d, want 413: %s", len(big), code, b)
	}
	st := decodeStatus(t, b)
	if st.Code != 3 || st.reason() != "TOO_LARGE" || !strings.Contains(st.Message, "4096-byte limit") {
		t.Errorf("status %+v, want code 3, reason TOO_LARGE and the limit in the message", st)
	}
	// A chunked body under the limit still goes through.
	small := `{"content":"aGVsbG8=","contentType":"text/plain"}`
	if code, _, b := h.do("POST", "/v1/documents", io.MultiReader(strings.NewReader(small)), "Content-Type", "application/json"); code != 200 {
		t.Errorf("chunked small body: HTTP %d: %s", code, b)
	}
}
