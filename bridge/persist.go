package bridge

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"

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

// docFlush is what one flush took from a document, to restore on failure.
type docFlush struct {
	d       *docRun
	prevRev uint64
	events  []*gatewayv1.Event
	ents    map[dirtyEnt]*gatewayv1.Entity
	digests map[dirtyDigest]*gatewayv1.ScopeDigest
	claims  map[string]bool
	result  []byte
	final   bool
}

// flush commits every dirty committed document in one batch. Unless all
// is set, a document whose only changes are progress (see holdable) stays
// out for up to flushHold, so that its progress rides with its next change.
func (b *Bridge) flush(all bool) {
	b.mu.Lock()
	batch := &store.Batch{}
	var took []docFlush
	now := time.Now()
	var wake time.Duration
	for _, d := range b.docs {
		if !d.committed || !d.dirty {
			continue
		}
		if !all && d.holdable() {
			if left := flushHold - now.Sub(d.dirtySince); left > 0 {
				if wake == 0 || left < wake {
					wake = left
				}
				continue
			}
		}
		rec := d.snapshot()
		batch.Updates = append(batch.Updates, store.DocumentUpdate{Record: rec, PrevRev: d.persistedRev})
		for k, e := range d.dirtyEnts {
			batch.Entities = append(batch.Entities, store.EntityRecord{DocID: d.id, Entity: proto.Clone(e).(*gatewayv1.Entity),
				Attempt: k.attempt, ScopeInstance: k.k.inst})
		}
		for k, dg := range d.dirtyDigests {
			batch.Digests = append(batch.Digests, store.DigestRecord{DocID: d.id, Digest: proto.Clone(dg).(*gatewayv1.ScopeDigest),
				Attempt: k.attempt, ScopeInstance: k.k.inst})
		}
		for id := range d.dirtyClaims {
			c := proto.Clone(d.claims[id].c).(*gatewayv1.ClaimCheck)
			c.Name = ""
			batch.Claims = append(batch.Claims, store.ClaimRecord{Tenant: string(d.tenant), Claim: c, Chunk: d.claims[id].chunk()})
		}
		for _, ev := range d.pending {
			batch.Events = append(batch.Events, store.EventAppend{Tenant: string(d.tenant), Event: ev})
		}
		// A small result commits with (or before) the terminal state; the
		// inline content goes with the terminal state, as a spool file is
		// removed once that is durable.
		if d.resultInline != nil {
			batch.Payloads = append(batch.Payloads, store.PayloadRecord{DocID: d.id, Kind: store.PayloadResult, Body: d.resultInline})
		}
		if d.inline && d.terminal() {
			batch.Payloads = append(batch.Payloads, store.PayloadRecord{DocID: d.id, Kind: store.PayloadContent})
		}
		took = append(took, docFlush{d: d, prevRev: d.persistedRev, events: d.pending, ents: d.dirtyEnts,
			digests: d.dirtyDigests, claims: d.dirtyClaims, result: d.resultInline, final: d.terminal()})
		d.resultInline = nil
		d.persistedRev = rec.Doc.Rev
		d.pending = nil
		d.dirty = false
		d.dirtyEnts, d.dirtyDigests, d.dirtyClaims = map[dirtyEnt]*gatewayv1.Entity{}, map[dirtyDigest]*gatewayv1.ScopeDigest{}, map[string]bool{}
	}
	if wake > 0 {
		b.armHoldLocked(wake)
	}
	b.mu.Unlock()
	if len(took) == 0 {
		return
	}
	_, err := b.commit(context.Background(), batch)
	var detach []detachReq
	defer func() { runDetach(b, detach) }() // after the unlock below
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.log.Error("bridge: committing document state failed; will retry", "docs", len(took), "err", err)
		for _, t := range took {
			d := t.d
			d.persistedRev = t.prevRev
			d.pending = append(t.events, d.pending...)
			d.markDirty(time.Now())
			for k, e := range t.ents {
				if _, ok := d.dirtyEnts[k]; !ok {
					d.dirtyEnts[k] = e
				}
			}
			for k, dg := range t.digests {
				if _, ok := d.dirtyDigests[k]; !ok {
					d.dirtyDigests[k] = dg
				}
			}
			for k := range t.claims {
				d.dirtyClaims[k] = true
			}
			if d.resultInline == nil {
				d.resultInline = t.result
			}
		}
		if !errors.Is(err, store.ErrClosed) {
			time.AfterFunc(100*time.Millisecond, b.kickFlush)
		}
		return
	}
	for _, t := range took {
		if len(t.claims) > 0 {
			detach = append(detach, b.detachDeferredLocked(t.d, t.claims)...)
		}
		if t.final && !t.d.dirty {
			delete(b.docs, t.d.id)
			if t.d.inline {
				continue // the content row went with the terminal batch
			}
			if err := b.st.RemovePayload(context.WithoutCancel(b.ctx), t.d.id, store.PayloadContent); err != nil { // also in the last flush, after Close cancelled b.ctx
				b.log.Warn("bridge: removing spool of a finished document", "doc", t.d.id, "err", err)
			}
		}
	}
}

// holdable reports whether d's uncommitted changes are only progress that
// may wait for its next change (flushHold): its running state and its
// entities' statuses. A terminal state, a result, a claim or a scope digest
// is never held: each is what a client, a redemption or a restart needs
// durable now. Caller holds mu.
func (d *docRun) holdable() bool {
	return !d.terminal() && len(d.dirtyClaims) == 0 && len(d.dirtyDigests) == 0 && d.resultInline == nil
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
func (b *Bridge) commit(ctx context.Context, batch *store.Batch) (store.CommitResult, error) {
	return b.ev.Append(ctx, batch)
}

// detachReq is one Session.SetDetached call, made without Bridge.mu.
type detachReq struct {
	s         *quicpeer.Session
	scope, id uint32
}

func runDetach(b *Bridge, rs []detachReq) {
	for _, r := range rs {
		if err := r.s.SetDetached(r.scope, r.id, true); err != nil {
			b.log.Debug("bridge: detaching a deferred entity from the GOAWAY drain", "scope", r.scope, "entity", r.id, "err", err)
		}
	}
}

// durableDeferredLocked returns the entities of d's current attempt on ss
// that are DEFERRED with a durable ISSUED claim (not waiting in
// dirtyClaims), each with its claim.
func durableDeferredLocked(d *docRun, ss *sessState) map[entKey]*claimRun {
	out := map[entKey]*claimRun{}
	for id, cr := range d.claims {
		if cr.attempt != d.attempt || cr.sess != ss || cr.c.State != gatewayv1.ClaimCheck_ISSUED || d.dirtyClaims[id] {
			continue
		}
		if e := d.ents[cr.key]; e != nil && e.Status == gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED {
			out[cr.key] = cr
		}
	}
	return out
}

// waitsOnlyOnClaimsLocked reports whether d's current attempt on ss has
// nothing left but entities waiting on durable claims (and the root
// waiting for them): everything was sent, every other entity is terminal.
func waitsOnlyOnClaimsLocked(d *docRun, ss *sessState, durable map[entKey]*claimRun) bool {
	if !d.sendDone || len(durable) == 0 {
		return false
	}
	root := rootKey(d.rootID)
	for k, e := range d.ents {
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
func (b *Bridge) detachDeferredLocked(d *docRun, claims map[string]bool) []detachReq {
	ss := d.sess
	if ss == nil || ss.closed || ss.s == nil || d.terminal() {
		return nil
	}
	var out []detachReq
	durable := durableDeferredLocked(d, ss)
	for _, cr := range durable {
		if claims[cr.c.ClaimId] {
			out = append(out, detachReq{s: ss.s, scope: cr.c.ScopeId, id: cr.c.EntityId})
		}
	}
	root := rootKey(d.rootID)
	if len(out) == 0 || durable[root] != nil || !waitsOnlyOnClaimsLocked(d, ss, durable) {
		return out
	}
	if re := d.ents[root]; re == nil || terminalEntity(re.Status) {
		return out
	}
	return append(out, detachReq{s: ss.s, scope: 0, id: d.rootID})
}

// sessionWaitsOnlyOnClaims reports whether every document running on ss
// waits only on durable claims: its GOAWAY drain has nothing left to wait
// for (Close ends it then; the claims outlive the session).
func (b *Bridge) sessionWaitsOnlyOnClaims(ss *sessState) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for d := range ss.docs {
		if d.terminal() || d.sess != ss {
			continue
		}
		if !waitsOnlyOnClaimsLocked(d, ss, durableDeferredLocked(d, ss)) {
			return false
		}
	}
	return true
}
