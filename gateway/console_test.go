package gateway_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestConsoleServed: /ui/ serves the embedded console with a strict CSP,
// /ui redirects, module scripts have a JavaScript type, and every relative
// import of every module resolves to a served file (a missing or renamed
// module would break the page only at run time).
func TestConsoleServed(t *testing.T) {
	h := start(t, nil)
	code, hdr, body := h.do("GET", "/ui/", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `src="js/app.js"`) {
		t.Fatalf("GET /ui/: HTTP %d %.200s, want the console's index.html", code, body)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
		!strings.Contains(csp, "connect-src 'self' ws://"+h.srv.HTTPAddr()+" wss://"+h.srv.HTTPAddr()+";") {
		t.Errorf("Content-Security-Policy %q, want self-only scripts and connections (WebSocket to this host), no framing", csp)
	}
	noRedirect := *h.http
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Get(h.base + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: HTTP %d to %q, want 301 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if code, _, _ := h.do("POST", "/ui/", nil); code == http.StatusOK {
		t.Error("POST /ui/ answered 200; the console is GET only")
	}

	imports := regexp.MustCompile(`(?m)^import .* from '\./([a-z]+\.js)';`)
	seen := map[string]bool{}
	queue := []string{"app.js"}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		code, hdr, src := h.do("GET", "/ui/js/"+name, nil)
		if code != http.StatusOK {
			t.Errorf("GET /ui/js/%s: HTTP %d (imported by another module)", name, code)
			continue
		}
		if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
			t.Errorf("/ui/js/%s has Content-Type %q; module scripts need text/javascript", name, ct)
		}
		for _, m := range imports.FindAllStringSubmatch(string(src), -1) {
			queue = append(queue, m[1])
		}
	}
	if len(seen) < 8 {
		t.Errorf("followed %d modules from app.js, want the whole console (documents, document, tree, events, peers, api, cbor, util, metrics)", len(seen))
	}
	for _, f := range []string{"style.css", "favicon.svg"} {
		if code, _, _ := h.do("GET", "/ui/"+f, nil); code != http.StatusOK {
			t.Errorf("GET /ui/%s: HTTP %d", f, code)
		}
	}
}

// TestConsoleCSPHost: a Host that is not a plain host[:port] stays out of
// the console's Content-Security-Policy.
func TestConsoleCSPHost(t *testing.T) {
	h := start(t, nil)
	req, err := http.NewRequest("GET", h.base+"/ui/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "evil.example;script-src'unsafe-inline'"
	hostile, err := h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hostile.Body.Close()
	if csp := hostile.Header.Get("Content-Security-Policy"); strings.Contains(csp, "evil") || !strings.Contains(csp, "connect-src 'self';") {
		t.Errorf("Content-Security-Policy with a hostile Host: %q", csp)
	}
}
