package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// httpHandler builds the HTTP routes:
//
//	POST /v1/documents:upload   raw body streamed into UploadDocument (upload_http.go)
//	GET  /v1/documents/{id}/result  GetDocumentResult stream as the raw body (result_http.go)
//	GET  /v1/events/ws          WebSocket event stream, AT sync CBOR frames (websocket.go); ?ticket= (ticket.go)
//	POST /v1/events:ticket      single-use WebSocket ticket for browsers (ticket.go)
//	GET  /ui/                   the web console (console.go)
//	GET  /healthz               200 when ready, 503 + reason otherwise
//	GET  /metrics               Prometheus
//	/openapi.json, /docs/       Config.Docs
//	GET  /                      index: browsers to /ui/, others a JSON list of links (routes.go)
//	GET  /v1/documents/{id}:watch, /v1/events:subscribe: NDJSON (grpc-gateway),
//	                            or by Accept Server-Sent Events or a long-polled JSON page (sse.go)
//	everything else             grpc-gateway REST mux over the gRPC client connection
//
// Every write and flush of a response must finish within
// Config.StreamWriteTimeout (writeDeadlines, stuck.go). Every route first
// passes checkUTF8 (utf8.go): a path, query or upload
// Content-Type that is not UTF-8 answers 400, then browserGuard (CORS,
// and without tokens the Host and cross-site write checks; browser.go),
// before authentication, as preflights carry no token. rejectSmuggled answers the
// connection guard's stand-in for a request with both Content-Length and
// Transfer-Encoding (smuggle.go).
func (s *Server) httpHandler() (http.Handler, error) {
	useStrictQueryParser()
	routes := s.restRoutes()
	s.gwMux = s.restMux(routes, withEventCache(restMarshaler(), s.events))
	ctx := context.Background()
	if err := gatewayv1.RegisterDocumentServiceHandlerClient(ctx, s.gwMux, gatewayv1.NewDocumentServiceClient(s.rest)); err != nil {
		return nil, fmt.Errorf("gateway: register REST handlers: %w", err)
	}
	if err := gatewayv1.RegisterEventServiceHandlerClient(ctx, s.gwMux, s.localEvents()); err != nil {
		return nil, fmt.Errorf("gateway: register REST handlers: %w", err)
	}
	if err := s.registerOperationsREST(s.gwMux); err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("POST /v1/documents:upload", withErrorHeaders(http.HandlerFunc(s.handleUpload)))
	mux.Handle("GET /v1/documents/{id}/result", withErrorHeaders(s.refuseStrayQuery(routes, http.HandlerFunc(s.handleResult))))
	tickets := newTicketStore(s.cfg.MaxTicketsPerTenant)
	mux.Handle("POST /v1/events:ticket", s.refuseStrayQuery(routes, s.handleTicket(tickets)))
	mux.HandleFunc("GET /v1/events/ws", s.withTickets(tickets, s.handleEventsWS))
	mux.Handle("GET /ui", consoleHandler())
	mux.Handle("GET /ui/", consoleHandler())
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{ErrorLog: slogPrintln{s}}))
	mux.Handle("/openapi.json", s.cfg.Docs)
	mux.Handle("/docs", s.cfg.Docs)
	mux.Handle("/docs/", s.cfg.Docs)
	mux.HandleFunc("GET /{$}", handleIndex)
	mux.Handle("/", withErrorHeaders(s.refuseStrayQuery(routes, s.snapshotForms(s.streamForms(streamFraming(s.limitBody(s.gwMux)))))))
	return writeDeadlines(withRequestID(s.rejectSmuggled(s.checkUTF8(s.browserGuard(routes, s.admitAPI(mux))))), s.cfg.StreamWriteTimeout), nil
}

// restMux is the grpc-gateway mux of the REST routes, m its marshaler.
func (s *Server) restMux(routes []route, m runtime.Marshaler) *runtime.ServeMux {
	return runtime.NewServeMux(
		runtime.WithIncomingHeaderMatcher(incomingHeader),
		runtime.WithOutgoingHeaderMatcher(outgoingHeader),
		runtime.WithErrorHandler(httpErrorHandler),
		runtime.WithStreamErrorHandler(streamErrorHandler),
		runtime.WithForwardResponseOption(flushStreamHeaders),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, m),
		runtime.WithOutgoingTrailerMatcher(func(string) (string, bool) { return "", false }),
		runtime.WithDisablePathLengthFallback(),
		runtime.WithRoutingErrorHandler(s.routingErrorHandler(routes)),
	)
}

type slogPrintln struct{ s *Server }

func (l slogPrintln) Println(v ...any) { l.s.log.Warn("metrics handler", "error", fmt.Sprint(v...)) }

// incomingHeader forwards Authorization and X-Request-Id as the plain gRPC
// metadata keys the interceptors read; other headers follow grpc-gateway's
// default (Grpc-Metadata-* stripped, permanent headers prefixed).
func incomingHeader(key string) (string, bool) {
	switch textproto.CanonicalMIMEHeaderKey(key) {
	case "Authorization":
		return "authorization", true
	case "X-Request-Id":
		return requestIDHeader, true
	case "X-Client-Id":
		return "x-client-id", true
	case "Grpc-Metadata-" + textproto.CanonicalMIMEHeaderKey(admittedHeader):
		return "", false // preAdmitted: only the server sets it
	}
	return runtime.DefaultHeaderMatcher(key)
}

// outgoingHeader drops all gRPC response metadata (grpc-gateway's default
// would add Grpc-Metadata-Content-Type and the like): withRequestID has
// set X-Request-Id (the gRPC call got the same id), and what a REST
// response needs (Retry-After, WWW-Authenticate) errorHeaders sets
// itself. gRPC trailers are dropped likewise (WithOutgoingTrailerMatcher).
func outgoingHeader(string) (string, bool) {
	return "", false // subscribedHeader among them: see flushStreamHeaders
}

// flushStreamHeaders writes the HTTP status and headers of an NDJSON stream
// (SubscribeEvents, WatchDocument) as soon as the gRPC call sent its
// headers marked with subscribedHeader, i.e. once the subscription started.
// grpc-gateway's ForwardResponseStream would write them only with the first
// message, so an idle subscription looked like a stuck request; it calls
// the forward-response options once with a nil message before it waits for
// the first one, which is where this runs. Calls refused before the start
// (FutureCursor, NotFound) carry no marker and keep their error status.
// The Content-Type is application/x-ndjson (streamFraming, ndjson.go); it
// cannot change after the status line.
func flushStreamHeaders(ctx context.Context, w http.ResponseWriter, m proto.Message) error {
	if m != nil {
		return nil
	}
	if sm, ok := w.(streamMarker); ok {
		sm.markStream() // streamFraming: NDJSON Content-Type, bare Status errors
	}
	md, ok := runtime.ServerMetadataFromContext(ctx)
	if !ok || len(md.HeaderMD.Get(subscribedHeader)) == 0 {
		return nil
	}
	w.Header().Set("Content-Type", ndjsonType)
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush() // a gone client fails the next write
	return nil
}

// httpErrorHandler is grpc-gateway's default (a JSON google.rpc.Status with
// the code's HTTP status) except that TOO_LARGE errors answer 413 (also a
// JSON body cut at the limit, see limitBody) and UPLOAD_STALLED 408; withErrorHeaders adds the headers of errorHeaders.
func httpErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if limit, cut := bodyTooLarge(r); cut {
		err = jsonTooLarge("request body is larger", limit)
	}
	if d, slow := bodyTooSlow(r); slow {
		err = jsonBodyTooSlow(d)
		w.Header().Set("Connection", "close")
	}
	err = shapeHTTPError(err)
	recordError(ctx, err)
	switch errorReason(err) {
	case ReasonTooLarge:
		w = statusOverride{ResponseWriter: w, code: http.StatusRequestEntityTooLarge}
	case ReasonUploadStalled:
		w = statusOverride{ResponseWriter: w, code: http.StatusRequestTimeout}
	case ReasonDiskFull:
		w = statusOverride{ResponseWriter: w, code: http.StatusServiceUnavailable}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// streamErrorHandler is grpc-gateway's default for errors of server
// streams (watch, subscribe), which it writes itself; it records the error
// so that withErrorHeaders can add headers before the status line.
func streamErrorHandler(ctx context.Context, err error) *status.Status {
	err = shapeError(err)
	recordError(ctx, err)
	return runtime.DefaultStreamErrorHandler(ctx, err)
}

// shapeHTTPError is shapeError keeping grpc-gateway's explicit HTTP
// status (runtime.HTTPStatusError: the routing error handler's 405).
func shapeHTTPError(err error) error {
	var he *runtime.HTTPStatusError
	if errors.As(err, &he) {
		return &runtime.HTTPStatusError{HTTPStatus: he.HTTPStatus, Err: shapeError(he.Err)}
	}
	return shapeError(err)
}

// errorHeaders sets the HTTP headers an error calls for: WWW-Authenticate
// on 401 (RFC 6750 section 3; grpc-gateway would put the message there)
// and Retry-After when the status carries a RetryInfo (rate and
// concurrency limits: 429).
func errorHeaders(h http.Header, err error) {
	if status.Code(err) == codes.Unauthenticated {
		if errorReason(err) == ReasonInvalidToken {
			h.Set("WWW-Authenticate", `Bearer realm="pipestream", error="invalid_token"`)
		} else {
			h.Set("WWW-Authenticate", `Bearer realm="pipestream"`)
		}
	}
	if d, ok := retryDelay(err); ok {
		h.Set("Retry-After", retryAfterSeconds(d))
	}
}

// errorSlot carries the error of one REST request from grpc-gateway's error
// handlers to the response writer of withErrorHeaders.
type errorSlot struct {
	mu  sync.Mutex
	err error
}

type errorSlotKey struct{}

func recordError(ctx context.Context, err error) {
	if slot, ok := ctx.Value(errorSlotKey{}).(*errorSlot); ok {
		slot.mu.Lock()
		slot.err = err
		slot.mu.Unlock()
	}
}

// withErrorHeaders lets the error handlers' recorded error set response
// headers (errorHeaders) just before the status line is written.
func withErrorHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slot := &errorSlot{}
		r = r.WithContext(context.WithValue(r.Context(), errorSlotKey{}, slot))
		h.ServeHTTP(&errorHeaderWriter{ResponseWriter: w, slot: slot}, r)
	})
}

type errorHeaderWriter struct {
	http.ResponseWriter
	slot  *errorSlot
	wrote bool // the status line is out (flushStreamHeaders may write it early)
}

func (w *errorHeaderWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// WriteHeader writes the status once; a later call (grpc-gateway's stream
// error path after flushStreamHeaders wrote 200) is dropped, the error then
// travels in the body as an {"error": Status} line.
func (w *errorHeaderWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if code >= 400 {
		w.slot.mu.Lock()
		err := w.slot.err
		w.slot.mu.Unlock()
		if err != nil {
			errorHeaders(w.Header(), err)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Flush keeps NDJSON streams streaming.
func (w *errorHeaderWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting a failed flush (a write deadline passed,
// the client left), which http.ResponseController.Flush returns to
// grpc-gateway's stream loop so it stops at once.
func (w *errorHeaderWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection (read
// deadlines of the upload route).
func (w *errorHeaderWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type statusOverride struct {
	http.ResponseWriter
	code int
}

func (s statusOverride) WriteHeader(int) { s.ResponseWriter.WriteHeader(s.code) }

// limitBody caps JSON request bodies: a declared Content-Length above the
// limit is refused with 413 up front; a body without one (chunked) is cut
// at the limit by a jsonBody, and httpErrorHandler turns the proxy's
// decode error for a cut body into the same 413 TOO_LARGE.
func (s *Server) limitBody(h http.Handler) http.Handler {
	limit := s.cfg.MaxJSONBodyBytes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			s.writeStatus(w, r, http.StatusRequestEntityTooLarge, jsonTooLarge(fmt.Sprintf("request body is %d bytes", r.ContentLength), limit))
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			// The body must keep arriving: nothing for JSONBodyTimeout, or
			// less than MinBodyRate on average after JSONBodyTimeout, cuts
			// it (rateReader); a small body thus has JSONBodyTimeout plus
			// its length at MinBodyRate in total. The deadline is cleared
			// at the body's end (deadlineBody).
			d := s.cfg.JSONBodyTimeout
			rc := http.NewResponseController(w)
			_ = rc.SetReadDeadline(time.Now().Add(d))
			rr := &rateReader{r: r.Body, rc: rc, idle: d, grace: d, minRate: s.cfg.MinBodyRate}
			body := &deadlineBody{ReadCloser: readCloser{Reader: rr, Closer: r.Body}, rc: rc}
			r.Body = &jsonBody{ReadCloser: http.MaxBytesReader(w, body, limit), limit: limit, timeout: d}
		}
		h.ServeHTTP(w, r)
	})
}

// readCloser joins a Reader and a Closer.
type readCloser struct {
	io.Reader
	io.Closer
}

func jsonTooLarge(what string, limit int64) error {
	return statusError(codes.InvalidArgument, ReasonTooLarge,
		fmt.Sprintf("%s, above the %d-byte limit for JSON requests (--max-json-body-bytes): stream large documents to POST /v1/documents:upload", what, limit))
}

// jsonBody is a JSON request body cut at limit (http.MaxBytesReader, which
// also makes the server close the connection instead of reading the rest).
// It remembers the cut so the error handler can answer 413 whatever error
// the proxy made of it.
type jsonBody struct {
	io.ReadCloser
	limit    int64
	timeout  time.Duration
	exceeded atomic.Bool
	timedOut atomic.Bool
}

func (b *jsonBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var tooBig *http.MaxBytesError
	if err != nil && errors.As(err, &tooBig) {
		b.exceeded.Store(true)
	}
	if err != nil && bodyTimedOut(err) {
		b.timedOut.Store(true)
	}
	return n, err
}

// bodyTooSlow reports whether r's JSON body missed its deadline, and the deadline.
func bodyTooSlow(r *http.Request) (time.Duration, bool) {
	b, ok := r.Body.(*jsonBody)
	if !ok || !b.timedOut.Load() {
		return 0, false
	}
	return b.timeout, true
}

// bodyTooLarge reports whether r's JSON body was cut at the limit, and the limit.
func bodyTooLarge(r *http.Request) (int64, bool) {
	b, ok := r.Body.(*jsonBody)
	if !ok || !b.exceeded.Load() {
		return 0, false
	}
	return b.limit, true
}

// writeStatus writes err (a status error) as grpc-gateway would, with an
// explicit HTTP status.
func (s *Server) writeStatus(w http.ResponseWriter, r *http.Request, httpCode int, err error) {
	err = shapeError(err)
	s.logRefusal(r, httpCode, err)
	_, m := runtime.MarshalerForRequest(s.gwMux, r)
	body, merr := m.Marshal(status.Convert(err).Proto())
	if merr != nil {
		http.Error(w, status.Convert(err).Message(), httpCode)
		return
	}
	w.Header().Set("Content-Type", m.ContentType(nil))
	w.WriteHeader(httpCode)
	_, _ = w.Write(body)
}

// logRefusal logs an error answer the HTTP side writes itself, which no
// gRPC call's log line covers (a route that does not exist, a stray query
// parameter, a refused WebSocket handshake, a malformed request...), with
// the answer's X-Request-Id, so that every id a client is given can be
// found in the log.
func (s *Server) logRefusal(r *http.Request, httpCode int, err error) {
	if !s.log.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	path := r.URL.Path
	if len(path) > 200 {
		path = path[:200] + "..."
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "http refused",
		slog.String("method", r.Method), slog.String("path", path), slog.Int("status", httpCode),
		slog.String("reason", errorReason(err)), slog.String("request_id", httpRequestID(r)),
		slog.String("error", status.Convert(err).Message()))
}

// handleHealthz answers 200 {"status":"SERVING"} when the bridge has a peer
// session, the server is not shutting down and the data directory's disk
// has at least Config.MinFreeDiskBytes free, else 503 with the reason.
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	body := healthBody{Status: "SERVING", Build: ReadBuildInfo()}
	if pr, ok := s.cfg.Bridge.(peerReporter); ok {
		body.Peers = pr.Peers()
	}
	err := s.ready()
	if err == nil {
		s.disk.poll() // fresh: one statfs
		err = s.disk.low()
	}
	if err != nil {
		body.Status, body.Reason = "NOT_SERVING", err.Error()
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// healthBody is the JSON of /healthz: the status, why it is not serving,
// every peer with its framing, profile, load and last error, and the
// build (version.go). openapi/internal/fixspec declares the same fields.
type healthBody struct {
	Status string              `json:"status"`
	Reason string              `json:"reason,omitempty"`
	Peers  []bridge.PeerStatus `json:"peers,omitempty"`
	Build  BuildInfo           `json:"build"`
}

// peerReporter is implemented by a bridge that reports its peers.
type peerReporter interface{ Peers() []bridge.PeerStatus }
