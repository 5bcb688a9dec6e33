package gateway

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fxamacker/cbor/v2"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestFanoutSameBytesAsGRPCPath: the REST event streams served in-process
// from the event log (localstream.go, eventcache.go) put exactly the bytes
// on the wire that the old path did, which subscribed over the REST
// proxy's loopback gRPC connection and encoded every event per
// subscriber: grpc-gateway's NDJSON over that connection, the SSE form
// over it, and the old WebSocket pump (legacyWS below, the code this
// change replaced). A seeded history over two tenants on the real bridge
// (SQLite store, event log pruned to its newest events), then every
// combination of tenant, filter (none, kinds, documentId) and cursor (the
// whole window, in the window, below it: #info OutdatedCursor, above it:
// FutureCursor, not a number), and a subscription that ends with
// ConsumerTooSlow, is read from both paths and compared byte for byte
// (status, Content-Type, body; WebSocket: every message and the close);
// last, live NDJSON and WebSocket subscriptions get a new document's events and
// are cut with ConsumerTooSlow (compareLive: the WebSocket frames corked
// behind the event log's idle hook must come out before the error frame).
// The #info notice's time is the moment of each subscription, the one
// field that may differ.
func TestFanoutSameBytesAsGRPCPath(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(strings.TrimSpace(envOr("FANOUT_EQUIV_SEED", "")), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: FANOUT_EQUIV_SEED=%d)", seed, seed)
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	e := startEquiv(t)
	docs := e.generate(t, rng)
	w := e.settledWindow(t)
	if w.GetOldestSeq() <= 1 {
		t.Fatalf("window %d..%d: the history was not pruned, so no cursor is below it", w.GetOldestSeq(), w.GetLatestSeq())
	}
	mid := w.GetOldestSeq() + (w.GetLatestSeq()-w.GetOldestSeq())/2
	queries := []string{
		"cursor=0",
		"cursor=0&kinds=%23document",
		"cursor=" + strconv.FormatUint(mid, 10),
		"cursor=" + strconv.FormatUint(mid, 10) + "&kinds=%23status&kinds=%23document",
		"cursor=1", // below the window: #info OutdatedCursor, then the window
		"cursor=" + strconv.FormatUint(w.GetLatestSeq()+100, 10), // FutureCursor
		"cursor=x", // not a number
	}
	for _, tok := range []string{"tok-a", "tok-b"} {
		qs := slices.Clone(queries)
		last := docs[tok][len(docs[tok])-1] // retained: its events end the history
		qs = append(qs, "cursor=0&documentId="+last)
		for _, q := range qs {
			for _, slow := range []bool{false, true} {
				name := fmt.Sprintf("%s?%s", tok, q)
				if slow {
					name += "+too-slow"
				}
				t.Run(name, func(t *testing.T) {
					hdr := http.Header{"Authorization": {"Bearer " + tok}}
					if slow {
						hdr.Set("X-Client-Id", "too-slow")
					}
					got := e.compareHTTP(t, "/v1/events:subscribe?"+q, hdr, ndjsonType) + e.compareWS(t, q, hdr)
					if !raceEnabled { // the old SSE path swaps s.gwMux under the running server
						got += e.compareHTTP(t, "/v1/events:subscribe?"+q, hdr, sseType)
					}
					forms := 3
					if raceEnabled {
						forms = 2
					}
					// Every case reaches what it is about, on every path.
					want := map[string]int{"FutureCursor": 0, "OutdatedCursor": 0, "ConsumerTooSlow": 0}
					switch {
					case strings.HasPrefix(q, "cursor="+strconv.FormatUint(w.GetLatestSeq()+100, 10)):
						want["FutureCursor"] = forms
					case q == "cursor=x":
					case slow && strings.HasPrefix(q, "cursor=0"), slow && q == "cursor=1":
						// The window has each tenant's last document: the
						// subscription is cut after its first event.
						want["ConsumerTooSlow"] = forms
					case slow:
						want["ConsumerTooSlow"] = -1 // cut if the tenant has an event after the cursor
					}
					if q == "cursor=1" {
						want["OutdatedCursor"] = forms
					}
					for k, n := range want {
						if c := strings.Count(got, k); n > 0 && c < n || n == 0 && c > 0 {
							t.Errorf("%q appears %d times in the three forms, want %d", k, c, n)
						}
					}
				})
			}
		}
	}
	t.Run("unauthenticated", func(t *testing.T) { e.compareWS(t, "cursor=0", http.Header{}) })
	if w2, err := e.events.GetEventWindow(e.ctx("tok-a"), &gatewayv1.GetEventWindowRequest{}); err != nil || !equalWindow(w, w2) {
		t.Fatalf("the window moved during the comparison (%v -> %v, %v): the paths did not read the same history", w, w2, err)
	}
	t.Run("live+too-slow", func(t *testing.T) { e.compareLive(t) }) // appends: last
}

// equivKeep is how many events the history's log keeps at least.
const equivKeep = 20

// settledWindow waits until the pruner caught up with the last append
// (the window reads the same five times in a row) and returns it.
func (e *equivEnv) settledWindow(t *testing.T) *gatewayv1.EventWindow {
	t.Helper()
	var last *gatewayv1.EventWindow
	same := 0
	for deadline := time.Now().Add(20 * time.Second); same < 5; time.Sleep(20 * time.Millisecond) {
		w, err := e.events.GetEventWindow(e.ctx("tok-a"), &gatewayv1.GetEventWindowRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if last != nil && equalWindow(w, last) {
			same++
		} else {
			same = 0
		}
		last = w
		if time.Now().After(deadline) {
			t.Fatalf("window %d..%d: still moving after 20 s", w.GetOldestSeq(), w.GetLatestSeq())
		}
	}
	return last
}

func envOr(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

func equalWindow(a, b *gatewayv1.EventWindow) bool {
	return a.GetOldestSeq() == b.GetOldestSeq() && a.GetLatestSeq() == b.GetLatestSeq()
}

// equivEnv is a gateway over the real bridge with the old paths beside it.
type equivEnv struct {
	s      *Server
	log    *equivLog
	conn   *grpc.ClientConn
	docsC  gatewayv1.DocumentServiceClient
	events gatewayv1.EventServiceClient
	newURL string // the gateway's HTTP listener (new paths)
	oldURL string // the old paths (legacyHandler)
	hc     *http.Client
}

func startEquiv(t *testing.T) *equivEnv {
	t.Helper()
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   t.TempDir(),
		PeerAddr:  "127.0.0.1:9",
		PeerCAPEM: equivCertPEM(t),
		EventLog:  eventlog.Options{KeepNewest: equivKeep, MinAge: time.Nanosecond, NoSafetyMargin: true, PruneEveryEvents: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	el := &equivLog{EventLog: b.Events(), stopAt: map[bridge.Tenant]uint64{}}
	s, err := New(Config{
		GRPCAddr:      "127.0.0.1:0",
		HTTPAddr:      "127.0.0.1:0",
		Bridge:        equivBridge{Service: b, log: el},
		Authenticator: StaticTokens{"tok-a": "acme", "tok-b": "globex"},
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	e := &equivEnv{s: s, log: el, newURL: "http://" + s.HTTPAddr(), hc: &http.Client{Transport: &http.Transport{}}}
	old := httptest.NewServer(withRequestID(e.legacyHandler()))
	e.oldURL = old.URL
	e.conn, err = grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.docsC = gatewayv1.NewDocumentServiceClient(e.conn)
	e.events = gatewayv1.NewEventServiceClient(e.conn)
	t.Cleanup(func() {
		e.hc.CloseIdleConnections()
		old.CloseClientConnections()
		old.Close()
		e.conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return e
}

func (e *equivEnv) ctx(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

// generate submits and cancels documents of both tenants in a seeded
// order, then one last document per tenant, whose event is where every
// subscription of that tenant ends (equivLog). It returns each tenant's
// documents.
func (e *equivEnv) generate(t *testing.T, rng *mrand.Rand) map[string][]string {
	t.Helper()
	docs := map[string][]string{}
	toks := []string{"tok-a", "tok-b"}
	for range 40 + rng.IntN(20) {
		tok := toks[rng.IntN(2)]
		if len(docs[tok]) > 0 && rng.IntN(4) == 0 {
			id := docs[tok][rng.IntN(len(docs[tok]))]
			_, _ = e.docsC.CancelDocument(e.ctx(tok), &gatewayv1.CancelDocumentRequest{Id: id}) // a second cancel is refused: fine
			continue
		}
		d, err := e.docsC.SubmitDocument(e.ctx(tok), &gatewayv1.SubmitDocumentRequest{Content: []byte("doc " + strconv.Itoa(rng.IntN(1000))), ContentType: "text/plain"})
		if err != nil {
			t.Fatal(err)
		}
		docs[tok] = append(docs[tok], d.GetId())
	}
	// Every document ends (CANCELLED) before the comparison: a document
	// waiting for the unreachable peer gets a new wait-reason event
	// whenever a dial fails, which would append (and prune) during it.
	cancelAll := func(tok string) {
		for _, id := range docs[tok] {
			_, _ = e.docsC.CancelDocument(e.ctx(tok), &gatewayv1.CancelDocumentRequest{Id: id}) // already cancelled: refused, fine
		}
	}
	for _, tok := range toks {
		cancelAll(tok)
	}
	// Then each tenant's last document, cancelled at once: both tenants
	// have events at the end of the history, where their streams stop.
	for tok, tenant := range map[string]bridge.Tenant{"tok-a": "acme", "tok-b": "globex"} {
		d, err := e.docsC.SubmitDocument(e.ctx(tok), &gatewayv1.SubmitDocumentRequest{Content: []byte("last"), ContentType: "text/plain"})
		if err != nil {
			t.Fatal(err)
		}
		docs[tok] = append(docs[tok], d.GetId())
		if _, err := e.docsC.CancelDocument(e.ctx(tok), &gatewayv1.CancelDocumentRequest{Id: d.GetId()}); err != nil {
			t.Fatal(err)
		}
		w, err := e.events.GetEventWindow(e.ctx(tok), &gatewayv1.GetEventWindowRequest{})
		if err != nil {
			t.Fatal(err)
		}
		e.log.setStop(tenant, w.GetLatestSeq())
	}
	return docs
}

// compareHTTP reads path in the form accept from the new and the old path
// and compares status, Content-Type and body.
func (e *equivEnv) compareHTTP(t *testing.T, path string, hdr http.Header, accept string) string {
	t.Helper()
	get := func(base string) (int, string, []byte) {
		req, err := http.NewRequestWithContext(t.Context(), "GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = hdr.Clone()
		req.Header.Set("Accept", accept)
		resp, err := e.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s%s: %v", base, path, err)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), normalizeInfoTime(b)
	}
	oc, oct, ob := get(e.oldURL)
	nc, nct, nb := get(e.newURL)
	if oc != nc || oct != nct || !bytes.Equal(ob, nb) {
		t.Errorf("%s (%s):\nold path: HTTP %d %s\n%s\nnew path: HTTP %d %s\n%s", path, accept, oc, oct, ob, nc, nct, nb)
	}
	if len(ob) == 0 {
		t.Errorf("%s (%s): empty body: nothing was compared", path, accept)
	}
	return string(nb)
}

// compareLive opens live subscriptions (no cursor) of tenant acme, NDJSON
// and WebSocket, on both paths, then commits a document: each subscription gets its
// events as they are committed, the new WebSocket one corked behind the
// event log's idle hook (wscork.go), and is cut with ConsumerTooSlow after
// the first (equivLog), which the WebSocket route must write out before
// its error frame.
func (e *equivEnv) compareLive(t *testing.T) {
	hdr := http.Header{"Authorization": {"Bearer tok-a"}, "X-Client-Id": {"too-slow"}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var readers [2][]func() string // [old, new] per form
	for i, base := range []string{e.oldURL, e.newURL} {
		// SSE is compared in the sequential cases only: its old path swaps
		// s.gwMux (legacyGWMux), which a concurrent new-path SSE reads.
		for _, accept := range []string{ndjsonType} {
			req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/events:subscribe", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = hdr.Clone()
			req.Header.Set("Accept", accept)
			resp, err := e.hc.Do(req) // returns with the status line: the subscription started
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			readers[i] = append(readers[i], func() string {
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Errorf("%s %s: %v", base, accept, err)
				}
				return fmt.Sprintf("HTTP %d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			})
		}
		c, _, err := websocket.Dial(ctx, strings.Replace(base, "http", "ws", 1)+"/v1/events/ws", &websocket.DialOptions{HTTPHeader: hdr.Clone(), HTTPClient: e.hc})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		readers[i] = append(readers[i], func() string {
			var out []string
			for {
				typ, b, err := c.Read(ctx)
				if err != nil {
					return strings.Join(append(out, fmt.Sprintf("close %d %q", websocket.CloseStatus(err), closeReason(err))), "\n")
				}
				out = append(out, fmt.Sprintf("%v %x", typ, b))
			}
		})
	}
	if _, err := e.docsC.SubmitDocument(e.ctx("tok-a"), &gatewayv1.SubmitDocumentRequest{Content: []byte("live"), ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	for f, name := range []string{"NDJSON", "WebSocket"} {
		old, got := readers[0][f](), readers[1][f]()
		if old != got {
			t.Errorf("live %s:\nold path:\n%s\nnew path:\n%s", name, old, got)
		}
		slow, doc := "ConsumerTooSlow", "#document"
		if name == "WebSocket" { // frames are shown in hex
			slow, doc = hex.EncodeToString([]byte(slow)), hex.EncodeToString([]byte(doc))
		}
		if !strings.Contains(got, slow) || !strings.Contains(got, doc) {
			t.Errorf("live %s: want an event, then ConsumerTooSlow:\n%s", name, got)
		}
	}
}

// compareWS reads /v1/events/ws?q from the new path and the old one.
func (e *equivEnv) compareWS(t *testing.T, q string, hdr http.Header) string {
	t.Helper()
	var raw strings.Builder // the new path's messages as sent
	read := func(base string) []string {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, strings.Replace(base, "http", "ws", 1)+"/v1/events/ws?"+q, &websocket.DialOptions{HTTPHeader: hdr.Clone(), HTTPClient: e.hc})
		if err != nil {
			if resp == nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			return []string{fmt.Sprintf("HTTP %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)}
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		var out []string
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return append(out, fmt.Sprintf("close %d %q", websocket.CloseStatus(err), closeReason(err)))
			}
			if base == e.newURL {
				raw.Write(b)
			}
			out = append(out, fmt.Sprintf("%v %x", typ, normalizeInfoFrame(t, b)))
		}
	}
	old, got := read(e.oldURL), read(e.newURL)
	if !slices.Equal(old, got) {
		t.Errorf("/v1/events/ws?%s:\nold path: %d messages\n%s\nnew path: %d messages\n%s", q, len(old), strings.Join(old, "\n"), len(got), strings.Join(got, "\n"))
	}
	return raw.String() + strings.Join(got, "\n")
}

func closeReason(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return ""
}

var infoTime = regexp.MustCompile(`("kind":\s*"#info"[^\n]*?"time":\s*)"[^"]*"|("time":\s*)"[^"]*"([^\n]*"kind":\s*"#info")`)

// normalizeInfoTime blanks the time of #info events in JSON lines.
func normalizeInfoTime(b []byte) []byte {
	return infoTime.ReplaceAll(b, []byte(`${1}${2}"T"${3}`))
}

// normalizeInfoFrame blanks the time of an #info message frame.
func normalizeInfoFrame(t *testing.T, b []byte) []byte {
	var h wsHeader
	rest, err := cbor.UnmarshalFirst(b, &h)
	if err != nil {
		t.Fatalf("frame %x: %v", b, err)
	}
	if h.T != "#info" {
		return b
	}
	var p wsEvent
	if err := cbor.Unmarshal(rest, &p); err != nil {
		t.Fatalf("#info payload %x: %v", rest, err)
	}
	p.Time = "T"
	out, err := appendFrame(nil, h, p)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// legacyHandler serves the old paths: NDJSON through grpc-gateway over
// the REST proxy's loopback gRPC connection (the encoding per subscriber:
// no event cache), SSE over the same connection, and the old WebSocket
// pump.
func (e *equivEnv) legacyHandler() http.Handler {
	s := e.s
	mux := s.restMux(s.restRoutes(), restMarshaler())
	if err := gatewayv1.RegisterEventServiceHandlerClient(context.Background(), mux, gatewayv1.NewEventServiceClient(s.conn)); err != nil {
		panic(err)
	}
	ndjson := withErrorHeaders(streamFraming(mux))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/events/ws":
			legacyWS(s, w, r)
		case negotiateStream(r.Header.Values("Accept")) == formSSE:
			call, err := subscribeCallWith(r, gatewayv1.NewEventServiceClient(s.conn))
			if err != nil {
				s.httpError(w, r, err)
				return
			}
			s.legacyGWMux(func() { s.serveSSE(w, r, call) }, mux)
		default:
			ndjson.ServeHTTP(w, r)
		}
	})
}

// legacyGWMux runs f with gwMux set to mux (the SSE code annotates its
// gRPC call and marshals through s.gwMux); the comparison runs one request
// at a time.
func (s *Server) legacyGWMux(f func(), mux *runtime.ServeMux) {
	legacyMu.Lock()
	defer legacyMu.Unlock()
	saved := s.gwMux
	s.gwMux = mux
	defer func() { s.gwMux = saved }()
	f()
}

var legacyMu sync.Mutex

// legacyWS is the WebSocket route before issue 25 (handleEventsWS,
// startWSSubscription and pumpWSEvents as they were): a gRPC client of
// SubscribeEvents over the loopback connection, one frame encoded per
// event per subscriber.
func legacyWS(s *Server, w http.ResponseWriter, r *http.Request) {
	req, err := wsSubscribeRequest(r)
	if err != nil {
		s.preUpgradeError(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	actx, err := runtime.AnnotateContext(ctx, s.gwMux, r, subscribeMethod, runtime.WithHTTPPathPattern("/v1/events/ws"))
	if err != nil {
		s.rejectWS(w, r, status.Error(codes.InvalidArgument, err.Error()))
		return
	}
	stream, err := gatewayv1.NewEventServiceClient(s.conn).SubscribeEvents(actx, req)
	if err == nil {
		var md metadata.MD
		if md, err = stream.Header(); err == nil && len(md.Get(subscribedHeader)) == 0 {
			if _, err = stream.Recv(); err == nil || errors.Is(err, io.EOF) {
				err = status.Error(codes.Internal, "the event subscription ended before it started")
			}
		}
	}
	if err != nil {
		s.rejectWS(w, r, err)
		return
	}
	c, err := s.acceptWS(w, r, s.wsAcceptOptions())
	if err != nil {
		return
	}
	defer c.CloseNow()
	go discardWSReads(ctx, cancel, c)
	var frame []byte
	for {
		ev, err := stream.Recv()
		if err != nil {
			s.closeWS(ctx, c, err)
			return
		}
		if frame, err = appendEventFrame(frame[:0], ev); err != nil {
			frame, _ = appendEventFrame(frame[:0], unframableEvent(ev))
		}
		wctx, wcancel := context.WithTimeout(ctx, s.cfg.StreamWriteTimeout)
		err = c.Write(wctx, websocket.MessageBinary, frame)
		wcancel()
		if err != nil {
			return
		}
	}
}

// equivBridge is the real bridge with equivLog as its event log.
type equivBridge struct {
	bridge.Service
	log *equivLog
}

func (b equivBridge) Events() bridge.EventLog { return b.log }

// equivLog is the real event log with two test hooks that both paths go
// through alike: every subscription ends (nil: a clean end) after its
// tenant's last event of the history (stopAt), so a stream read from
// cursor 0 has an end to compare; and a client that sends X-Client-Id
// too-slow is cut with ConsumerTooSlow, as the log cuts
// a live subscriber that fell out of its tail, after its first event. It subscribes to the
// tenant's whole log and applies the filter itself, to see every seq.
type equivLog struct {
	bridge.EventLog
	mu     sync.Mutex
	stopAt map[bridge.Tenant]uint64
}

var errEquivStop = errors.New("equivLog: reached the end of the history")

func (l *equivLog) setStop(t bridge.Tenant, seq uint64) {
	l.mu.Lock()
	l.stopAt[t] = seq
	l.mu.Unlock()
}

func (l *equivLog) Subscribe(ctx context.Context, t bridge.Tenant, clientKey string, cursor *uint64, f bridge.EventFilter, send func(*gatewayv1.Event) error) error {
	l.mu.Lock()
	stop := l.stopAt[t]
	l.mu.Unlock()
	slow := strings.HasSuffix(clientKey, "|id:too-slow")
	err := l.EventLog.Subscribe(ctx, t, clientKey, cursor, bridge.EventFilter{}, func(ev *gatewayv1.Event) error {
		if ev.GetSeq() == 0 || (len(f.Kinds) == 0 || slices.Contains(f.Kinds, ev.GetKind())) && (f.DocumentID == "" || f.DocumentID == ev.GetDocumentId()) {
			if err := send(ev); err != nil {
				return err
			}
			if slow && ev.GetSeq() > 0 {
				return fmt.Errorf("next seq %d left the in-memory tail while the subscriber was live; resume with the last seq processed: %w", ev.GetSeq()+1, bridge.ErrConsumerTooSlow)
			}
		}
		if stop > 0 && ev.GetSeq() >= stop {
			return errEquivStop
		}
		return nil
	})
	if errors.Is(err, errEquivStop) {
		return nil
	}
	return err
}

// equivCertPEM makes a certificate to pin; nothing listens behind it.
func equivCertPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nobody"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
