package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestEventLog: GET /v1/events:subscribe?cursor=0 (NDJSON) replays the
// document's events with increasing seq and a gap-free revision chain
// (each event's since = the previous event's rev, starting at since 0),
// starting with the creation (PENDING), in the state the submission
// answered at the answered rev, and ending SUCCEEDED;
// GET /v1/events:window brackets them.
func TestEventLog(t *testing.T) {
	g := shared(t)
	cases := []struct {
		name string
		req  map[string]any
	}{
		{"whole", map[string]any{"content": b64([]byte("event log, whole")), "contentType": "text/plain"}},
		{"dehydrated", map[string]any{"content": b64(textCorpus(4000)), "contentType": "text/plain",
			"split": map[string]any{"strategy": "SPLIT_LINES", "chunkBytes": 1000}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := submitREST(t, g, c.req)
			fin := awaitREST(t, g, d.GetId())
			if fin.GetState() != gatewayv1.State_SUCCEEDED {
				t.Fatalf("state %v, want SUCCEEDED", fin.GetState())
			}
			all := replayThroughRev(t, g, d.GetId(), fin.GetRev())
			mine, last := eventsOf(t, all, d.GetId())
			states := checkRevChain(t, d.GetId(), mine)
			if len(states) == 0 || states[len(states)-1] != "SUCCEEDED" {
				t.Errorf("#document states %v, want them to end with SUCCEEDED", states)
			}
			checkAnsweredState(t, d, mine, states)
			checkWindowBrackets(t, g, all[0].GetSeq(), last)
		})
	}
}

// replayThroughRev replays the whole window with curl (cursor=0) for 1.5 s,
// and again for twice as long while the replay does not yet reach document
// id's event at rev (the shared gateway's window grows with the suite and a
// busy machine replays it slower): a wait on the event, with a deadline.
func replayThroughRev(t *testing.T, g *gatewayProc, id string, rev uint64) []*gatewayv1.Event {
	t.Helper()
	for d := 1500 * time.Millisecond; ; d *= 2 {
		all := events(t, curlStream(t, g.baseURL()+"/v1/events:subscribe?cursor=0", d))
		for _, ev := range all {
			if ev.GetDocumentId() == id && ev.GetRev() >= rev {
				return all
			}
		}
		if d >= 24*time.Second {
			t.Logf("a %v replay of %d events does not reach document %s rev %d", d, len(all), id, rev)
			return all // the checks below say what is missing
		}
	}
}

// eventsOf checks the replay is strictly increasing and returns the events
// of document id (at least one) and the last seq.
func eventsOf(t *testing.T, all []*gatewayv1.Event, id string) (mine []*gatewayv1.Event, last uint64) {
	t.Helper()
	for _, ev := range all {
		if ev.GetSeq() <= last {
			t.Fatalf("seq %d after %d: the log must be strictly increasing", ev.GetSeq(), last)
		}
		last = ev.GetSeq()
		if ev.GetDocumentId() == id {
			mine = append(mine, ev)
		}
	}
	if len(mine) == 0 {
		t.Fatalf("no events of document %s among %d replayed events", id, len(all))
	}
	return mine, last
}

// checkRevChain checks a document's events form a gapless rev chain (each
// since is the previous rev, rev = since + 1, first since 0), each with a
// time, and returns the states of its #document events.
func checkRevChain(t *testing.T, id string, mine []*gatewayv1.Event) (states []string) {
	t.Helper()
	var rev uint64
	var chain []string
	for _, ev := range mine {
		chain = append(chain, fmt.Sprintf("seq %d %s rev %d since %d", ev.GetSeq(), ev.GetKind(), ev.GetRev(), ev.GetSince()))
		if ev.GetSince() != rev {
			t.Errorf("event seq %d (%s) has since=%d, want %d (the previous event's rev): the log has a gap", ev.GetSeq(), ev.GetKind(), ev.GetSince(), rev)
		}
		// Every change is one event (docs/architecture.md, "Event log"), and the
		// revision counts changes: rev = since + 1.
		if ev.GetRev() != ev.GetSince()+1 {
			t.Errorf("event seq %d (%s) has rev=%d since=%d: %d changes of the document have no event", ev.GetSeq(), ev.GetKind(), ev.GetRev(), ev.GetSince(), ev.GetRev()-ev.GetSince()-1)
		}
		rev = ev.GetRev()
		if ev.GetKind() == "#document" {
			states = append(states, ev.GetState().String())
		}
		if ev.GetTime() == nil {
			t.Errorf("event seq %d has no time", ev.GetSeq())
		}
	}
	if t.Failed() {
		t.Logf("events of %s:\n%s", id, strings.Join(chain, "\n"))
	}
	if mine[0].GetSince() != 0 {
		t.Errorf("the document's first event (seq %d) has since=%d, want 0", mine[0].GetSeq(), mine[0].GetSince())
	}
	return states
}

// checkAnsweredState: the submission answered the document at its rev; the
// log's #document events up to that rev end in the answered state (the
// first is the creation, PENDING; a pipelined upload may be RUNNING by the
// time it commits, with events of its own).
func checkAnsweredState(t *testing.T, d *gatewayv1.Document, mine []*gatewayv1.Event, states []string) {
	t.Helper()
	var atAnswer string
	for _, ev := range mine {
		if ev.GetRev() > d.GetRev() {
			break
		}
		if ev.GetKind() == "#document" {
			atAnswer = ev.GetState().String()
		}
	}
	if len(states) == 0 || states[0] != "PENDING" || atAnswer != d.GetState().String() {
		t.Errorf("#document states %v, state at the answered rev %d: %q; want the creation (PENDING) first and %v at rev %d, the state the submission answered",
			states, d.GetRev(), atAnswer, d.GetState(), d.GetRev())
	}
}

// checkWindowBrackets: GET /v1/events:window brackets the replayed seqs
// first..last and reports retained events, bytes and the snapshot size.
func checkWindowBrackets(t *testing.T, g *gatewayProc, first, last uint64) {
	t.Helper()
	r := curl(t, "GET", g.baseURL()+"/v1/events:window", nil)
	wantOK(t, "GET /v1/events:window", r)
	w := &gatewayv1.EventWindow{}
	decode(t, r.body, w)
	if w.GetOldestSeq() == 0 || w.GetOldestSeq() > first || w.GetLatestSeq() < last {
		t.Errorf("window %v does not bracket the replayed seqs %d..%d", w, first, last)
	}
	if w.GetRetainedEvents() == 0 || w.GetRetainedBytes() == 0 {
		t.Errorf("window %v: retained events/bytes are zero", w)
	}
	if w.GetSnapshotBytes() == 0 {
		t.Errorf("window %v: snapshotBytes is 0 with documents in the store (the cap on retained bytes)", w)
	}
}

// TestEventStreamHeadersBeforeEvents: a live-only subscription (no cursor)
// with nothing to send yet still answers 200 with its headers at once, so
// a client can tell an idle stream from a stuck request.
func TestEventStreamHeadersBeforeEvents(t *testing.T) {
	g := startGateway(t, gwOpts{}) // own gateway: nothing else writes events
	r := curlStream(t, g.baseURL()+"/v1/events:subscribe", 1500*time.Millisecond)
	if r.status != 200 {
		t.Errorf("live-only GET /v1/events:subscribe on an idle log: HTTP %03d after 1.5 s (headers %q), want 200 sent before the first event", r.status, r.headers)
	}
	r = curlStream(t, g.baseURL()+"/v1/events:subscribe?cursor=0", 1500*time.Millisecond)
	if r.status != 200 {
		t.Errorf("GET /v1/events:subscribe?cursor=0 on an empty log: HTTP %03d after 1.5 s, want 200", r.status)
	}
}
