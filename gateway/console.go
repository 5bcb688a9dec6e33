package gateway

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// The web console (docs/console.md): plain HTML, CSS and JavaScript
// modules in console/, embedded in the binary and served as they are (no
// bundler, no CDN, no build step). It talks to the same public API as any
// client, with the user's bearer token (or none in loopback mode), and to
// the WebSocket event stream through a ticket (ticket.go).
//
//go:embed console
var consoleFS embed.FS

// consoleCSP allows the console's own scripts, styles and images, API and
// WebSocket calls to this origin, and blob: URLs for result downloads;
// nothing else (no inline script, no framing). connect-src names the
// WebSocket origin too: browsers that predate CSP level 3 do not let
// 'self' match ws: and wss:.
func consoleCSP(host string) string {
	connect := "'self'"
	if validHost(host) {
		connect += " ws://" + host + " wss://" + host
	}
	return "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
		"connect-src " + connect + "; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
}

// validHost reports whether host (the request's Host) is a plain host[:port]
// that can go into a CSP source expression as it is.
func validHost(host string) bool {
	if host == "" || len(host) > 255 {
		return false
	}
	for _, c := range host {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-:[]", c)
		if !ok {
			return false
		}
	}
	return true
}

// consoleHandler serves GET and HEAD /ui/* from the embedded files and
// redirects /ui to /ui/.
func consoleHandler() http.Handler {
	sub, err := fs.Sub(consoleFS, "console")
	if err != nil {
		panic("gateway: embedded console directory missing: " + err.Error()) // build-time invariant
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui" {
			http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", consoleCSP(r.Host))
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
