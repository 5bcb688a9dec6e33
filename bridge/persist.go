package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
)

// flushLoop commits state changes in the background: the session's control
// goroutine never waits for an fsync. Changes that arrive while a commit is
// in flight go into the next one (group commit). It runs until flushStop is
// closed, then flushes one last time.
func (b *Bridge) flushLoop() {
	defer b.flushWG.Done()
	for {
		select {
		case <-b.flushCh:
			b.flush(false)
			time.Sleep(flushInterval) // let a burst of statuses coalesce
		case <-b.flushStop:
			b.flush(true)
			return
		}
	}
}

// takeChangesLocked moves d's outbox into batch and returns what it took,
// to put back should the commit fail. It is the one path by which a
// document's changes reach the store: the Create batch (submit.go) and
// every flush go through it. Caller holds mu.
func (d *docRun) takeChangesLocked(batch *store.Batch) outbox {
	t := d.out.take()
	t.appendTo(batch, d)
	return t
}

// docFlush is what one flush took from a document, to put back on failure.
type docFlush struct {
	d       *docRun
	prevRev uint64
	rev     uint64 // the revision the flush writes
	took    outbox
	final   bool
}

// flush commits every dirty committed document in one batch. Unless all
// is set, a document whose only changes are progress (see holdable) stays
// out for up to flushHold, so that its progress rides with its next change.
// Each document is taken from and finished under its own lock (and the
// registry's); only the flusher takes and puts back, so what one flush
// took is back or durable before the next one looks.
func (b *Bridge) flush(all bool) {
	batch, took := b.takeFlush(all, time.Now())
	if len(took) == 0 {
		return
	}
	_, err := b.commit(context.Background(), batch)
	var detach []detachReq
	defer func() { runDetach(b, detach) }() // after the unlocks below
	var le *store.LeaseLostError
	lost := map[string]bool{}
	if errors.As(err, &le) {
		for _, id := range le.DocIDs {
			lost[id] = true
		}
	}
	now := time.Now()
	var spools []string
	for _, t := range took {
		t.d.lock()
		switch {
		case err == nil:
			dt, spool := t.flushedLocked()
			detach = append(detach, dt...)
			if spool {
				spools = append(spools, t.d.id)
			}
		case lost[t.d.id]:
			t.d.dropLocked(le.Reason)
		default:
			t.putBackLocked(now)
		}
		t.d.unlock()
	}
	b.removeSpools(spools)
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.flushDoneLocked()
	switch {
	case le != nil:
		b.kickFlush()
	case err != nil:
		b.log.Error("bridge: committing document state failed; will retry", "docs", len(took), "err", err)
		if !errors.Is(err, store.ErrClosed) {
			time.AfterFunc(100*time.Millisecond, b.kickFlush)
		}
	}
}

// takeFlush builds one flush's batch from the documents due now and
// arms the hold timer for the ones held back.
func (b *Bridge) takeFlush(all bool, now time.Time) (*store.Batch, []docFlush) {
	b.mu.Lock()
	docs := b.docList()
	b.mu.Unlock()
	batch := &store.Batch{}
	var took []docFlush
	var wake time.Duration
	eachDoc(b.reg, docs, func(d *docRun) bool { return b.docs[d.id] == d }, func(d *docRun) {
		if !d.committed || !d.out.dirty {
			return
		}
		if left := flushHold - now.Sub(d.out.since); !all && d.holdable() && left > 0 {
			if wake == 0 || left < wake {
				wake = left
			}
			return
		}
		took = append(took, d.takeFlushLocked(batch))
	})
	if wake > 0 {
		b.mu.Lock()
		b.armHoldLocked(wake)
		b.mu.Unlock()
	}
	return batch, took
}

// takeFlushLocked adds d's record update and changes to batch. The inline
// content goes with the terminal state: a spool file is removed once that
// is durable.
func (d *docRun) takeFlushLocked(batch *store.Batch) docFlush {
	rec := d.snapshot()
	batch.Updates = append(batch.Updates, store.DocumentUpdate{Record: rec, PrevRev: d.persistedRev})
	t := docFlush{d: d, prevRev: d.persistedRev, rev: rec.Doc.Rev, final: d.terminal()}
	t.took = d.takeChangesLocked(batch)
	if d.inline && t.final {
		batch.Payloads = append(batch.Payloads, store.PayloadRecord{DocID: d.id, Kind: store.PayloadContent})
	}
	d.persistedRev = rec.Doc.Rev
	return t
}

// putBackLocked returns what a failed flush took to the document's outbox
// (caller holds its lock); the flusher retries soon.
func (t docFlush) putBackLocked(now time.Time) {
	t.d.persistedRev = t.prevRev
	t.d.out.putBack(t.took, now)
}

// flushedLocked finishes what a committed flush made durable for one
// document (caller holds its lock): deferred entities whose claims are now
// durable leave the GOAWAY drain (returned, to run without locks), and a
// finished document whose terminal state is durable is forgotten; spool:
// its spool file is to be removed (removeSpools, without locks).
func (t docFlush) flushedLocked() (_ []detachReq, spool bool) {
	t.d.durableRev = max(t.d.durableRev, t.rev)
	var detach []detachReq
	if len(t.took.claims) > 0 {
		for id := range t.took.claims {
			if cr := t.d.claims[id]; cr != nil {
				cr.durable = true
			}
		}
		detach = t.d.detachDeferredLocked(t.took.claims)
		t.d.resumeDurableLocked(t.took.claims)
	}
	if !t.final || t.d.out.dirty {
		return detach, false
	}
	t.d.env.regLock()
	t.d.env.reg.forget(t.d)
	t.d.env.regUnlock()
	// An inline document's content row went with the terminal batch.
	return detach, !t.d.inline
}

// removeSpools removes the spool files of finished documents whose
// terminal state is durable (flushedLocked).
func (b *Bridge) removeSpools(ids []string) {
	for _, id := range ids {
		if err := b.st.RemovePayload(context.WithoutCancel(b.ctx), id, store.PayloadContent); err != nil { // also in the last flush, after Close cancelled b.ctx
			b.log.Warn("bridge: removing spool of a finished document", "doc", id, "err", err)
		}
	}
}

// holdable reports whether d's uncommitted changes are only progress that
// may wait for its next change (flushHold): a terminal state is never
// held, nor what outbox.holdable refuses. Caller holds mu.
func (d *docRun) holdable() bool {
	return !d.terminal() && d.out.holdable()
}

// armHoldLocked makes sure a flush runs within after, for held documents.
// Caller holds mu.
func (b *Bridge) armHoldLocked(after time.Duration) {
	at := time.Now().Add(after)
	if b.holdTimer != nil && !b.holdAt.After(at) && b.holdAt.After(time.Now()) {
		return // an earlier or equal wake-up is armed
	}
	if b.holdTimer != nil {
		b.holdTimer.Stop()
	}
	b.holdAt = at
	b.holdTimer = time.AfterFunc(after, b.kickFlush)
}

// commit appends a batch through the event log (commit, then publish).
func (env *docEnv) commit(ctx context.Context, batch *store.Batch) (store.CommitResult, error) {
	return env.ev.Append(ctx, batch)
}

// detachReq is one Session.SetDetached call, made without any lock.
type detachReq struct {
	s         *quicpeer.Session
	scope, id uint32
}

func runDetach(b *Bridge, rs []detachReq) {
	for _, r := range rs {
		if err := r.s.SetDetached(r.scope, r.id, true); err != nil {
			b.log.Debug("bridge: detaching a deferred entity from the GOAWAY drain", "scope", r.scope, "entity", r.id, "err", err)
		} else if h := testHookDetached.Load(); h != nil {
			(*h)()
		}
	}
}

// testHookDetached, when set by a test (OnDetached), runs after each
// entity detached from the GOAWAY drain.
var testHookDetached atomic.Pointer[func()]

// durableDeferredLocked returns the entities of d's current attempt on ss
// that are DEFERRED with a durable ISSUED claim (not waiting in the
// outbox), each with its claim.
func durableDeferredLocked(d *docRun, ss *sessState) map[entKey]*claimRun {
	out := map[entKey]*claimRun{}
	for id, cr := range d.claims {
		if cr.att != d.att || cr.att.ss != ss || cr.c.State != gatewayv1.ClaimCheck_ISSUED || d.out.claims[id] {
			continue
		}
		if e := d.att.ents[cr.key]; e != nil && e.Status == gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED {
			out[cr.key] = cr
		}
	}
	return out
}

// waitsOnlyOnClaimsLocked reports whether d's current attempt on ss has
// nothing left but entities waiting on durable claims (and the root
// waiting for them): everything was sent, every other entity is terminal.
func waitsOnlyOnClaimsLocked(d *docRun, ss *sessState, durable map[entKey]*claimRun) bool {
	a := d.att
	if !a.sendDone || len(durable) == 0 {
		return false
	}
	root := rootKey(a.rootID)
	for k, e := range a.ents {
		if k != root && !terminalEntity(e.Status) && durable[k] == nil {
			return false
		}
	}
	return true
}

// detachDeferredLocked returns the SetDetached calls for the entities of
// d's current attempt whose claims (among claims, just made durable) are
// ISSUED: a DEFERRED entity waits for a redemption that may come days
// later, on a later session (docs/profile.md 6), so it must not hold a
// GOAWAY drain (graceful shutdown) until its deadline. The root goes too
// when it waits only for such entities.
func (d *docRun) detachDeferredLocked(claims map[string]bool) []detachReq {
	ss := d.sess()
	if ss == nil || ss.s == nil || d.terminal() || d.env.sessClosed(ss) {
		return nil
	}
	var out []detachReq
	durable := durableDeferredLocked(d, ss)
	for _, cr := range durable {
		if claims[cr.c.ClaimId] {
			out = append(out, detachReq{s: ss.s, scope: cr.c.ScopeId, id: cr.c.EntityId})
		}
	}
	root := rootKey(d.att.rootID)
	if len(out) == 0 || durable[root] != nil || !waitsOnlyOnClaimsLocked(d, ss, durable) {
		return out
	}
	if re := d.att.ents[root]; re == nil || terminalEntity(re.Status) {
		return out
	}
	return append(out, detachReq{s: ss.s, scope: 0, id: d.att.rootID})
}

// sessionWaitsOnlyOnClaims reports whether every document running on ss
// waits only on durable claims: its GOAWAY drain has nothing left to wait
// for (Close ends it then; the claims outlive the session).
func (b *Bridge) sessionWaitsOnlyOnClaims(ss *sessState) bool {
	b.mu.Lock()
	docs := ss.docList()
	b.mu.Unlock()
	only := true
	eachDoc(b.reg, docs, ss.carries, func(d *docRun) {
		if only && !d.terminal() && d.sess() == ss {
			only = waitsOnlyOnClaimsLocked(d, ss, durableDeferredLocked(d, ss))
		}
	})
	return only
}

// flushDoneLocked wakes the callers waiting for a flush (waitDurable).
// Caller holds mu.
func (b *Bridge) flushDoneLocked() {
	close(b.flushed)
	b.flushed = make(chan struct{})
}

// waitDurable returns once a flush committed d at rev or later (every
// replica's reads show it then), or fails with ErrUnavailable after
// durableWait or when ctx ends first.
func (b *Bridge) waitDurable(ctx context.Context, d *docRun, rev uint64) error {
	ctx, cancel := context.WithTimeout(ctx, durableWait)
	defer cancel()
	for {
		d.lock()
		if d.durableRev >= rev {
			d.unlock()
			return nil
		}
		b.mu.Lock()
		wake := b.flushed
		b.mu.Unlock()
		b.kickFlush()
		d.unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("document %s is changed on this gateway, but the store has not confirmed the change (%v); reads may show the earlier state until it does: %w",
				d.id, ctx.Err(), ErrUnavailable)
		}
	}
}
