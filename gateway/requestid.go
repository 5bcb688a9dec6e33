package gateway

import "net/http"

// withRequestID gives every HTTP request one request id before any other
// handler runs: the client's X-Request-Id when it is acceptable
// (validRequestID), else a new one. It is set on the request, so the REST
// proxy forwards it to the gRPC call as x-request-id metadata (the gRPC
// interceptors, logs and trailers then use the same id), and on the
// response, so every answer carries it: errors, downloads, the WebSocket
// upgrade, /healthz, the console and the spec alike.
func withRequestID(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rid := ""
		for _, v := range r.Header.Values("X-Request-Id") {
			if validRequestID(v) {
				rid = v
				break
			}
		}
		if rid == "" {
			rid = newRequestID()
		}
		r.Header.Set("X-Request-Id", rid)
		w.Header().Set("X-Request-Id", rid)
		h.ServeHTTP(w, r)
	})
}

// httpRequestID is the request id withRequestID gave r, for logs.
func httpRequestID(r *http.Request) string { return r.Header.Get("X-Request-Id") }
