package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The REST stream routes (GET /v1/documents/{id}:watch, GET
// /v1/events:subscribe; GET /v1/events:streamSnapshot likewise, served in
// snapshot_http.go) answer in the form the Accept header asks for
// (negotiateStream):
//
//   - application/x-ndjson (also no Accept, */*): the NDJSON stream of
//     grpc-gateway (ndjson.go);
//   - text/event-stream: Server-Sent Events, one event per message with
//     its seq as the SSE id, so a browser's EventSource resumes after a
//     reconnect: Last-Event-ID N resumes after event N; a finished stream
//     ends with an "end" event (serveSSE);
//   - application/json: one long-polled page, {"events"|"updates": [...],
//     "nextCursor": N}, that a client generated from the spec reads like
//     any JSON answer: pass nextCursor as cursor to get the next page
//     (servePage).
//
// The SSE and page forms are clients of the same gRPC methods (the event
// subscription in-process, localstream.go, like the NDJSON and WebSocket
// routes; a watch over the REST proxy's connection), so authentication,
// tenants, limits, cursor rules and errors are the gRPC ones.
const (
	sseType = "text/event-stream"
	// Page form parameters (openapi/internal/fixspec declares them).
	pageWaitParam = "waitSeconds"
	pageSizeParam = "pageSize"
	// defaultPageWait, maxPageWait: how long a page waits for its first
	// message by default and at most (below common proxy idle timeouts).
	defaultPageWait = 30 * time.Second
	maxPageWait     = 60 * time.Second
	// defaultPageSize, maxPageSize: messages per page.
	defaultPageSize = 100
	maxPageSize     = 1000
)

// streamForm is the representation a stream route answers in.
type streamForm int

const (
	formNDJSON streamForm = iota
	formSSE
	formPage
)

// negotiateStream picks the form from Accept: of the three types named
// exactly, the highest q wins, the first named on a tie; NDJSON when none
// is named (no Accept, */*, application/*) or a wildcard ranks NDJSON
// higher. A client that accepts none of them gets NDJSON too, as before
// (RFC 9110 lets a server disregard Accept).
func negotiateStream(accept []string) streamForm {
	ranges := parseAccept(accept)
	best, bestQ := formNDJSON, 0.0
	for _, r := range ranges {
		if r.q <= bestQ {
			continue
		}
		switch r.typ + "/" + r.sub {
		case ndjsonType:
			best, bestQ = formNDJSON, r.q
		case sseType:
			best, bestQ = formSSE, r.q
		case "application/json":
			best, bestQ = formPage, r.q
		}
	}
	if best != formNDJSON {
		if q, spec := acceptQuality(ranges, ndjsonType); spec != specExact && q > bestQ {
			return formNDJSON
		}
	}
	return best
}

// streamCall is one stream route's gRPC call, opened from the cursor on.
type streamCall struct {
	listKey string // the page's array member: "events" or "updates"
	first   uint64 // the cursor of the stream's first seq (pageOpen)
	open    func(ctx context.Context, cursor *uint64) (grpc.ClientStream, error)
	newMsg  func() proto.Message
	seqOf   func(proto.Message) uint64
	method  string // full gRPC method, for the proxy context
	pattern string // the REST path pattern
}

// streamForms serves the SSE and page forms of the stream routes and
// passes every other request on to next (NDJSON: grpc-gateway). The page
// parameters are removed from the query of an NDJSON request, which
// ignores them (the strict query parser would refuse them).
func (s *Server) streamForms(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, isWatch := watchPathID(r.URL.Path)
		isSubscribe := r.URL.Path == "/v1/events:subscribe"
		if r.Method != http.MethodGet || !isWatch && !isSubscribe {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Add("Vary", "Accept")
		form := negotiateStream(r.Header.Values("Accept"))
		if form == formNDJSON {
			dropPageParams(r)
			next.ServeHTTP(w, r)
			return
		}
		var call streamCall
		var err error
		if isWatch {
			call, err = s.watchCall(r, id)
		} else {
			call, err = s.subscribeCall(r)
		}
		if err != nil {
			s.httpError(w, r, err)
			return
		}
		if form == formSSE {
			s.serveSSE(w, r, call)
		} else {
			s.servePage(w, r, call)
		}
	})
}

// watchPathID returns the id of a /v1/documents/{id}:watch path.
func watchPathID(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, "/v1/documents/")
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, ":watch")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", false
	}
	return id, true
}

// dropPageParams removes the page form's parameters from r's query.
func dropPageParams(r *http.Request) {
	q := r.URL.Query()
	if !q.Has(pageWaitParam) && !q.Has(pageSizeParam) {
		return
	}
	q.Del(pageWaitParam)
	q.Del(pageSizeParam)
	r.URL.RawQuery = q.Encode()
}

// checkQuery refuses query parameters outside known, as the strict query
// parser does for the NDJSON form.
func checkQuery(q url.Values, known ...string) error {
	for k := range q {
		if !slices.Contains(known, k) {
			return invalid(fmt.Sprintf("unknown query parameter %q: this route takes %s", k, strings.Join(known, ", ")))
		}
	}
	return nil
}

// queryCursor reads the cursor parameter (absent: nil).
func queryCursor(q url.Values) (*uint64, error) {
	v := q.Get("cursor")
	if v == "" {
		return nil, nil
	}
	c, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return nil, invalid(fmt.Sprintf("query parameter cursor=%q: want an unsigned integer (a seq from a previous answer)", v))
	}
	return &c, nil
}

func (s *Server) watchCall(r *http.Request, id string) (streamCall, error) {
	q := r.URL.Query()
	if err := checkQuery(q, "cursor", pageWaitParam, pageSizeParam); err != nil {
		return streamCall{}, err
	}
	c := gatewayv1.NewDocumentServiceClient(s.conn)
	return streamCall{
		listKey: "updates",
		first:   1, // cursor 0 is the current state
		open: func(ctx context.Context, cursor *uint64) (grpc.ClientStream, error) {
			return c.WatchDocument(ctx, &gatewayv1.WatchDocumentRequest{Id: id, Cursor: derefCursor(cursor)})
		},
		newMsg:  func() proto.Message { return &gatewayv1.WatchDocumentResponse{} },
		seqOf:   func(m proto.Message) uint64 { return m.(*gatewayv1.WatchDocumentResponse).GetEvent().GetSeq() },
		method:  "/pipestream.gateway.v1.DocumentService/WatchDocument",
		pattern: "/v1/documents/{id}:watch",
	}, nil
}

func (s *Server) subscribeCall(r *http.Request) (streamCall, error) {
	return subscribeCallWith(r, s.localEvents()) // in-process, straight from the event log (localstream.go)
}

// subscribeCallWith is subscribeCall over client c.
func subscribeCallWith(r *http.Request, c gatewayv1.EventServiceClient) (streamCall, error) {
	q := r.URL.Query()
	if err := checkQuery(q, "cursor", "kinds", "documentId", "document_id", pageWaitParam, pageSizeParam); err != nil {
		return streamCall{}, err
	}
	doc := q.Get("documentId")
	if doc == "" {
		doc = q.Get("document_id")
	}
	kinds := q["kinds"]
	return streamCall{
		listKey: "events",
		open: func(ctx context.Context, cursor *uint64) (grpc.ClientStream, error) {
			return c.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{Cursor: cursor, Kinds: kinds, DocumentId: doc})
		},
		newMsg:  func() proto.Message { return &gatewayv1.Event{} },
		seqOf:   func(m proto.Message) uint64 { return m.(*gatewayv1.Event).GetSeq() },
		method:  subscribeMethod,
		pattern: "/v1/events:subscribe",
	}, nil
}

// skipped reports whether a resumed stream (skip > 0: the client has seen
// every message up to seq skip) drops m: a message at or below skip, and,
// on a watch, a message without an event, which a resumed watch sends for
// a terminal document with nothing new: the state the client has.
func (c streamCall) skipped(m proto.Message, skip uint64) bool {
	if skip == 0 {
		return false
	}
	seq := c.seqOf(m)
	return seq > 0 && seq <= skip || seq == 0 && c.first == 1
}

func derefCursor(c *uint64) uint64 {
	if c == nil {
		return 0
	}
	return *c
}

// httpError answers err as every REST route does (httpErrorHandler).
func (s *Server) httpError(w http.ResponseWriter, r *http.Request, err error) {
	_, out := runtime.MarshalerForRequest(s.gwMux, r)
	runtime.HTTPError(r.Context(), s.gwMux, out, w, r, err)
}

// openStream opens call from cursor over the proxy connection and waits
// until the stream started (the subscribedHeader mark: auth, limits and
// the cursor passed); a call refused before that returns its error.
func (s *Server) openStream(ctx context.Context, r *http.Request, call streamCall, cursor *uint64) (grpc.ClientStream, error) {
	ctx, err := runtime.AnnotateContext(ctx, s.gwMux, r, call.method, runtime.WithHTTPPathPattern(call.pattern))
	if err != nil {
		return nil, invalid(err.Error())
	}
	cs, err := call.open(ctx, cursor)
	if err != nil {
		return nil, err
	}
	md, err := cs.Header()
	if err != nil {
		return nil, err
	}
	if len(md.Get(subscribedHeader)) == 0 {
		if err = cs.RecvMsg(call.newMsg()); err == nil || errors.Is(err, io.EOF) {
			err = status.Error(codes.Internal, "the stream ended before it started")
		}
		return nil, err
	}
	return cs, nil
}

// resumeAfter turns "every message after seq n" (n > 0, a seq the client
// was sent, so the log has it or had it) into the cursor to open with and
// the seq up to which to skip: the log's cursor is inclusive and may not
// pass the latest seq, so the stream starts at n itself.
func resumeAfter(n uint64) (*uint64, uint64) {
	return &n, n
}

// serveSSE answers the stream as Server-Sent Events: every message is
// "id: <seq>" (when it has one) and "data: <JSON>"; an error after the
// start is a final "event: error" whose data is the google.rpc.Status; a
// stream that ended (a watch after its terminal state) sends a final
// "event: end" (an EventSource would reconnect after any end of the
// response: the client closes it on "end"). Last-Event-ID N (an
// EventSource reconnecting) resumes after event N and takes precedence
// over the cursor parameter.
func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request, call streamCall) {
	cursor, skip, err := sseCursor(r)
	if err != nil {
		s.httpError(w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var stateID uint64
	if call.first == 1 && cursor == nil {
		// A watch from its current state: that message has no event, so it
		// gets the latest seq before the start as its id; resuming from it
		// replays what changed since (at least once, never less).
		if stateID, err = s.latestSeq(ctx, r); err != nil {
			s.httpError(w, r, err)
			return
		}
	}
	cs, err := s.openStream(ctx, r, call, cursor)
	if err != nil {
		s.httpError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", sseType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if http.NewResponseController(w).Flush() == nil {
		s.pumpSSE(ctx, w, r, call, cs, skip, stateID)
	}
}

// sseCursor is where an SSE stream starts: after Last-Event-ID when the
// client sent one, else the cursor parameter. skip is the seq up to which
// messages are dropped (resumeAfter).
func sseCursor(r *http.Request) (*uint64, uint64, error) {
	cursor, err := queryCursor(r.URL.Query())
	if err != nil {
		return nil, 0, err
	}
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		return cursor, 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return nil, 0, invalid(fmt.Sprintf("Last-Event-ID %q is not a seq this stream sent", v))
	}
	if n == 0 {
		return cursor, 0, nil
	}
	c, skip := resumeAfter(n)
	return c, skip, nil
}

// pumpSSE writes every message of cs as an event until the stream ends
// ("end" after EOF, "error" after a failure) or the client leaves; an
// idle stream gets a ": keepalive" comment every Config.SSEKeepAlive.
func (s *Server) pumpSSE(ctx context.Context, w http.ResponseWriter, r *http.Request, call streamCall, cs grpc.ClientStream, skip, stateID uint64) {
	rc := http.NewResponseController(w)
	_, m := runtime.MarshalerForRequest(s.gwMux, r)
	msgs := make(chan pageMsg, 1)
	go recvAll(ctx, cs, call, msgs)
	keepAlive := time.NewTicker(s.cfg.SSEKeepAlive)
	defer keepAlive.Stop()
	var buf bytes.Buffer
	unflushed := false // written events the connection has not been given
	for {
		var pm pageMsg
		select {
		case <-ctx.Done():
			return
		case <-keepAlive.C:
			if _, err := io.WriteString(w, ": keepalive\n\n"); err != nil || rc.Flush() != nil {
				return // the client left or stalled past the write deadline
			}
			continue
		case pm = <-msgs:
		}
		if pm.err != nil {
			switch {
			case errors.Is(pm.err, io.EOF): // a watch after the terminal state
				_, _ = w.Write(appendSSE(buf.Bytes()[:0], "end", 0, []byte("{}")))
			case ctx.Err() == nil:
				body, _ := m.Marshal(status.Convert(shapeError(pm.err)).Proto())
				_, _ = w.Write(appendSSE(buf.Bytes()[:0], "error", 0, body))
			}
			_ = rc.Flush()
			return
		}
		if !call.skipped(pm.msg, skip) {
			seq := call.seqOf(pm.msg)
			if seq == 0 && call.first == 1 {
				seq = stateID // a watch's current state: as of the latest seq at the start
			}
			if data, err := m.Marshal(pm.msg); err == nil {
				if _, err := w.Write(appendSSE(buf.Bytes()[:0], "", seq, data)); err != nil {
					return // the client left or stalled past the write deadline
				}
				unflushed = true
			}
		}
		// A burst (one commit's events) goes out in one write: the flush
		// waits while the next message is already received.
		if unflushed && !nextWaiting(msgs) {
			if rc.Flush() != nil {
				return // the client left or stalled past the write deadline
			}
			unflushed = false
			keepAlive.Reset(s.cfg.SSEKeepAlive)
		}
	}
}

// nextWaiting reports whether the stream's next message is already in
// msgs, after letting the receiving goroutine (recvAll, made runnable by
// the receive just done) run once: see yieldForMore.
func nextWaiting(msgs chan pageMsg) bool {
	more := func() bool { return len(msgs) > 0 }
	return more() || yieldForMore(more)
}

// recvAll receives the messages of cs into msgs until the stream ends
// (its error, io.EOF included, is the last item) or ctx does.
func recvAll(ctx context.Context, cs grpc.ClientStream, call streamCall, msgs chan<- pageMsg) {
	shared, isShared := cs.(sharedReceiver)
	for {
		var m proto.Message
		var err error
		if isShared {
			m, err = shared.recvShared() // the event log's own message: not modified here
		} else {
			m = call.newMsg()
			err = cs.RecvMsg(m)
		}
		select {
		case msgs <- pageMsg{msg: m, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// sharedReceiver is a stream whose messages are received without a copy
// (localEventStream).
type sharedReceiver interface {
	recvShared() (proto.Message, error)
}

// appendSSE appends one Server-Sent Event (data is one line of JSON).
func appendSSE(b []byte, event string, id uint64, data []byte) []byte {
	if event != "" {
		b = append(append(append(b, "event: "...), event...), '\n')
	}
	if id > 0 {
		b = strconv.AppendUint(append(b, "id: "...), id, 10)
		b = append(b, '\n')
	}
	b = append(append(b, "data: "...), bytes.ReplaceAll(data, []byte("\n"), nil)...)
	return append(b, '\n', '\n')
}

// pageParams are the page form's wait and size.
func pageParams(q url.Values) (time.Duration, int, error) {
	wait, size := defaultPageWait, defaultPageSize
	if v := q.Get(pageWaitParam); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || time.Duration(n)*time.Second > maxPageWait {
			return 0, 0, invalid(fmt.Sprintf("query parameter %s=%q: want an integer from 0 to %d", pageWaitParam, v, int(maxPageWait/time.Second)))
		}
		wait = time.Duration(n) * time.Second
	}
	if v := q.Get(pageSizeParam); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxPageSize {
			return 0, 0, invalid(fmt.Sprintf("query parameter %s=%q: want an integer from 0 to %d (0: the default, %d)", pageSizeParam, v, maxPageSize, defaultPageSize))
		}
		if n > 0 {
			size = n
		}
	}
	return wait, size, nil
}

// latestSeq is the event log's latest seq now (GetEventWindow).
func (s *Server) latestSeq(ctx context.Context, r *http.Request) (uint64, error) {
	ctx, err := runtime.AnnotateContext(ctx, s.gwMux, r, "/pipestream.gateway.v1.EventService/GetEventWindow")
	if err != nil {
		return 0, invalid(err.Error())
	}
	win, err := gatewayv1.NewEventServiceClient(s.conn).GetEventWindow(ctx, &gatewayv1.GetEventWindowRequest{})
	return win.GetLatestSeq(), err
}

// pageOpen returns the cursor that opens a stream from seq c on, and the
// seq up to which messages are skipped. The log's cursor is inclusive and
// may not pass the latest seq, while a page's nextCursor is the seq after
// the last one sent, which may not exist yet: so the stream opens at c-1
// (sent before, so it exists) and skips it. c 0 and 1 open as they are
// (1 as first: 0 for the event log, where 0 is its whole window).
func pageOpen(c, first uint64) (*uint64, uint64) {
	if c <= 1 {
		if c == 1 {
			c = first
		}
		return &c, 0
	}
	return resumeAfter(c - 1)
}

// pageMsg is one message (or the end) of a page's stream.
type pageMsg struct {
	msg proto.Message
	err error
}

// servePage answers one page: it waits up to waitSeconds for the first
// message, then takes what else has arrived, up to pageSize, and answers
// {"<listKey>": [...], "nextCursor": "N", "done": bool}. nextCursor is
// the cursor of the next page (the last seq + 1, or this page's start when
// nothing came); done is true when the stream ended (a watched document
// reached a terminal state). An error before any message is the error
// status; an error after some ends the page early (the next page meets it).
func (s *Server) servePage(w http.ResponseWriter, r *http.Request, call streamCall) {
	q := r.URL.Query()
	wait, size, err := pageParams(q)
	if err == nil {
		var cursor *uint64
		if cursor, err = queryCursor(q); err == nil {
			s.servePageFrom(w, r, call, cursor, wait, size)
			return
		}
	}
	s.httpError(w, r, err)
}

// servePageFrom serves a page from cursor: nil is "from now" (after the
// latest seq; a watch then starts with the document's current state).
func (s *Server) servePageFrom(w http.ResponseWriter, r *http.Request, call streamCall, cursor *uint64, wait time.Duration, size int) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	start := derefCursor(cursor) // the nextCursor of a page without messages
	open, skip := cursor, uint64(0)
	if cursor == nil {
		latest, err := s.latestSeq(ctx, r)
		if err != nil {
			s.httpError(w, r, err)
			return
		}
		start = latest + 1
		if call.first == 0 { // the event log: from now; a watch: current state first
			open, skip = pageOpen(start, call.first)
		}
	} else {
		open, skip = pageOpen(*cursor, call.first)
	}
	cs, err := s.openStream(ctx, r, call, open)
	if err != nil {
		s.httpError(w, r, err)
		return
	}
	msgs := make(chan pageMsg, size)
	go recvAll(ctx, cs, call, msgs)
	got, done, err := collectPage(ctx, msgs, call, skip, wait, size)
	if err != nil && len(got) == 0 {
		s.httpError(w, r, err)
		return
	}
	next := start
	for _, m := range got {
		if seq := call.seqOf(m); seq >= next {
			next = seq + 1
		}
	}
	s.writePage(w, r, call.listKey, got, next, done)
}

// collectPage reads msgs: up to wait for the first message kept, then
// whatever is already there, up to size. done: the stream ended (EOF).
func collectPage(ctx context.Context, msgs <-chan pageMsg, call streamCall, skip uint64, wait time.Duration, size int) ([]proto.Message, bool, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var got []proto.Message
	for len(got) < size {
		var pm pageMsg
		if len(got) == 0 {
			select {
			case pm = <-msgs:
			case <-timer.C:
				return got, false, nil
			case <-ctx.Done():
				return got, false, ctx.Err()
			}
		} else {
			select {
			case pm = <-msgs:
			default:
				return got, false, nil
			}
		}
		if errors.Is(pm.err, io.EOF) {
			return got, true, nil
		}
		if pm.err != nil {
			return got, false, pm.err
		}
		if call.skipped(pm.msg, skip) {
			continue
		}
		got = append(got, pm.msg)
	}
	return got, false, nil
}

// writePage writes the page as JSON with the REST marshaler.
func (s *Server) writePage(w http.ResponseWriter, r *http.Request, listKey string, got []proto.Message, next uint64, done bool) {
	_, m := runtime.MarshalerForRequest(s.gwMux, r)
	var b bytes.Buffer
	b.WriteString(`{"` + listKey + `":[`)
	for i, msg := range got {
		data, err := m.Marshal(msg)
		if err != nil {
			s.httpError(w, r, status.Errorf(codes.Internal, "encode %s: %v", listKey, err))
			return
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(data)
	}
	fmt.Fprintf(&b, `],"nextCursor":"%d","done":%t}`, next, done)
	b.WriteByte('\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.Bytes())
}
