package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOperationsEndpoints: /healthz, /metrics (Prometheus text),
// /openapi.json (valid JSON with the API's paths).
func TestOperationsEndpoints(t *testing.T) {
	g := shared(t)
	// Make sure some traffic was counted.
	submitREST(t, g, map[string]any{"content": b64([]byte("metrics")), "contentType": "text/plain"})

	h := curl(t, "GET", g.baseURL()+"/healthz", nil)
	if h.status != 200 || !strings.Contains(string(h.body), "SERVING") {
		t.Errorf("/healthz: %s, want 200 SERVING", h)
	}

	m := curl(t, "GET", g.baseURL()+"/metrics", nil)
	wantOK(t, "/metrics", m)
	if !strings.Contains(m.headers, "text/plain") {
		t.Errorf("/metrics Content-Type is not Prometheus text:\n%s", m.headers)
	}
	metrics := string(m.body)
	for _, want := range []string{"# HELP ", "# TYPE ", "go_goroutines ", "process_resident_memory_bytes "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Every sample line is `name{labels} value`: a cheap parse of the
	// exposition format.
	var gatewayMetrics int
	for _, line := range strings.Split(metrics, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i > 0 {
			name = line[:i]
		}
		if strings.Count(line, " ") < 1 || name == "" {
			t.Errorf("/metrics: malformed sample line %q", line)
		}
		if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "promhttp_") {
			gatewayMetrics++
		}
	}
	if gatewayMetrics == 0 {
		t.Errorf("/metrics has only Go runtime and process metrics, none of the gateway's own")
	}

	o := curl(t, "GET", g.baseURL()+"/openapi.json", nil)
	wantOK(t, "/openapi.json", o)
	var spec struct {
		Swagger string                                `json:"swagger"`
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(o.body, &spec); err != nil {
		t.Fatalf("/openapi.json is not valid JSON: %v", err)
	}
	if spec.Swagger == "" && spec.OpenAPI == "" {
		t.Errorf("/openapi.json has neither a swagger nor an openapi version")
	}
	for path, method := range map[string]string{
		"/v1/documents": "post", "/v1/documents:upload": "post", "/v1/documents/{id}": "get",
		"/v1/documents/{id}/result": "get", "/v1/claims/{claimId}:redeem": "post",
		"/v1/events:subscribe": "get", "/v1/events:window": "get",
	} {
		if _, ok := spec.Paths[path][method]; !ok {
			t.Errorf("/openapi.json has no %s %s", strings.ToUpper(method), path)
		}
	}
}

// TestDocsRenderInChromium loads /docs/ in headless Chromium and checks
// that the rendered DOM (after the Swagger UI script ran) lists the API's
// operations.
func TestDocsRenderInChromium(t *testing.T) {
	chromium := need(t, toolChromium)
	g := shared(t)
	profile := t.TempDir()
	args := chromiumArgs(profile, g.baseURL()+"/docs/")
	out, errb, code := run(t, 90*time.Second, nil, chromium, args...)
	if code != 0 {
		t.Fatalf("%s %s: exit %d\n%s", chromium, strings.Join(args, " "), code, tailString(string(errb), 30))
	}
	dom := string(out)
	if err := os.WriteFile(filepath.Join(t.TempDir(), "dom.html"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`data-path="/v1/documents"`, `data-path="/v1/documents:upload"`, `data-path="/v1/claims/{claimId}:redeem"`,
		"DocumentService_SubmitDocument", "DocumentService_UploadDocument",
		"Submit a document with inline content", "Upload a document as a raw byte stream",
		"EventService_SubscribeEvents",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered /docs/ DOM lacks %q (Swagger UI did not render the spec?); DOM is %d bytes:\n%s", want, len(dom), tailString(dom, 20))
		}
	}
}

// chromiumArgs is the headless invocation that works in containers (no
// sandbox, no GPU, no network side traffic, a throwaway profile) and dumps
// the DOM after up to 10 s of virtual time.
func chromiumArgs(profile, url string) []string {
	return []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + profile, "--virtual-time-budget=10000", "--dump-dom", url,
	}
}

func tailString(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
