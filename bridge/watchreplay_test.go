package bridge_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestWatchReplayDocumentAsOfEvent: a replay from a cursor carries, with
// every event, the document as it was after that event (rev, state, entity
// counts), not the document as it is now: PENDING with the creation event,
// terminal only with the terminal event.
func TestWatchReplayDocumentAsOfEvent(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	doc := e.submit(chunks4, &gatewayv1.SubmitDocumentRequest{Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 10}})
	final := e.wait(doc.Id, 10*time.Second)
	if final.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s", final.State)
	}
	var ups []*gatewayv1.WatchDocumentResponse
	if err := e.b.Watch(ctx, "", doc.Id, 1, func(u *gatewayv1.WatchDocumentResponse) error { ups = append(ups, u); return nil }); err != nil {
		t.Fatal(err)
	}
	checkReplay(t, ups, final)

	// From a cursor in the middle: the events before it are folded in, so
	// the first message already shows the state they made.
	mid := ups[len(ups)/2].Event
	var tail []*gatewayv1.WatchDocumentResponse
	if err := e.b.Watch(ctx, "", doc.Id, mid.Seq, func(u *gatewayv1.WatchDocumentResponse) error { tail = append(tail, u); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(tail) != len(ups)-len(ups)/2 {
		t.Fatalf("replay from seq %d: %d updates, want %d", mid.Seq, len(tail), len(ups)-len(ups)/2)
	}
	for i, u := range tail {
		want := ups[len(ups)/2+i].Document
		if u.Document.Rev != want.Rev || u.Document.State != want.State ||
			u.Document.EntityCounts.GetComplete() != want.EntityCounts.GetComplete() || u.Document.EntityCounts.GetTotal() != want.EntityCounts.GetTotal() {
			t.Fatalf("replay from seq %d, update %d: rev %d %s counts %v; the full replay had rev %d %s counts %v",
				mid.Seq, i, u.Document.Rev, u.Document.State, u.Document.EntityCounts, want.Rev, want.State, want.EntityCounts)
		}
	}
}

// checkReplay asserts that each update's document matches its event and
// that the last one is the stored document.
func checkReplay(t *testing.T, ups []*gatewayv1.WatchDocumentResponse, final *gatewayv1.Document) {
	t.Helper()
	if len(ups) < 3 {
		t.Fatalf("replay sent %d updates; want the creation, progress and the terminal state", len(ups))
	}
	first := ups[0]
	if first.Event.Kind != "#document" || first.Event.State != gatewayv1.State_PENDING || first.Event.Rev != 1 {
		t.Fatalf("first event %v; want the #document PENDING creation event at rev 1", first.Event)
	}
	if first.Document.State != gatewayv1.State_PENDING || first.Document.Rev != 1 || first.Document.EntityCounts.GetComplete() != 0 ||
		first.Document.FinishTime != nil || first.Document.ResultSizeBytes != 0 {
		t.Fatalf("document with the creation event: %v; want it as created (PENDING, rev 1, nothing complete, no finish time or result)", first.Document)
	}
	var state gatewayv1.State
	var sawRunning, sawPartialCounts bool
	for i, u := range ups {
		ev, d := u.Event, u.Document
		if d.Rev != ev.Rev {
			t.Fatalf("update %d: event rev %d, document rev %d", i, ev.Rev, d.Rev)
		}
		if ev.Kind == "#document" {
			state = ev.State
		}
		if d.State != state {
			t.Fatalf("update %d (rev %d): document %s, but the events so far say %s", i, ev.Rev, d.State, state)
		}
		if store.IsTerminal(d.State) != (i == len(ups)-1) {
			t.Fatalf("update %d of %d: document %s; terminal only with the last event", i, len(ups), d.State)
		}
		sawRunning = sawRunning || d.State == gatewayv1.State_RUNNING
		c := d.EntityCounts
		sawPartialCounts = sawPartialCounts || (c.GetTotal() > 0 && c.GetComplete() < final.EntityCounts.GetComplete())
	}
	if !sawRunning || !sawPartialCounts {
		t.Fatalf("replay never showed the document RUNNING (%v) or partly complete (%v)", sawRunning, sawPartialCounts)
	}
	last := ups[len(ups)-1].Document
	if last.Rev != final.Rev || last.State != final.State || last.ResultSizeBytes != final.ResultSizeBytes ||
		last.EntityCounts.GetComplete() != final.EntityCounts.GetComplete() {
		t.Fatalf("last update %v; want the stored document %v", last, final)
	}
}

// TestWatchReplayClaims: a replay shows a claim check only from its
// #claim issued event on, ISSUED until the #claim redeemed event and
// REDEEMED from it.
func TestWatchReplayClaims(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	doc := e.submit([]byte("deferred, then redeemed"), &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split:    &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE, Processor: "fault"},
		Metadata: map[string]string{"pipestream.fault": "defer"}})
	claim := e.waitFor(doc.Id, 20*time.Second, "a claim", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 1 }).ClaimChecks[0].ClaimId
	if _, err := e.b.Redeem(ctx, "", claim); err != nil {
		t.Fatal(err)
	}
	if s := e.wait(doc.Id, 20*time.Second).State; s != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s", s)
	}
	var ups []*gatewayv1.WatchDocumentResponse
	if err := e.b.Watch(ctx, "", doc.Id, 1, func(u *gatewayv1.WatchDocumentResponse) error { ups = append(ups, u); return nil }); err != nil {
		t.Fatal(err)
	}
	want := gatewayv1.ClaimCheck_CLAIM_STATE_UNSPECIFIED // no claim yet
	var sawIssued, sawRedeemed bool
	for i, u := range ups {
		if u.Event.Kind == "#claim" {
			switch u.Event.ClaimAction {
			case "issued":
				want, sawIssued = gatewayv1.ClaimCheck_ISSUED, true
			case "redeemed":
				want, sawRedeemed = gatewayv1.ClaimCheck_REDEEMED, true
			}
		}
		cs := u.Document.ClaimChecks
		if want == gatewayv1.ClaimCheck_CLAIM_STATE_UNSPECIFIED {
			if len(cs) != 0 {
				t.Fatalf("update %d (rev %d, %s): claims %v before the claim was issued", i, u.Event.Rev, u.Event.Kind, cs)
			}
			continue
		}
		if len(cs) != 1 || cs[0].ClaimId != claim || cs[0].State != want || cs[0].ExpireTime == nil {
			t.Fatalf("update %d (rev %d, %s): claims %v; want claim %s %s with its expire time", i, u.Event.Rev, u.Event.Kind, cs, claim, want)
		}
	}
	if !sawIssued || !sawRedeemed {
		t.Fatalf("replay had no #claim issued (%v) or redeemed (%v) event", sawIssued, sawRedeemed)
	}
}

// TestWatchReplayCountsLayer1: with nested scopes (Layer 1 sentences, a
// peer may reuse scope ids), the entity counts a replay shows after the
// last #status event are the stored document's final counts.
func TestWatchReplayCountsLayer1(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	text := []byte("One sentence here. Another one there.\nA third line. With two sentences.\nLast line, one sentence.\nAnd more. And more again.\n")
	doc := e.submit(text, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 40, Processor: "sentences", MaxDepth: 1}})
	final := e.wait(doc.Id, 20*time.Second)
	if final.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s", final.State)
	}
	var ups []*gatewayv1.WatchDocumentResponse
	if err := e.b.Watch(ctx, "", doc.Id, 1, func(u *gatewayv1.WatchDocumentResponse) error { ups = append(ups, u); return nil }); err != nil {
		t.Fatal(err)
	}
	var lastStatus *gatewayv1.WatchDocumentResponse
	for _, u := range ups {
		if u.Event.Kind == "#status" {
			lastStatus = u
		}
	}
	if lastStatus == nil || lastStatus.Event.Rev == final.Rev {
		t.Fatalf("no #status event before the terminal one in %d updates", len(ups))
	}
	if got, want := lastStatus.Document.EntityCounts, final.EntityCounts; !proto.Equal(got, want) {
		t.Fatalf("counts after the last #status event (rev %d): %v; the stored document has %v", lastStatus.Event.Rev, got, want)
	}
}

// TestWatchFinishedDocumentFromPrunedCursor: every event of a finished
// document was pruned; a watch from a cursor among them answers the
// document with the #info OutdatedCursor notice, not an update whose event
// is null (which reads as "nothing happened since the cursor").
func TestWatchFinishedDocumentFromPrunedCursor(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	doc := e.submit([]byte("pruned"), nil)
	if final := e.wait(doc.Id, 10*time.Second); final.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s", final.State)
	}
	other := e.submit([]byte("later"), nil) // events after doc's
	e.wait(other.Id, 10*time.Second)
	w, err := e.b.Events().Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.PruneStoreBelow(ctx, w.GetLatestSeq()); err != nil {
		t.Fatal(err)
	}
	var ups []*gatewayv1.WatchDocumentResponse
	if err := e.b.Watch(ctx, "", doc.Id, 1, func(u *gatewayv1.WatchDocumentResponse) error { ups = append(ups, u); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(ups) != 1 {
		t.Fatalf("%d updates, want 1", len(ups))
	}
	if ev := ups[0].GetEvent(); ev.GetKind() != "#info" || ev.GetName() != "OutdatedCursor" {
		t.Fatalf("the update's event is %v, want #info OutdatedCursor", ev)
	}
	if ups[0].GetDocument().GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("the update's document is %s, want SUCCEEDED", ups[0].GetDocument().GetState())
	}
}
