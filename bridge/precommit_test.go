package bridge_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestPreCommitChangesAreEvents forces the pipelined-upload race (profile
// 4.2): the peer answers every chunk, deferring one with a claim check,
// before the Create batch commits. docs/architecture.md, "Event log": every change is one
// event. Replaying the document's events from cursor 0 must show the
// creation (rev 1, since 0, PENDING), then every chunk status and the
// "#claim issued" event, revisions contiguous.
func TestPreCommitChangesAreEvents(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	restore, held := bridge.HoldCreateCommit(allChunksAnsweredOneDeferred, 15*time.Second)
	doc := e.submit(chunks4, faultReq(gatewayv1.CompletionPolicy_STRICT, "defer", "1"))
	restore()
	if !held() {
		t.Fatal("the peer did not answer all 4 chunks (one deferred) before the Create commit; the race was not forced")
	}
	got := e.waitFor(doc.Id, 20*time.Second, "a claim check", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) > 0 })
	claim := got.ClaimChecks[0]
	if _, err := e.b.Redeem(context.Background(), "", claim.ClaimId); err != nil {
		t.Fatalf("Redeem: %v", err)
	}
	final := e.wait(doc.Id, 20*time.Second)
	if final.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", final.State, final.Error)
	}
	evs := replayUpToRev(t, e.b, doc.Id, final.Rev)
	checkContiguousFromCreation(t, evs)
	checkClaimAndChunkEvents(t, evs, claim, final)
	if n := len(evs); evs[n-1].Rev != final.Rev {
		t.Errorf("last event rev %d, document rev %d", evs[n-1].Rev, final.Rev)
	}
}

// allChunksAnsweredOneDeferred holds the Create commit until the peer's
// answers for all 4 chunks (one deferred with a claim) are pending.
func allChunksAnsweredOneDeferred(claims int, ents []*gatewayv1.Entity) bool {
	final := 0
	for _, en := range ents {
		if en.ParentId != 0 && (en.Status == gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE ||
			en.Status == gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED) {
			final++
		}
	}
	return claims == 1 && final == 4
}

// replayUpToRev replays document id's events from cursor 0 until the one
// at rev.
func replayUpToRev(t *testing.T, b *bridge.Bridge, id string, rev uint64) []*gatewayv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var evs []*gatewayv1.Event
	stop := errors.New("stop")
	err := b.Events().Subscribe(ctx, "", "k", new(uint64), bridge.EventFilter{DocumentID: id}, func(ev *gatewayv1.Event) error {
		evs = append(evs, ev)
		if ev.Rev >= rev {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("subscribe: %v after %d events (document rev %d)", err, len(evs), rev)
	}
	return evs
}

// checkContiguousFromCreation: the first event is the creation (#document
// PENDING rev 1 since 0) and every next one's since is the previous rev.
func checkContiguousFromCreation(t *testing.T, evs []*gatewayv1.Event) {
	t.Helper()
	if f := evs[0]; f.Kind != "#document" || f.State != gatewayv1.State_PENDING || f.Rev != 1 || f.Since != 0 {
		t.Errorf("first event %v: want the creation, #document PENDING rev 1 since 0", f)
	}
	for i, prev := range chained(t, evs) {
		if i > 0 && (prev[1].Since != prev[0].Rev || prev[1].Rev != prev[1].Since+1) {
			t.Errorf("%s rev %d since %d after rev %d: revisions not contiguous", prev[1].Kind, prev[1].Rev, prev[1].Since, prev[0].Rev)
		}
	}
}

// chained returns the events of evs that are in the document's revision
// chain, each paired with the chained event before it (the first with
// itself). A claim redemption's event, committed with the redemption by
// whichever replica redeems (docs/architecture.md, Event log), carries rev
// 0 and is outside the chain; any other event with rev 0 fails t.
func chained(t *testing.T, evs []*gatewayv1.Event) [][2]*gatewayv1.Event {
	t.Helper()
	var out [][2]*gatewayv1.Event
	var prev *gatewayv1.Event
	for _, ev := range evs {
		if ev.Rev == 0 {
			if ev.Kind != "#claim" || ev.ClaimAction != "redeemed" || ev.Since != 0 {
				t.Errorf("event %v has rev 0; only a #claim redeemed event is outside the revision chain", ev)
			}
			continue
		}
		if prev == nil {
			out = append(out, [2]*gatewayv1.Event{ev, ev})
		} else {
			out = append(out, [2]*gatewayv1.Event{prev, ev})
		}
		prev = ev
	}
	return out
}

// checkClaimAndChunkEvents: the claim's issued and redeemed events, its
// entity's DEFERRED status and a COMPLETE status for every chunk are there.
func checkClaimAndChunkEvents(t *testing.T, evs []*gatewayv1.Event, claim *gatewayv1.ClaimCheck, final *gatewayv1.Document) {
	t.Helper()
	var issued, redeemed, deferred bool
	completed := map[uint32]bool{}
	for _, ev := range evs {
		switch {
		case ev.Kind == "#claim" && ev.ClaimId == claim.ClaimId && ev.ClaimAction == "issued":
			issued = true
		case ev.Kind == "#claim" && ev.ClaimId == claim.ClaimId && ev.ClaimAction == "redeemed":
			redeemed = true
		case ev.Kind == "#status" && ev.EntityId == claim.EntityId && ev.EntityStatus == gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED:
			deferred = true
		case ev.Kind == "#status" && ev.EntityStatus == gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE:
			completed[ev.EntityId] = true
		}
	}
	if !issued || !redeemed || !deferred {
		t.Errorf("claim events: issued %v, redeemed %v, DEFERRED status %v; want all (events %v)", issued, redeemed, deferred, evs)
	}
	for _, en := range final.Entities {
		if en.ParentId != 0 && !completed[en.EntityId] {
			t.Errorf("no #status COMPLETE event for chunk entity %d", en.EntityId)
		}
	}
}
