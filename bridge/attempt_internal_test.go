package bridge

import (
	"context"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestNewAttemptIsWholeAndReplacesTheOld checks the attempt model: every
// dispatch makes a new attempt with nothing carried over, the generation
// grows, and the previous attempt is recognised as stale by pointer.
func TestNewAttemptIsWholeAndReplacesTheOld(t *testing.T) {
	p, err := newPlan(&gatewayv1.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := &registry{}
	b := &Bridge{docEnv: &docEnv{reg: reg, ctx: context.Background()}, registry: reg}
	d := b.newDocRun("doc1", "", p)
	if d.sess() != nil || d.att.current() {
		t.Fatalf("a new document runs no attempt: sess %v, current %v", d.sess(), d.att.current())
	}
	ss := &sessState{docs: map[*docRun]struct{}{}, mode: profileMode{}}
	first := d.newAttemptLocked(ss)
	if !first.current() || d.sess() != ss || first.gen != 1 {
		t.Fatalf("first attempt: current %v, sess ok %v, gen %d; want true, true, 1", first.current(), d.sess() == ss, first.gen)
	}
	first.rootID, first.sendDone, first.rootComplete, first.resultErr = 7, true, true, "x"
	d.setEntity(rootKey(7), &gatewayv1.Entity{EntityId: 7, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING})

	first.ended = true // aborted: the document waits for the next attempt
	if first.current() || !first.newest() || d.sess() != nil {
		t.Fatalf("ended attempt: current %v newest %v sess %v; want false, true, nil", first.current(), first.newest(), d.sess())
	}
	second := d.newAttemptLocked(ss)
	if first.newest() || first.current() || !second.current() {
		t.Fatalf("after re-dispatch: old newest %v current %v, new current %v", first.newest(), first.current(), second.current())
	}
	if second.gen != 2 || second.rootID != 0 || second.sendDone || second.rootComplete || second.resultErr != "" || len(second.ents) != 0 {
		t.Fatalf("second attempt carries state over: %+v", second)
	}
	if d.rec.DispatchAttempts != 2 {
		t.Fatalf("DispatchAttempts = %d, want 2", d.rec.DispatchAttempts)
	}
	// The first attempt's entity row is still pending, keyed by its generation.
	if d.out.ents[dirtyEnt{1, rootKey(7)}] == nil {
		t.Fatalf("the first attempt's entity change was lost from the outbox: %v", d.out.ents)
	}
	if got := parsePrivate(d.snapshot().Private); got != 2 {
		t.Fatalf("snapshot generation = %d, want 2", got)
	}
}

// TestOutboxTakePutBack checks that a failed commit's changes go back in
// front of the newer ones, and that a newer row value is kept.
func TestOutboxTakePutBack(t *testing.T) {
	o := newOutbox()
	now := time.Now()
	o.markDirty(now)
	e1 := &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING}
	o.events = append(o.events, &gatewayv1.Event{Rev: 2})
	o.putEntity(1, rootKey(1), e1)
	o.claims["c1"] = true
	o.result = []byte("r")

	took := o.take()
	if o.dirty || len(o.events) != 0 || len(o.ents) != 0 || len(o.claims) != 0 || o.result != nil {
		t.Fatalf("take left changes behind: %+v", o)
	}
	// Changes made while the commit was in flight.
	e1b := &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE}
	o.events = append(o.events, &gatewayv1.Event{Rev: 3})
	o.putEntity(1, rootKey(1), e1b)
	o.putEntity(1, rootKey(2), &gatewayv1.Entity{EntityId: 2})

	o.putBack(took, now.Add(time.Second))
	if !o.dirty {
		t.Fatal("putBack left the outbox clean")
	}
	if len(o.events) != 2 || o.events[0].Rev != 2 || o.events[1].Rev != 3 {
		t.Fatalf("events after putBack: %v; want revs 2, 3", o.events)
	}
	if got := o.ents[dirtyEnt{1, rootKey(1)}]; got != e1b {
		t.Fatalf("putBack overwrote the newer entity value: %v", got)
	}
	if len(o.ents) != 2 || !o.claims["c1"] || string(o.result) != "r" {
		t.Fatalf("putBack lost changes: ents %d claims %v result %q", len(o.ents), o.claims, o.result)
	}
	if o.holdable() {
		t.Fatal("an outbox with a claim and a result must not be held")
	}
}
