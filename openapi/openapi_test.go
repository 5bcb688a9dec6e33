package openapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pipestream/gateway/openapi"
)

func get(t *testing.T, srv *httptest.Server, path string) (*http.Response, []byte) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return resp, body
}

func newServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(openapi.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// TestSpecPaths checks the served spec is Swagger 2.0 JSON with every path
// and method of docs/architecture.md, "Public API".
func TestSpecPaths(t *testing.T) {
	srv := newServer(t)
	resp, body := get(t, srv, "/openapi.json")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /openapi.json: status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var spec struct {
		Swagger string                                `json:"swagger"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(body, &spec); err != nil {
		t.Fatalf("spec is not valid JSON: %v", err)
	}
	if spec.Swagger != "2.0" {
		t.Errorf("swagger = %q, want 2.0", spec.Swagger)
	}
	want := map[string][]string{
		"/v1/documents":               {"post", "get"},
		"/v1/documents:upload":        {"post"},
		"/v1/documents/{id}":          {"get"},
		"/v1/documents/{id}:watch":    {"get"},
		"/v1/documents/{id}/result":   {"get"},
		"/v1/documents/{id}:cancel":   {"post"},
		"/v1/claims/{claimId}":        {"get"},
		"/v1/claims/{claimId}:redeem": {"post"},
		"/v1/events:subscribe":        {"get"},
		"/v1/events/ws":               {"get"},
		"/v1/events:window":           {"get"},
		"/v1/events:snapshot":         {"get"},
		"/v1/events:streamSnapshot":   {"get"},
		"/healthz":                    {"get"},
		"/metrics":                    {"get"},
		"/openapi.json":               {"get"},
		"/docs/":                      {"get"},
	}
	for path, methods := range want {
		for _, m := range methods {
			if _, ok := spec.Paths[path][m]; !ok {
				t.Errorf("spec lacks %s %s", strings.ToUpper(m), path)
			}
		}
	}
}

// TestSpecREST checks the post-processed operations: raw upload body with
// query options, NDJSON streams, raw result bytes, and a description on
// every operation.
// specOp is what TestSpecREST reads of an operation.
type specOp struct {
	Summary     string   `json:"summary"`
	Description string   `json:"description"`
	Consumes    []string `json:"consumes"`
	Produces    []string `json:"produces"`
	Stream      string   `json:"x-stream"`
	Parameters  []struct {
		Name string `json:"name"`
		In   string `json:"in"`
	} `json:"parameters"`
}

// checkSnapshotForms: StreamSnapshot declares its three forms, the JSON
// page first (generated clients read it), with pageSize and pageToken.
func checkSnapshotForms(t *testing.T, o specOp) {
	t.Helper()
	if o.Stream != "ndjson,sse" || strings.Join(o.Produces, ",") != "application/json,application/x-ndjson,text/event-stream" {
		t.Errorf("streamSnapshot: x-stream %q produces %v, want the JSON page first (generated clients read it), then NDJSON and Server-Sent Events", o.Stream, o.Produces)
	}
	params := map[string]string{}
	for _, prm := range o.Parameters {
		params[prm.Name] = prm.In
	}
	if params["pageSize"] != "query" || params["pageToken"] != "query" {
		t.Errorf("streamSnapshot: parameters %v, want pageSize and pageToken (page form)", params)
	}
}

func TestSpecREST(t *testing.T) {
	var spec struct {
		Paths map[string]map[string]specOp `json:"paths"`
	}
	if err := json.Unmarshal(openapi.Spec(), &spec); err != nil {
		t.Fatal(err)
	}
	for path, ops := range spec.Paths {
		for m, op := range ops {
			if op.Summary == "" || op.Description == "" {
				t.Errorf("%s %s: missing summary or description", m, path)
			}
		}
	}
	up := spec.Paths["/v1/documents:upload"]["post"]
	if len(up.Consumes) != 1 || up.Consumes[0] != "application/octet-stream" {
		t.Errorf("upload consumes %v, want [application/octet-stream]", up.Consumes)
	}
	params := map[string]string{}
	for _, p := range up.Parameters {
		params[p.Name] = p.In
	}
	for _, q := range []string{"contentType", "requestId", "displayName", "split.strategy", "split.chunkBytes",
		"split.maxDepth", "split.processor", "completionPolicy.mode", "completionPolicy.onFailure"} {
		if params[q] != "query" {
			t.Errorf("upload: query parameter %s missing (have %v)", q, params)
		}
	}
	if params["body"] != "body" {
		t.Errorf("upload: raw body parameter missing")
	}
	checkSnapshotForms(t, spec.Paths["/v1/events:streamSnapshot"]["get"])
	for _, p := range []string{"/v1/documents/{id}:watch", "/v1/events:subscribe"} {
		o := spec.Paths[p]["get"]
		if o.Stream != "ndjson,sse" || strings.Join(o.Produces, ",") != "application/json,application/x-ndjson,text/event-stream" {
			t.Errorf("%s: x-stream %q produces %v, want the JSON page first (generated clients read it), then NDJSON and Server-Sent Events", p, o.Stream, o.Produces)
		}
		params := map[string]string{}
		for _, prm := range o.Parameters {
			params[prm.Name] = prm.In
		}
		if params["waitSeconds"] != "query" || params["pageSize"] != "query" || params["Last-Event-ID"] != "header" {
			t.Errorf("%s: parameters %v, want waitSeconds and pageSize (page) and the Last-Event-ID header (SSE)", p, params)
		}
	}
	if got := strings.Join(spec.Paths["/v1/documents/{id}/result"]["get"].Produces, ","); got != "application/octet-stream,application/json,text/plain" {
		t.Errorf("result produces %s, want application/octet-stream (on request), application/json (textstats), text/plain (sentences)", got)
	}
	if got := strings.Join(spec.Paths["/v1/events/ws"]["get"].Produces, ","); got != "application/cbor,application/json" {
		t.Errorf("WebSocket produces %s, want CBOR frames and JSON pre-upgrade errors", got)
	}
}

// TestSpecNullable: fields that may be null or absent in responses are
// x-nullable (timestamps not yet set, message fields); enums and scalars
// are not.
func TestSpecNullable(t *testing.T) {
	var spec struct {
		Definitions map[string]struct {
			Properties map[string]map[string]any `json:"properties"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal(openapi.Spec(), &spec); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		def, field string
		nullable   bool
	}{
		{"Document", "finishTime", true}, {"Document", "createTime", true}, {"Document", "split", true},
		{"Document", "entityCounts", true}, {"ClaimCheck", "redeemTime", true}, {"Event", "time", true},
		{"WatchDocumentResponse", "event", true}, {"WatchDocumentResponse", "document", true},
		{"Document", "state", false}, {"Document", "id", false}, {"Document", "resultSizeBytes", false},
	} {
		p := spec.Definitions[tc.def].Properties[tc.field]
		if p == nil {
			t.Errorf("%s.%s missing from the spec", tc.def, tc.field)
			continue
		}
		if got := p["x-nullable"] == true; got != tc.nullable {
			t.Errorf("%s.%s: x-nullable %v, want %v", tc.def, tc.field, got, tc.nullable)
		}
	}
}

// TestDocs checks the docs page and every asset it references load from the
// embedded files, and that the page references nothing off-site.
func TestDocs(t *testing.T) {
	srv := newServer(t)
	resp, page := get(t, srv, "/docs/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /docs/: status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("GET /docs/: Content-Type %q", ct)
	}
	html := string(page)
	if strings.Contains(html, "http://") || strings.Contains(html, "https://") {
		t.Errorf("docs page references an absolute URL (no CDN allowed):\n%s", html)
	}
	assets := map[string]string{
		"swagger-ui-bundle.js": "javascript",
		"swagger-ui.css":       "text/css",
		"init.js":              "javascript",
		"favicon-32x32.png":    "image/png",
	}
	for name, ctype := range assets {
		if !strings.Contains(html, "./"+name) {
			t.Errorf("docs page does not load %s", name)
		}
		resp, body := get(t, srv, "/docs/"+name)
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Errorf("GET /docs/%s: status %d, %d bytes", name, resp.StatusCode, len(body))
		}
		if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, ctype) {
			t.Errorf("GET /docs/%s: Content-Type %q, want %s", name, ct, ctype)
		}
	}
	_, init := get(t, srv, "/docs/init.js")
	if !strings.Contains(string(init), `"../openapi.json"`) {
		t.Errorf("init.js does not load ../openapi.json")
	}
}

func TestRoutingAndMethods(t *testing.T) {
	srv := newServer(t)
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Get(srv.URL + "/docs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/docs/" {
		t.Errorf("GET /docs: %d Location %q, want 301 /docs/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := get(t, srv, "/docs/nope.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /docs/nope.js: status %d, want 404", resp.StatusCode)
	}
	if resp, _ := get(t, srv, "/elsewhere"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /elsewhere: status %d, want 404", resp.StatusCode)
	}
	resp, err = client.Post(srv.URL+"/openapi.json", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /openapi.json: status %d, want 405", resp.StatusCode)
	}
}

func TestSpecIsACopy(t *testing.T) {
	a := openapi.Spec()
	a[0] = 'X'
	if openapi.Spec()[0] == 'X' {
		t.Fatal("Spec returned the embedded slice, not a copy")
	}
}
