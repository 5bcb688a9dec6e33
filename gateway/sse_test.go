package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
)

// startRealBridge runs the server over a real bridge (SQLite store and
// event log) without a peer: documents stay PENDING until cancelled.
func startRealBridge(t *testing.T) *harness {
	t.Helper()
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   t.TempDir(),
		PeerAddr:  "127.0.0.1:9", // discard port: nothing answers QUIC there
		PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return start(t, func(c *gateway.Config) { c.Bridge = b })
}

func (h *harness) submitText() string {
	h.t.Helper()
	code, _, body := h.do("POST", "/v1/documents", strings.NewReader(`{"content":"aGVsbG8=","contentType":"text/plain"}`))
	var doc struct{ Id string }
	if code != 200 || json.Unmarshal(body, &doc) != nil {
		h.t.Fatalf("submit: HTTP %d %s", code, body)
	}
	return doc.Id
}

// submitCancelled submits a document and cancels it: it leaves exactly
// its PENDING and CANCELLED events, both in the log when it returns, and
// nothing after. A document left waiting for startRealBridge's
// unreachable peer gets a waitReason event a supervisor pass (a second
// or more) later, which could land inside a test's wait at the head of
// the log (as in TestCursorRules).
func (h *harness) submitCancelled() {
	h.t.Helper()
	id := h.submitText()
	if code, _, b := h.do("POST", "/v1/documents/"+id+":cancel", strings.NewReader(`{}`)); code != 200 {
		h.t.Fatalf("cancel: HTTP %d %s", code, b)
	}
}

func (h *harness) latestSeq() uint64 {
	h.t.Helper()
	code, _, body := h.do("GET", "/v1/events:window", nil)
	var w struct{ LatestSeq string }
	if code != 200 || json.Unmarshal(body, &w) != nil {
		h.t.Fatalf("window: HTTP %d %s", code, body)
	}
	n, _ := strconv.ParseUint(w.LatestSeq, 10, 64)
	return n
}

// page is the JSON page form of the stream routes.
type page struct {
	Events []struct {
		Seq  string
		Kind string
	}
	Updates []struct {
		Event    *struct{ Seq string }
		Document struct{ Id, State string }
	}
	NextCursor string
	Done       bool
}

func (h *harness) page(path string) page {
	h.t.Helper()
	code, hdr, body := h.do("GET", path, nil, "Accept", "application/json")
	var p page
	if code != 200 || hdr.Get("Content-Type") != "application/json" || json.Unmarshal(body, &p) != nil {
		h.t.Fatalf("GET %s (Accept: application/json): HTTP %d %q %s, want a 200 JSON page", path, code, hdr.Get("Content-Type"), body)
	}
	if !strings.Contains(hdr.Get("Vary"), "Accept") {
		h.t.Errorf("GET %s: Vary %q, want Accept", path, hdr.Get("Vary"))
	}
	return p
}

// TestEventPagesFollowTheLog: GET /v1/events:subscribe with Accept:
// application/json answers pages; following nextCursor reads every event
// once, in order; a page at the head waits and answers empty with the same
// nextCursor (no FutureCursor), or with the events that arrive meanwhile.
func TestEventPagesFollowTheLog(t *testing.T) {
	h := startRealBridge(t)
	h.submitCancelled()
	h.submitCancelled()
	latest := h.latestSeq()
	if latest < 2 {
		t.Fatalf("latest seq %d after two submissions", latest)
	}
	var seqs []uint64
	cursor := "1"
	for i := 0; i < 50 && cursor != strconv.FormatUint(latest+1, 10); i++ {
		p := h.page("/v1/events:subscribe?waitSeconds=10&pageSize=2&cursor=" + cursor)
		if len(p.Events) == 0 || len(p.Events) > 2 {
			t.Fatalf("page at cursor %s: %d events, want 1 or 2 (the log has more)", cursor, len(p.Events))
		}
		for _, e := range p.Events {
			n, _ := strconv.ParseUint(e.Seq, 10, 64)
			seqs = append(seqs, n)
		}
		cursor = p.NextCursor
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("seqs read through pages %v, want 1..%d each once", seqs, latest)
		}
	}
	if uint64(len(seqs)) != latest {
		t.Fatalf("read %d events through pages, the log has %d", len(seqs), latest)
	}

	// At the head: the wait passes, the page is empty, the cursor stays.
	p := h.page("/v1/events:subscribe?waitSeconds=1&cursor=" + cursor)
	if len(p.Events) != 0 || p.NextCursor != cursor {
		t.Errorf("page at the head: %+v, want no events and nextCursor %s", p, cursor)
	}
	// Without a cursor: from now on, nextCursor the same.
	if p := h.page("/v1/events:subscribe?waitSeconds=0"); p.NextCursor != cursor {
		t.Errorf("page without cursor: nextCursor %s, want %s (after the latest seq)", p.NextCursor, cursor)
	}
	// A waiting page takes what arrives.
	type pageOrErr struct {
		p   page
		err error
	}
	got := make(chan pageOrErr, 1)
	go func() { // no t.Fatal here (gofatal): the result goes back on got
		var r pageOrErr
		req, err := http.NewRequest("GET", h.base+"/v1/events:subscribe?waitSeconds=30&cursor="+cursor, nil)
		if err == nil {
			req.Header.Set("Accept", "application/json")
			var resp *http.Response
			if resp, err = h.http.Do(req); err == nil {
				defer resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("HTTP %d", resp.StatusCode)
				} else {
					err = json.NewDecoder(resp.Body).Decode(&r.p)
				}
			}
		}
		r.err = err
		got <- r
	}()
	h.submitCancelled()
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting page: %v", r.err)
	}
	p = r.p
	if len(p.Events) == 0 || p.Events[0].Seq != cursor {
		t.Errorf("waiting page: %+v, want the new events from seq %s", p, cursor)
	}

	// Errors keep the one shape.
	for _, tc := range []struct{ path, reason string }{
		{"/v1/events:subscribe?cursor=100000", gateway.ReasonFutureCursor},
		{"/v1/events:subscribe?cursor=x", "INVALID_ARGUMENT"},
		{"/v1/events:subscribe?waitSeconds=3600", "INVALID_ARGUMENT"},
		{"/v1/events:subscribe?bogus=1", "INVALID_ARGUMENT"},
		{"/v1/documents/nope:watch", "NOT_FOUND"},
	} {
		code, _, body := h.do("GET", tc.path, nil, "Accept", "application/json")
		if st := decodeStatus(t, body); code < 400 || st.reason() != tc.reason {
			t.Errorf("GET %s: HTTP %d %s, want an error with reason %s", tc.path, code, body, tc.reason)
		}
	}
	// The NDJSON form ignores the page parameters rather than refusing them.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/events:subscribe?cursor=1&waitSeconds=5&pageSize=3", nil)
	resp, err := h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Errorf("NDJSON with page parameters: HTTP %d %q, want 200 application/x-ndjson", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// TestWatchPagesEndWithTheDocument: a watch read as pages starts with the
// document's current state and ends (done) with its terminal state.
func TestWatchPagesEndWithTheDocument(t *testing.T) {
	h := startRealBridge(t)
	id := h.submitText()
	p := h.page("/v1/documents/" + id + ":watch?waitSeconds=10") // the current state comes at once
	if len(p.Updates) != 1 || p.Updates[0].Document.Id != id || p.Updates[0].Document.State != "PENDING" || p.Done {
		t.Fatalf("first watch page %+v, want the current PENDING state, not done", p)
	}
	if code, _, b := h.do("POST", "/v1/documents/"+id+":cancel", strings.NewReader(`{}`)); code != 200 {
		t.Fatalf("cancel: HTTP %d %s", code, b)
	}
	last := ""
	for i := 0; i < 20 && !p.Done; i++ {
		p = h.page("/v1/documents/" + id + ":watch?waitSeconds=10&cursor=" + p.NextCursor)
		for _, u := range p.Updates {
			last = u.Document.State
		}
	}
	if !p.Done || last != "CANCELLED" {
		t.Errorf("watch pages ended done=%v with state %q, want done with CANCELLED", p.Done, last)
	}
}

// sseEvent is one Server-Sent Event.
type sseEvent struct{ event, id, data string }

// readSSE reads n events (or until the stream ends) from an SSE body.
func readSSE(t *testing.T, sc *bufio.Scanner, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	for len(out) < n && sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" && cur == sseEvent{}: // the end of a comment
		case line == "":
			out = append(out, cur)
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			cur.data += strings.TrimPrefix(line, "data: ")
		case strings.HasPrefix(line, ":"): // a comment (keepalive)
		default:
			t.Errorf("SSE line %q is none of event, id, data or blank", line)
		}
	}
	return out
}

// TestServerSentEvents: Accept: text/event-stream answers SSE; each event
// has its seq as id and the JSON message as data; Last-Event-ID resumes
// after that event (an EventSource reconnecting); a watch ends after the
// terminal state; a refused start is a JSON error status.
func TestServerSentEvents(t *testing.T) {
	h := startRealBridge(t)
	id := h.submitText()
	h.submitText()
	latest := h.latestSeq()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(path string, hdr ...string) (*http.Response, *bufio.Scanner) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", h.base+path, nil)
		req.Header.Set("Accept", "text/event-stream")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp, bufio.NewScanner(resp.Body)
	}
	resp, sc := open("/v1/events:subscribe", "Last-Event-ID", strconv.FormatUint(latest-1, 10))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("SSE subscribe: HTTP %d %q, want 200 text/event-stream with X-Request-Id", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readSSE(t, sc, 1)
	var ev struct{ Seq string }
	if len(evs) != 1 || evs[0].id != strconv.FormatUint(latest, 10) || json.Unmarshal([]byte(evs[0].data), &ev) != nil || ev.Seq != evs[0].id {
		t.Fatalf("after Last-Event-ID %d: %+v, want event %d with its JSON", latest-1, evs, latest)
	}
	resp.Body.Close()

	_, sc = open("/v1/documents/" + id + ":watch")
	first := readSSE(t, sc, 1)
	if len(first) != 1 || !strings.Contains(first[0].data, `"PENDING"`) || first[0].id != strconv.FormatUint(latest, 10) {
		t.Fatalf("SSE watch: %+v, want the current PENDING state with the latest seq %d as its id", first, latest)
	}
	if code, _, b := h.do("POST", "/v1/documents/"+id+":cancel", strings.NewReader(`{}`)); code != 200 {
		t.Fatalf("cancel: HTTP %d %s", code, b)
	}
	rest := readSSE(t, sc, 100) // until the stream ends
	if n := len(rest); n < 2 || rest[n-1].event != "end" || !strings.Contains(rest[n-2].data, `"CANCELLED"`) || rest[n-2].id == "" {
		t.Fatalf("SSE watch after cancel: %+v, want updates ending with CANCELLED (with its seq as id), then an end event", rest)
	}
	// An EventSource reconnecting after the end: nothing new, the end again.
	_, sc = open("/v1/documents/"+id+":watch", "Last-Event-ID", rest[len(rest)-2].id)
	if again := readSSE(t, sc, 100); len(again) != 1 || again[0].event != "end" {
		t.Errorf("SSE watch resumed after its last event: %+v, want only the end event", again)
	}

	resp, _ = open("/v1/events:subscribe?cursor=100000")
	var st struct {
		Code    int
		Details []struct{ Reason string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 400 ||
		resp.Header.Get("Content-Type") != "application/json" || len(st.Details) == 0 || st.Details[0].Reason != gateway.ReasonFutureCursor {
		t.Errorf("SSE future cursor: HTTP %d %q %+v, want 400 application/json FutureCursor", resp.StatusCode, resp.Header.Get("Content-Type"), st)
	}
}

// TestSSEKeepAlive: an idle SSE stream gets a comment line every
// Config.SSEKeepAlive (proxies keep it open; a gone client is found by the
// write), and events still follow.
func TestSSEKeepAlive(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.SSEKeepAlive = 20 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/events:subscribe", nil) // live only: idle
	req.Header.Set("Accept", "text/event-stream")
	resp, err := h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	comments := 0
	for comments < 3 && sc.Scan() {
		switch line := sc.Text(); {
		case line == ": keepalive":
			comments++
		case line != "":
			t.Fatalf("idle SSE stream sent %q, want only keepalive comments", line)
		}
	}
	if comments < 3 {
		t.Fatalf("idle SSE stream: %d keepalive comments before it ended (%v), want them every 20ms", comments, sc.Err())
	}
	for h.fake.log.waiting.Load() == 0 {
		time.Sleep(time.Millisecond) // the subscription is live: it waits for the push
	}
	h.fake.log.live <- h.fake.log.event(21)
	if evs := readSSE(t, sc, 1); len(evs) != 1 || evs[0].id != "21" {
		t.Errorf("after keepalives: %+v, want event 21", evs)
	}
}
