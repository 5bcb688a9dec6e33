package gateway

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/coder/websocket"
	"github.com/rs/cors"
	"google.golang.org/grpc/codes"
)

// Browser protections (docs/security.md, "Browsers").
//
// CORS: Config.CORSOrigins (--cors-origins) lists the web origins whose
// pages may call the REST API and open the WebSocket; their preflights
// are answered (rs/cors) and their WebSocket handshakes accepted. With
// none, no CORS headers are sent and only same-origin pages get through.
//
// Without tokens (NoAuth on loopback, the default) anything that can make
// the user's browser send a request could use the API, so:
//   - the Host of an API request (/v1/...) must be a loopback name
//     (localhost, 127.0.0.1, [::1]) or the configured listen host, else
//     421: a DNS-rebinding page (its own name resolving to 127.0.0.1)
//     cannot read anything. The routes open without a token anyway
//     (/healthz, /metrics, /docs/, /openapi.json, the console's static
//     files) hold no document data and answer any Host;
//   - a write (any method but GET, HEAD, OPTIONS) sent by a browser
//     (Origin, or Sec-Fetch-Site: cross-site) must come from the same
//     origin or a --cors-origins one, else 403; and a JSON route refuses a
//     browser write whose Content-Type is one a cross-site form or
//     no-cors fetch may send (text/plain, form types) with 415. Requests
//     without Origin (curl, scripts, gRPC clients) are not browsers'
//     cross-site requests and pass.

// corsHeaders are the request headers a cross-origin page may send.
var corsHeaders = []string{"Authorization", "Content-Type", "X-Request-Id", "X-Client-Id"}

// corsExposed are the response headers a cross-origin page may read.
var corsExposed = []string{"X-Request-Id", "Retry-After", "WWW-Authenticate", "Content-Disposition"}

// checkCORSOrigins validates --cors-origins: each an origin
// scheme://host[:port] (http or https), no path, no wildcard.
func checkCORSOrigins(origins []string) error {
	for _, o := range origins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil || strings.ContainsAny(o, "*?[]") {
			return fmt.Errorf("gateway: --cors-origins: %q is not an origin: give scheme://host[:port], e.g. https://app.example.com or http://localhost:3000", o)
		}
	}
	return nil
}

// normalizeOrigins strips a trailing slash and lowercases the origins.
func normalizeOrigins(origins []string) []string {
	out := make([]string, 0, len(origins))
	for _, o := range origins {
		if o = strings.TrimSpace(o); o != "" {
			out = append(out, strings.ToLower(strings.TrimSuffix(o, "/")))
		}
	}
	return out
}

// browserGuard wraps h with the CORS handler (when origins are
// configured) and, without tokens on loopback, the Host and cross-site
// write checks; non-preflight OPTIONS requests get 204 with Allow.
func (s *Server) browserGuard(routes []route, h http.Handler) http.Handler {
	next := h
	if s.localOnly() {
		next = s.refuseForeign(h)
	}
	next = answerOptions(routes, next)
	if len(s.cfg.CORSOrigins) > 0 {
		next = cors.New(cors.Options{
			AllowedOrigins:   s.cfg.CORSOrigins,
			AllowedMethods:   []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete},
			AllowedHeaders:   corsHeaders,
			ExposedHeaders:   corsExposed,
			MaxAge:           600,
			AllowCredentials: false, // bearer tokens, not cookies
		}).Handler(next)
	}
	if !s.localOnly() {
		return next
	}
	return s.checkHost(next)
}

// localOnly: the no-token loopback mode, where the browser checks apply.
func (s *Server) localOnly() bool {
	return isNoAuth(s.cfg.Authenticator) && !s.cfg.AllowInsecureNoAuth
}

// answerOptions answers OPTIONS (not a CORS preflight, which the CORS
// handler answered) with 204 and the path's Allow, or passes it on.
func answerOptions(routes []route, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			if allowed := allowedMethods(routes, r.URL.Path); len(allowed) > 0 {
				w.Header().Set("Allow", strings.Join(allowed, ", "))
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// checkHost answers 421 to an API request whose Host is not a loopback
// name or the listen host (DNS rebinding).
func (s *Server) checkHost(h http.Handler) http.Handler {
	listenHost := ""
	if host, _, err := net.SplitHostPort(s.cfg.HTTPAddr); err == nil {
		listenHost = strings.ToLower(strings.Trim(host, "[]"))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") || loopbackHost(r.Host, listenHost) {
			h.ServeHTTP(w, r)
			return
		}
		s.metrics.rejected.WithLabelValues("host").Inc()
		s.writeStatus(w, r, http.StatusMisdirectedRequest, statusError(codes.PermissionDenied, ReasonForeignHost, fmt.Sprintf(
			"Host %s is not a loopback name: without --auth-tokens the gateway answers only requests addressed to localhost, 127.0.0.1 or [::1] "+
				"(DNS rebinding protection); open http://127.0.0.1:<port>/ instead, or configure --auth-tokens", quoteForMessage(r.Host))))
	})
}

// loopbackHost reports whether a Host header names this machine's
// loopback (or the listen host); an empty Host (HTTP/1.0) passes.
func loopbackHost(hostport, listenHost string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	switch host {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return listenHost != "" && host == listenHost
}

// refuseForeign refuses cross-site browser writes (see above).
func (s *Server) refuseForeign(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if safeMethod(r.Method) {
			h.ServeHTTP(w, r)
			return
		}
		origin := r.Header.Get("Origin")
		browser := origin != "" || r.Header.Get("Sec-Fetch-Site") != ""
		if browser && !s.sameOrAllowedOrigin(r) {
			s.metrics.rejected.WithLabelValues("cross_site").Inc()
			s.writeStatus(w, r, http.StatusForbidden, statusError(codes.PermissionDenied, ReasonCrossSite, fmt.Sprintf(
				"cross-site request refused: a page from Origin %s may not write to this gateway (it has no --auth-tokens); "+
					"serve the page from an origin listed in --cors-origins, or configure --auth-tokens", quoteForMessage(originOrSite(r)))))
			return
		}
		if browser && r.URL.Path != "/v1/documents:upload" && simpleContentType(r.Header.Get("Content-Type")) {
			s.metrics.rejected.WithLabelValues("cross_site").Inc()
			s.writeStatus(w, r, http.StatusUnsupportedMediaType, statusError(codes.InvalidArgument, ReasonCrossSite, fmt.Sprintf(
				"Content-Type %s is not accepted from a browser on a JSON route (a cross-site form could send it): send Content-Type: application/json",
				quoteForMessage(r.Header.Get("Content-Type")))))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

func originOrSite(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		return o
	}
	return "(none; Sec-Fetch-Site: " + r.Header.Get("Sec-Fetch-Site") + ")"
}

// sameOrAllowedOrigin: the request's Origin is this gateway's own (its
// host:port is the Host) or a --cors-origins one; without Origin, the
// browser's Sec-Fetch-Site says same-origin or none (typed by the user).
func (s *Server) sameOrAllowedOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		site := r.Header.Get("Sec-Fetch-Site")
		return site == "same-origin" || site == "none"
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null" (sandboxed frames, file://) included
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	o := strings.ToLower(u.Scheme + "://" + u.Host)
	for _, a := range s.cfg.CORSOrigins {
		if a == o {
			return true
		}
	}
	return false
}

// simpleContentType reports whether ct is a CORS-safelisted request
// content type (a cross-site form or no-cors fetch can send it without a
// preflight). A missing one does not count: a body-less write (the
// console's) has none, and cross-site ones are refused by origin.
func simpleContentType(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return true
	}
	switch mt {
	case "text/plain", "application/x-www-form-urlencoded", "multipart/form-data":
		return true
	}
	return false
}

// wsAcceptOptions lets the WebSocket handshake accept the --cors-origins
// pages besides same-origin ones (coder/websocket's default).
func (s *Server) wsAcceptOptions() *websocket.AcceptOptions {
	if len(s.cfg.CORSOrigins) == 0 {
		return nil
	}
	return &websocket.AcceptOptions{OriginPatterns: s.cfg.CORSOrigins}
}

// wsOriginAllowed is the Origin rule of the WebSocket handshake
// (websocket.Accept with wsAcceptOptions): no Origin (not a browser),
// this gateway's own host, or a --cors-origins origin. withTickets checks
// it before it spends a ticket.
func (s *Server) wsOriginAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	return slices.Contains(s.cfg.CORSOrigins, strings.ToLower(u.Scheme+"://"+u.Host))
}

// ErrorInfo reasons of the browser protections.
const (
	ReasonForeignHost = "FOREIGN_HOST"
	ReasonCrossSite   = "CROSS_SITE_REQUEST"
)
