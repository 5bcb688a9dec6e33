package gateway_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestRESTStrictJSON: misspelled fields and unknown enum values in a JSON
// body are 400 naming the JSON field path and what is allowed, instead of
// being dropped (issue 12).
func TestRESTStrictJSON(t *testing.T) {
	h := start(t, nil)
	cases := []struct {
		name, body string
		want       []string
	}{
		{"top-level typo", `{"content":"aGk=","contentTyp":"text/plain"}`,
			[]string{`unknown field "contentTyp"`, `did you mean "contentType"`, "displayName"}},
		{"nested message typo", `{"content":"aGk=","spilt":{"processor":"textstats"}}`,
			[]string{`unknown field "spilt"`, `did you mean "split"`}},
		{"field inside split", `{"content":"aGk=","split":{"chunkByte":10}}`,
			[]string{`unknown field "split.chunkByte"`, `did you mean "split.chunkBytes"`, "strategy, chunkBytes, maxDepth, processor"}},
		{"unknown enum", `{"content":"aGk=","split":{"strategy":"SPLIT_LINEZ"}}`,
			[]string{`field split.strategy: unknown value "SPLIT_LINEZ"`, "SPLIT_NONE, SPLIT_FIXED_BYTES, SPLIT_LINES, SPLIT_PARAGRAPHS"}},
		{"nested enum", `{"content":"aGk=","completionPolicy":{"mode":"STRICTLY"}}`,
			[]string{`field completionPolicy.mode: unknown value "STRICTLY"`, "STRICT, LENIENT"}},
		{"type mismatch", `{"content":"aGk=","split":{"chunkBytes":"many"}}`,
			[]string{"chunkBytes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, body := h.do(http.MethodPost, "/v1/documents", strings.NewReader(c.body), "Content-Type", "application/json")
			if code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400; body %s", code, body)
			}
			st := decodeStatus(t, body)
			for _, w := range c.want {
				if !strings.Contains(st.Message, w) {
					t.Errorf("message %q lacks %q", st.Message, w)
				}
			}
			if strings.Contains(st.Message, "content_type") || strings.Contains(st.Message, "chunk_bytes") {
				t.Errorf("message %q names a field in snake_case", st.Message)
			}
		})
	}
	// Both spellings of a known field still work.
	for _, body := range []string{
		`{"content":"aGk=","contentType":"text/plain","split":{"strategy":"SPLIT_LINES"}}`,
		`{"content":"aGk=","content_type":"text/plain"}`,
	} {
		if code, _, b := h.do(http.MethodPost, "/v1/documents", strings.NewReader(body)); code != http.StatusOK {
			t.Errorf("%s: status %d %s", body, code, b)
		}
	}
}

// TestRESTStrictQuery: unknown query parameters and bad values are 400
// naming the parameter in camelCase.
func TestRESTStrictQuery(t *testing.T) {
	h := start(t, nil)
	cases := []struct {
		path string
		want []string
	}{
		{"/v1/documents?pagesize=10", []string{`unknown query parameter "pagesize"`, `did you mean "pageSize"`, "pageToken"}},
		{"/v1/documents?pageSize=ten", []string{`query parameter pageSize="ten": want an integer`}},
		{"/v1/documents?page_size=ten", []string{`query parameter pageSize="ten"`}},
		{"/v1/documents?pageSize=-1", []string{"pageSize must be"}},
		{"/v1/events:window?foo=1", []string{`takes no query parameters`}},
	}
	for _, c := range cases {
		code, _, body := h.do(http.MethodGet, c.path, nil)
		if code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400; %s", c.path, code, body)
			continue
		}
		st := decodeStatus(t, body)
		for _, w := range c.want {
			if !strings.Contains(st.Message, w) {
				t.Errorf("%s: message %q lacks %q", c.path, st.Message, w)
			}
		}
		if strings.Contains(st.Message, "page_size") {
			t.Errorf("%s: message %q names page_size", c.path, st.Message)
		}
	}
	for _, p := range []string{"/v1/documents?pageSize=10", "/v1/documents?page_size=10&pageToken="} {
		if code, _, b := h.do(http.MethodGet, p, nil); code != http.StatusOK {
			t.Errorf("%s: status %d %s", p, code, b)
		}
	}
}

// TestRESTMethodNotAllowed: a wrong method on a known path is 405 with
// Allow; an unknown path stays 404.
func TestRESTMethodNotAllowed(t *testing.T) {
	h := start(t, nil)
	cases := []struct{ method, path, allow string }{
		{http.MethodDelete, "/v1/documents", "GET, OPTIONS, POST"},
		{http.MethodPost, "/v1/documents/abc", "GET, OPTIONS"},
		{http.MethodDelete, "/v1/documents/abc:cancel", "GET, OPTIONS, POST"}, // GET: the id "abc:cancel"
		{http.MethodPut, "/v1/events:window", "GET, OPTIONS"},
		{http.MethodGet, "/v1/events:ticket", "OPTIONS, POST"},
	}
	for _, c := range cases {
		code, hdr, body := h.do(c.method, c.path, nil)
		if code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: status %d, want 405; %s", c.method, c.path, code, body)
			continue
		}
		if got := hdr.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
		if st := decodeStatus(t, body); !strings.Contains(st.Message, "not allowed") {
			t.Errorf("%s %s: message %q", c.method, c.path, st.Message)
		}
	}
	// A form-encoded POST to a GET route is not turned into the GET.
	code, _, _ := h.do(http.MethodPost, "/v1/events:window", strings.NewReader("a=b"), "Content-Type", "application/x-www-form-urlencoded")
	if code != http.StatusMethodNotAllowed {
		t.Errorf("form POST to a GET route: status %d, want 405", code)
	}
	code, hdr, body := h.do(http.MethodGet, "/v1/nothing", nil)
	if code != http.StatusNotFound || hdr.Get("Allow") != "" || !strings.Contains(decodeStatus(t, body).Message, "/v1/nothing") {
		t.Errorf("unknown path: %d Allow=%q %s", code, hdr.Get("Allow"), body)
	}
}

// TestRESTIndexAndHeaders: GET / leads to the console and the docs; no
// gRPC metadata leaks into REST responses as Grpc-Metadata-* headers.
func TestRESTIndexAndHeaders(t *testing.T) {
	h := start(t, nil)
	code, hdr, body := h.do(http.MethodGet, "/", nil)
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /: %d %s", code, hdr.Get("Content-Type"))
	}
	for _, l := range []string{`"/ui/"`, `"/docs/"`, `"/openapi.json"`, `"/healthz"`} {
		if !strings.Contains(string(body), l) {
			t.Errorf("index %s lacks %s", body, l)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, h.base+"/", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	resp, err := (&http.Transport{}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("browser GET /: %d Location %q, want 302 /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}

	code, hdr, body = h.do(http.MethodPost, "/v1/documents", strings.NewReader(`{"content":"aGk="}`), "X-Request-Id", "rid-1", "TE", "trailers")
	if code != http.StatusOK {
		t.Fatalf("submit: %d %s", code, body)
	}
	for k := range hdr {
		if strings.HasPrefix(strings.ToLower(k), "grpc-") {
			t.Errorf("REST response carries %s: %v", k, hdr[k])
		}
	}
	if hdr.Get("X-Request-Id") != "rid-1" {
		t.Errorf("X-Request-Id %q, want rid-1", hdr.Get("X-Request-Id"))
	}
}
