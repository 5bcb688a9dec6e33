package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const subscribeMethod = "/pipestream.gateway.v1.EventService/SubscribeEvents"

// handleEventsWS serves GET /v1/events/ws?cursor=N[&kinds=#status][&documentId=ID]:
// the event log over WebSocket as draft-holmgren-at-synchronization-00
// frames it ("WebSocket Transport"). It runs SubscribeEvents in-process
// (subscribeLocal, localstream.go), so cursor rules, tenancy and auth are
// exactly those of gRPC and NDJSON subscribers:
//
//   - every event is one binary frame: CBOR {op: 1, t: kind} + CBOR payload,
//     encoded once for every subscriber (eventCache);
//   - FutureCursor and ConsumerTooSlow are an error frame {op: -1} +
//     {error, message}, then close ("Error Frames");
//   - OutdatedCursor is an "#info" message frame;
//   - requests rejected before the upgrade (bad cursor, auth, a request
//     that is no WebSocket handshake, a foreign Origin) get an HTTP status
//     with a JSON google.rpc.Status body that also has the draft's "error"
//     name ("Pre-Upgrade HTTP Errors"; preUpgradeError, acceptWS).
//
// The connection is upgraded when the subscription started (the cursor was
// accepted); the handler's goroutine then writes each frame as the event
// log delivers it, under Config.StreamWriteTimeout. Client messages are
// read and ignored; pings keep the connection alive.
func (s *Server) handleEventsWS(w http.ResponseWriter, r *http.Request) {
	req, err := wsSubscribeRequest(r)
	if err != nil {
		s.preUpgradeError(w, r, http.StatusBadRequest, err)
		return
	}
	if !wsHandshake(r) {
		_, _ = s.acceptWS(w, r, s.wsAcceptOptions()) // answers 426 before any subscription is made
		return
	}
	// Counted before the upgrade, while http.Server still tracks the
	// request: Shutdown waits for hijacked connections on s.ws.
	s.ws.Add(1)
	defer s.ws.Done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sink := &wsSink{s: s, w: w, r: r, ctx: ctx, cancel: cancel}
	defer sink.finish()
	actx, err := runtime.AnnotateContext(ctx, s.gwMux, r, subscribeMethod, runtime.WithHTTPPathPattern("/v1/events/ws"))
	if err != nil {
		s.rejectWS(w, r, status.Error(codes.InvalidArgument, err.Error()))
		return
	}
	_, err = s.subscribeLocal(eventlog.WithPush(eventlog.WithIdle(actx, sink.idle), sink), req, sink)
	if sink.c != nil && !sink.gone && !sink.tooSlow {
		_ = sink.flushBatch() // what the subscription sent after its last idle
	}
	if sink.c == nil {
		if !sink.upgradeFailed {
			s.rejectWS(w, r, subscriptionEnd(err, "the event subscription ended before it started"))
		}
		return
	}
	switch {
	case sink.tooSlow:
		s.closeWithErrorFrame(sink.c, ReasonConsumerTooSlow, "the consumer did not accept a frame in time; reconnect with cursor="+strconv.FormatUint(sink.tooSlowSeq, 10))
	case sink.gone || sink.frameErr:
	default:
		s.closeWS(ctx, sink.c, subscriptionEnd(err, ""))
	}
}

// wsQueryParams are the query parameters of /v1/events/ws (ticket is
// taken by withTickets).
var wsQueryParams = []string{"cursor", "kinds", "documentId", "ticket"}

// wsSubscribeRequest reads the subscription from the query: kinds,
// documentId and cursor (an integer in [0, 2^53), or absent). Any other
// parameter is refused, as on every route.
func wsSubscribeRequest(r *http.Request) (*gatewayv1.SubscribeEventsRequest, error) {
	q := r.URL.Query()
	for k := range q {
		if !slices.Contains(wsQueryParams, k) {
			return nil, statusError(codes.InvalidArgument, "InvalidRequest",
				fmt.Sprintf("unknown query parameter %q: /v1/events/ws takes %s", k, strings.Join(wsQueryParams, ", ")))
		}
	}
	req := &gatewayv1.SubscribeEventsRequest{Kinds: q["kinds"], DocumentId: q.Get("documentId")}
	if v := q.Get("cursor"); v != "" {
		c, err := strconv.ParseUint(v, 10, 64)
		if err != nil || c >= 1<<53 {
			return nil, statusError(codes.InvalidArgument, "InvalidRequest",
				fmt.Sprintf("cursor=%q is not a sequence number: use an integer in [0, 2^53), or omit it for live events only", v))
		}
		req.Cursor = &c
	}
	return req, nil
}

// subscriptionEnd is how the end of an in-process subscription reads to
// its route, as a gRPC client would see it: io.EOF for a handler that
// returned nil (or, with before set, an Internal error saying so).
func subscriptionEnd(err error, before string) error {
	switch {
	case err != nil:
		return err
	case before != "":
		return status.Error(codes.Internal, before)
	}
	return io.EOF
}

// wsSink is a WebSocket subscription's localSink: start upgrades the
// connection, send writes one frame. It runs on the HTTP handler's
// goroutine or, while the subscription is caught up, on an event-log
// fan-out worker while that goroutine is parked (eventlog.Push: one at a
// time, never both); pings and close frames aside, which coder/websocket
// serializes.
type wsSink struct {
	s      *Server
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context
	cancel context.CancelFunc

	c             *websocket.Conn // set by start
	cork          *corkConn       // c's connection: every frame leaves through it, a batch's in one write
	idleWired     bool            // the event log calls idle: corking is safe
	onWorker      bool            // a fan-out worker's turn (eventlog.Push): send must not write
	batchFirst    uint64          // seq of the first frame corked since the last flush
	queued        bool            // a frame was queued since the last flush
	watch         *writeWatch     // frame write deadline (Config.StreamWriteTimeout)
	unhook        func() bool     // stops closing c when ctx ends
	stopPings     func()
	upgradeFailed bool // acceptWS answered the rejection
	tooSlow       bool // a frame write timed out: ConsumerTooSlow
	tooSlowSeq    uint64
	gone          bool             // a write failed because the consumer left
	frameErr      bool             // an event could not be framed; the error frame is out
	unframable    *gatewayv1.Event // could not be framed on a fan-out worker: idle ends the subscription
}

// start upgrades the connection once the subscription started.
func (k *wsSink) start(metadata.MD) error {
	hj := &corkHijacker{ResponseWriter: k.w}
	c, err := k.s.acceptWS(hj, k.r, k.s.wsAcceptOptions())
	if err != nil {
		k.upgradeFailed = true
		k.cancel()
		return status.Error(codes.Canceled, "WebSocket upgrade failed: "+err.Error())
	}
	if hj.conn == nil { // not hijacked through corkHijacker: no frame could be written
		_ = c.CloseNow()
		k.upgradeFailed = true
		k.cancel()
		return status.Error(codes.Internal, "WebSocket upgrade did not hijack the connection")
	}
	k.c, k.cork = c, hj.conn
	k.watch = newWriteWatch(k.s.cfg.StreamWriteTimeout, func() { _ = c.CloseNow() })
	k.unhook = context.AfterFunc(k.ctx, func() { _ = c.CloseNow() })
	c.SetReadLimit(64 << 10)
	go discardWSReads(k.ctx, k.cancel, c)
	k.stopPings = keepWSAlive(k.ctx, k.cancel, c, k.s.cfg.WSPingInterval)
	return nil
}

// finish releases the connection when the handler returns.
func (k *wsSink) finish() {
	if k.c != nil {
		k.watch.stop()
		k.unhook()
		k.stopPings()
		_ = k.c.CloseNow()
	}
}

// send writes ev's message (shared by every subscriber) within the write
// timeout: queued on the connection (corkConn.writeData, not through
// coder/websocket) and written with the rest of the batch, or at once
// when the event log does not batch for this subscriber.
func (k *wsSink) send(ev *gatewayv1.Event) error {
	if k.c == nil {
		return status.Error(codes.Canceled, "the WebSocket connection is not open")
	}
	if k.unframable != nil {
		return nil // the subscription ends at that event (endUnframable); nothing follows it
	}
	msg, err := k.s.events.wsMessage(ev)
	if err != nil {
		// Never a silent gap: the consumer is told which seq it misses.
		k.s.log.Warn("WebSocket event frame could not be encoded; sending an #info notice in its place", "seq", ev.GetSeq(), "error", err)
		if msg, err = eventMessage(unframableEvent(ev)); err != nil {
			if k.onWorker { // the end writes and may wait: the goroutine's idle does it
				k.unframable = ev
				return nil
			}
			return k.endUnframable(ev)
		}
	}
	// No per-frame context: its timer cost more than the frame. The write
	// deadline is k.watch's; a consumer that leaves closes the connection
	// (k.unhook), which fails a pending write at once.
	if k.batchFirst == 0 {
		k.batchFirst = ev.GetSeq()
	}
	// Corked when the event log calls idle: flushBatch writes it with the
	// rest of the batch.
	full, err := k.cork.queueData(msg, k.idleWired)
	if err != nil {
		return k.wrote(err, k.batchFirst)
	}
	k.queued = true
	if !k.idleWired || (full && !k.onWorker) {
		return k.flushBatch()
	}
	return nil
}

// Pushable, Begin and Flush make the sink an eventlog.Push: while the
// subscriber is caught up, the log's fan-out workers queue its frames
// and write them with one write(2) that does not wait
// (corkConn.tryFlush); a batch the socket does not take whole goes back
// to the handler's goroutine, whose idle hook writes the rest under the
// write watch, so a consumer that stops reading still ends with
// ConsumerTooSlow, and a failed write still reads as the consumer gone.
// Sends on a worker run through the same interceptor chain (per-message
// metrics and the stuck-send watchdog see every frame).
func (k *wsSink) Pushable() bool {
	return k.cork != nil && k.cork.try != nil && k.idleWired && !k.queued
}

// Begin starts a worker's turn (eventlog.Push).
func (k *wsSink) Begin() { k.onWorker = true }

// Flush ends a worker's turn (eventlog.Push): the frames it queued in
// one write(2) that does not wait; false leaves them to flushBatch.
func (k *wsSink) Flush() (bool, error) {
	k.onWorker = false
	if k.unframable != nil {
		return false, nil // idle ends the subscription, on its goroutine
	}
	if !k.queued {
		return true, nil // the turn's events were filtered out
	}
	if !k.cork.tryFlush() {
		return false, nil
	}
	k.batchFirst, k.queued = 0, false
	return true, nil
}

// endUnframable ends the subscription at ev, whose frame and notice
// could not be encoded: the frames before it, then an Internal error
// frame and close.
func (k *wsSink) endUnframable(ev *gatewayv1.Event) error {
	if ferr := k.flushBatch(); ferr != nil {
		return ferr
	}
	k.frameErr = true
	k.s.closeWithErrorFrame(k.c, codes.Internal.String(), "event "+strconv.FormatUint(ev.GetSeq(), 10)+" could not be framed")
	k.cancel()
	return status.Error(codes.Canceled, "event could not be framed")
}

// idle is the event log's eventlog.WithIdle hook: the subscriber sent
// everything committed so far; the batch's frames go out in one write.
func (k *wsSink) idle() error {
	k.idleWired = true
	if ev := k.unframable; ev != nil { // found on a fan-out worker
		return k.endUnframable(ev)
	}
	return k.flushBatch()
}

// flushBatch writes the corked frames within the write timeout.
func (k *wsSink) flushBatch() error {
	if k.cork == nil || !k.queued {
		// Nothing corked since the last flush (a wake-up whose events the
		// filter dropped): only queueData corks, and coder/websocket's
		// own frames were written when not corked.
		return nil
	}
	first := k.batchFirst
	k.batchFirst, k.queued = 0, false
	k.watch.begin()
	err := k.cork.flush()
	k.watch.end()
	return k.wrote(err, first)
}

// wrote handles the outcome of a write whose first frame was event seq
// first: a write cut by the watch is a consumer too slow (it resumes
// from first), any other failure a consumer that left.
func (k *wsSink) wrote(err error, first uint64) error {
	if err == nil {
		return nil
	}
	if k.watch.fired.Load() { // not the consumer leaving: it could not keep up
		k.tooSlow, k.tooSlowSeq = true, first
	} else {
		k.gone = true
	}
	k.cancel()
	return status.Error(codes.Canceled, "WebSocket write failed: "+err.Error())
}

// rejectWS answers a subscription refused before the upgrade: FutureCursor
// is an error frame after the upgrade, then close ("Error Frames"); any
// other error is its HTTP status with a JSON body (preUpgradeError).
func (s *Server) rejectWS(w http.ResponseWriter, r *http.Request, err error) {
	if errorReason(err) == ReasonFutureCursor {
		if c, aerr := s.acceptWS(w, r, s.wsAcceptOptions()); aerr == nil {
			s.closeWithErrorFrame(c, ReasonFutureCursor, status.Convert(err).Message())
			_ = c.CloseNow()
		}
		return
	}
	errorHeaders(w.Header(), err) // WWW-Authenticate, Retry-After
	s.preUpgradeError(w, r, runtime.HTTPStatusFromCode(status.Code(err)), err)
}

// discardWSReads reads and drops client messages (processing pongs and
// close frames) until the connection fails, then cancels.
func discardWSReads(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn) {
	defer cancel()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
	}
}

// keepWSAlive pings every interval and cancels when a pong does not come
// back within half of it (at most wsPongTimeout). It holds no goroutine
// between pings (a timer; a subscriber's goroutines are what its memory
// is made of at 1,000 subscribers, issue 25); stop ends it.
func keepWSAlive(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn, interval time.Duration) (stop func()) {
	p := &wsPinger{ctx: ctx, cancel: cancel, c: c, interval: interval, pongTimeout: min(wsPongTimeout, interval/2)}
	p.mu.Lock()
	p.t = time.AfterFunc(interval, p.ping)
	p.mu.Unlock()
	return p.stop
}

// wsPinger is keepWSAlive's timer.
type wsPinger struct {
	ctx                   context.Context
	cancel                context.CancelFunc
	c                     *websocket.Conn
	interval, pongTimeout time.Duration

	mu      sync.Mutex // t, stopped
	t       *time.Timer
	stopped bool
}

func (p *wsPinger) ping() {
	if p.ctx.Err() != nil {
		return
	}
	pctx, pcancel := context.WithTimeout(p.ctx, p.pongTimeout)
	err := p.c.Ping(pctx) // no lock held: Ping writes
	pcancel()
	if err != nil {
		p.cancel()
		return
	}
	p.mu.Lock()
	if !p.stopped {
		p.t.Reset(p.interval)
	}
	p.mu.Unlock()
}

func (p *wsPinger) stop() {
	p.mu.Lock()
	p.stopped = true
	p.t.Stop()
	p.mu.Unlock()
}

// closeWS ends the connection after the subscription ended with err.
func (s *Server) closeWS(ctx context.Context, c *websocket.Conn, err error) {
	if ctx.Err() != nil && status.Code(err) == codes.Canceled {
		return // the consumer went away
	}
	if errors.Is(err, io.EOF) {
		_ = c.Close(websocket.StatusNormalClosure, "")
		return
	}
	st := status.Convert(err)
	if st.Code() == codes.Unavailable {
		_ = c.Close(websocket.StatusGoingAway, truncateReason(st.Message()))
		return
	}
	s.closeWithErrorFrame(c, wsErrorName(err), st.Message())
}

// closeWithErrorFrame sends an error frame then closes, as "Error Frames"
// requires.
func (s *Server) closeWithErrorFrame(c *websocket.Conn, name, msg string) {
	frame, err := appendErrorFrame(nil, name, msg)
	if err == nil {
		wctx, cancel := context.WithTimeout(context.Background(), wsPongTimeout)
		_ = c.Write(wctx, websocket.MessageBinary, frame)
		cancel()
	}
	_ = c.Close(websocket.StatusPolicyViolation, truncateReason(name))
}

// wsErrorName is the error frame's machine-readable name: the ErrorInfo
// reason when there is one (FutureCursor, ConsumerTooSlow, ...), else the
// gRPC code name.
func wsErrorName(err error) string {
	if r := errorReason(err); r != "" {
		return r
	}
	return status.Code(err).String()
}

// truncateReason keeps a close reason within the 123 bytes a close frame
// allows.
func truncateReason(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}

// preUpgradeError answers a rejected upgrade with its HTTP status and a
// JSON google.rpc.Status body (code, message, details: the ErrorInfo or
// RetryInfo of err) that also carries the AT sync draft's "error" name
// ("Pre-Upgrade HTTP Errors": JSON with error and message fields): one
// object that decodes both as a Status and as an error frame payload.
func (s *Server) preUpgradeError(w http.ResponseWriter, r *http.Request, httpCode int, err error) {
	err = shapeError(err)
	s.logRefusal(r, httpCode, err)
	st := status.Convert(err)
	body := map[string]json.RawMessage{}
	if b, merr := protojson.Marshal(st.Proto()); merr == nil {
		_ = json.Unmarshal(b, &body)
	}
	put := func(k string, v any) {
		if b, merr := json.Marshal(v); merr == nil {
			body[k] = b
		}
	}
	put("code", int32(st.Code()))
	put("message", st.Message())
	put("error", wsErrorName(err))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpCode)
	_ = json.NewEncoder(w).Encode(body)
}

// acceptWS is websocket.Accept with its rejections (426 not a WebSocket
// handshake, 400 bad version or key, 403 foreign Origin, 405) answered as
// preUpgradeError JSON instead of the library's text/plain.
func (s *Server) acceptWS(w http.ResponseWriter, r *http.Request, opts *websocket.AcceptOptions) (*websocket.Conn, error) {
	rw := &wsRejectWriter{ResponseWriter: w}
	c, err := websocket.Accept(rw, r, opts)
	if err != nil && rw.code != 0 {
		s.preUpgradeError(w, r, rw.code, statusError(wsRejectCode(rw.code), ReasonWebSocketHandshake, wsRejectMessage(rw.code, err)))
	}
	return c, err
}

// wsHandshake reports whether r asks for a WebSocket upgrade at all
// (Connection: upgrade and Upgrade: websocket tokens); the rest of the
// handshake is websocket.Accept's to check.
func wsHandshake(r *http.Request) bool {
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

// headerHasToken reports whether a comma-separated header of h lists token
// (case-insensitive).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// wsRejectCode is the gRPC code of an HTTP status websocket.Accept rejects with.
func wsRejectCode(httpCode int) codes.Code {
	switch httpCode {
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusUpgradeRequired:
		return codes.FailedPrecondition
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusBadRequest:
		return codes.InvalidArgument
	}
	return codes.Internal
}

// wsRejectMessage says what to fix for a rejected handshake.
func wsRejectMessage(httpCode int, err error) string {
	msg := strings.TrimPrefix(err.Error(), "failed to accept WebSocket connection: ")
	switch httpCode {
	case http.StatusUpgradeRequired:
		return msg + ": /v1/events/ws is a WebSocket endpoint (RFC 6455): send Connection: Upgrade and Upgrade: websocket, or use GET /v1/events:subscribe for NDJSON"
	case http.StatusForbidden:
		return msg + ": the request's Origin is not this gateway's host; connect from a page served by the gateway"
	}
	return msg
}

// wsRejectWriter swallows what websocket.Accept writes for a rejected
// handshake (an error status and its text/plain body) and remembers the
// status; everything else (the 101 and the hijack) passes through.
type wsRejectWriter struct {
	http.ResponseWriter
	code int
}

func (w *wsRejectWriter) WriteHeader(code int) {
	if code >= http.StatusBadRequest {
		w.code = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *wsRejectWriter) Write(p []byte) (int, error) {
	if w.code != 0 {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets websocket.Accept reach the connection to hijack.
func (w *wsRejectWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// unframableEvent is the #info OutdatedCursor notice sent in place of an
// event that could not be framed: the stream skips its seq, and says so.
func unframableEvent(ev *gatewayv1.Event) *gatewayv1.Event {
	seq := strconv.FormatUint(ev.GetSeq(), 10)
	return &gatewayv1.Event{Kind: "#info", Name: "OutdatedCursor", Time: ev.GetTime(), DocumentId: ev.GetDocumentId(),
		Message: "event " + seq + " could not be encoded for this WebSocket stream and is skipped; read it with " +
			"GET /v1/events:subscribe?cursor=" + seq + " or resync the document from GetDocument"}
}
