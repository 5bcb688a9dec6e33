package bridge

import (
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// handler receives what the peer sends on one session (quicpeer.Handler).
type handler struct {
	b  *Bridge
	ss *sessState
}

func (h *handler) HandleStatus(s *quicpeer.Session, f wire.StatusFrame) {
	b := h.b
	in := decodeInline(h.ss.codec, &f) // before any lock: SHA-256 of the payload
	b.mu.Lock()
	if h.ss.s == nil {
		h.ss.s = s
	}
	d := lockFound(b.reg, func() *docRun { return h.ss.statusDoc(f) })
	st := b.onStatusRegLocked(h.ss, f, in)
	b.mu.Unlock()
	if st.ref != nil && st.ref.att.d == d { // statusDoc names what onStatusRegLocked resolves
		st.apply()
	}
	w := st.waiter
	if w != nil && w.d == d {
		w.answerLocked(f.Status) // after the status: a refusal that finishes d is recorded before its final flush
	}
	unlockFound(d)
	if w != nil {
		w.answered(f.Status, w.d == d)
	}
}

func (h *handler) HandleScopeDigest(s *quicpeer.Session, f wire.ScopeDigestFrame) {
	b := h.b
	b.mu.Lock()
	d := lockFound(b.reg, func() *docRun {
		if own := h.ss.scopes[f.ScopeID]; own != nil {
			return own.att.d
		}
		return nil
	})
	own := b.takeDigestScopeRegLocked(h.ss, f)
	b.mu.Unlock()
	if own != nil && own.att.d == d && own.att.newest() {
		own.att.onDigestLocked(own, f)
		b.kickFlush()
	}
	unlockFound(d)
}

func (h *handler) HandleBarrier(s *quicpeer.Session, f wire.BarrierFrame) {
	b := h.b
	b.mu.Lock()
	d := lockFound(b.reg, func() *docRun {
		if p, ok := h.ss.lastDehyd[f.ParentEntityID]; ok && !f.Released {
			return p.att.d
		}
		return nil
	})
	b.onBarrierRegLocked(h.ss, f)
	b.mu.Unlock()
	unlockFound(d)
}

func (h *handler) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame) {}

func (h *handler) HandleGoAway(s *quicpeer.Session, f wire.GoAwayFrame) {
	b := h.b
	b.mu.Lock()
	ss := h.ss
	ss.goaway = true
	b.log.Info("bridge: peer sent GOAWAY; dialing a new session", "addr", ss.pc.addr, "last_entity", f.LastEntityID)
	b.retireRegLocked(ss)
	docs := ss.docList()
	b.mu.Unlock()
	// Documents whose streams were not all sent cannot finish here: abort
	// their attempt on this session and re-dispatch on the next one (profile 7).
	eachDoc(b.reg, docs, ss.carries, func(d *docRun) {
		if !d.att.sendDone && !d.uploading {
			d.abortAttemptLocked("peer sent GOAWAY before the document was fully sent", false)
		}
	})
}

func (h *handler) HandleEntity(s *quicpeer.Session, e *quicpeer.IncomingEntity) {
	h.b.notePeerEntity(h.ss)
	h.b.onResult(h.ss, e)
}

func (h *handler) HandleClose(s *quicpeer.Session, err error) {
	b := h.b
	b.mu.Lock()
	reason := b.onSessionClosedLocked(h.ss, err)
	docs := h.ss.docList()
	b.mu.Unlock()
	eachDoc(b.reg, docs, h.ss.carries, func(d *docRun) {
		// An attempt counts against MaxDispatchAttempts only when its
		// session got to carry it (the peer reported on it); one that a
		// session ending at once never reached is not the document's fault.
		d.abortAttemptLocked(reason, d.att.carried)
	})
}

// docList is a snapshot of the documents in flight on ss (caller holds the
// registry's mu).
func (ss *sessState) docList() []*docRun {
	docs := make([]*docRun, 0, len(ss.docs))
	for d := range ss.docs {
		docs = append(docs, d)
	}
	return docs
}

// carries says whether d is still in flight on ss (caller holds the
// registry's mu).
func (ss *sessState) carries(d *docRun) bool {
	_, ok := ss.docs[d]
	return ok
}

// statusDoc names the document a STATUS frame on ss touches (nil: none),
// as onStatusRegLocked will resolve it (caller holds the registry's mu).
func (ss *sessState) statusDoc(f wire.StatusFrame) *docRun {
	if f.EntityID == wire.ConnectionEntity || f.Status == wire.StatusUnspecified {
		return nil
	}
	if ref := ss.ents[entKey{scope: f.ScopeID, id: f.EntityID}]; ref != nil {
		return ref.att.d
	}
	if f.ScopeID == 0 {
		return nil
	}
	if own := ss.scopes[f.ScopeID]; own != nil {
		return own.att.d
	}
	if idx := ss.guessParent(f); idx >= 0 {
		return ss.dehyd[idx].att.d
	}
	return nil
}

// guessParent is the index in ss.dehyd of the entity a status in a scope
// no BARRIER named is attributed to (newScopeEntityRegLocked), or -1.
func (ss *sessState) guessParent(f wire.StatusFrame) int {
	idx := -1
	for i, p := range ss.dehyd {
		if p.depth+1 == f.Depth || (f.Depth == 0 && idx < 0) {
			idx = i
			break
		}
	}
	if idx < 0 && len(ss.dehyd) > 0 {
		idx = 0
	}
	return idx
}

// statusApply is the document's part of a STATUS frame: what
// onStatusRegLocked resolved under the registry's mu, applied by apply
// under the document's lock alone.
type statusApply struct {
	f   wire.StatusFrame
	ref *entRef
	e   *gatewayv1.Entity
	// inline: the root's result, carried by its COMPLETE (profile 4.3.2),
	// when the attempt offered it; nil otherwise (the extension skipped).
	inline *inlineResult
	// waiter: the redemption this status answers (the redeemed entity's
	// first status since), taken out of the session's waiters; nil if none.
	waiter *redeemWaiter
}

// onStatusRegLocked applies the session's part of a STATUS frame from the
// peer (profile 3-6) under the registry's mu and the document's lock (if
// any): redemption waiters, the entity mapping (a new scope entity's
// first status), the session proven, a DEHYDRATING parent recorded. It
// returns the document's part, with no ref when the frame touches no
// live entity of a current attempt, and with in, the root's inline
// result, when its attempt offered one (attributed as its result).
func (b *Bridge) onStatusRegLocked(ss *sessState, f wire.StatusFrame, in *inlineResult) statusApply {
	if f.EntityID == wire.ConnectionEntity || f.Status == wire.StatusUnspecified {
		return statusApply{} // cursor update or heartbeat
	}
	sk := entKey{scope: f.ScopeID, id: f.EntityID}
	w := ss.waiters[sk]
	if w != nil {
		delete(ss.waiters, sk) // answered by HandleStatus, after the status applies
	}
	st := b.resolveStatusRegLocked(ss, f, in, sk)
	st.waiter = w
	return st
}

// resolveStatusRegLocked is onStatusRegLocked's part after the redemption
// waiters: the entity mapping, the session proven, a DEHYDRATING parent.
func (b *Bridge) resolveStatusRegLocked(ss *sessState, f wire.StatusFrame, in *inlineResult, sk entKey) statusApply {
	ref := ss.ents[sk]
	if ref == nil {
		if f.ScopeID == 0 {
			b.log.Debug("bridge: status for an unknown root-scope entity", "entity", f.EntityID, "status", f.Status)
			return statusApply{}
		}
		ref = b.newScopeEntityRegLocked(ss, f)
		if ref == nil {
			return statusApply{}
		}
	}
	a := ref.att
	if !a.current() || a.ss != ss {
		// Race rule (profile 3): we already finished or moved this document.
		return statusApply{}
	}
	e := a.ents[ref.key]
	if e == nil {
		return statusApply{}
	}
	if !ss.proven {
		b.proveSessionLocked(ss) // the peer reported on a document: the session carries work
	}
	if f.Status == wire.StatusDehydrating && e.Status != entityStatus(f.Status) {
		p := parentRef{att: a, key: ref.key, depth: f.Depth}
		ss.dehyd = append(ss.dehyd, p)
		ss.lastDehyd[f.EntityID] = p
	}
	return statusApply{f: f, ref: ref, e: e, inline: inlineForRegLocked(b.docEnv, ss, ref, in)}
}

// apply is the document's part of a STATUS frame (caller holds the
// document's lock alone): the entity's new status, the children's and
// the root's consequences, a claim check.
func (st *statusApply) apply() {
	f, ref, e := st.f, st.ref, st.e
	a, d := ref.att, ref.att.d
	a.carried, d.waitSince = true, time.Time{}
	d.env.m.entityStatus.WithLabelValues(f.Status.String()).Inc()
	e.Status = entityStatus(f.Status)
	if f.ScopeID != 0 {
		e.Depth = uint32(f.Depth)
	}
	if f.Status == wire.StatusRetrying {
		e.Attempts++
	}
	if f.Status == wire.StatusComplete {
		e.Message = ""
	}
	d.setEntity(ref.key, e)
	if ref.key.scope == 0 {
		a.entSince[ref.key] = time.Now()
	}
	if ref.key != rootKey(a.rootID) {
		a.mode.childChangedLocked(d)
	}
	if f.Status == wire.StatusDeferred && f.HasExt {
		d.onDeferredLocked(ref, f)
	}
	if st.inline != nil {
		a.takeInlineLocked(st.inline) // the result first: COMPLETE then finishes the document
	}
	if ref.key.scope == 0 && ref.key.id == a.rootID {
		d.onRootStatusLocked(f.Status)
	}
	d.env.kickFlush()
}

// onBarrierRegLocked attributes a peer scope to its parent (profile 6): a
// waiting BARRIER(S, E) follows STATUS(E, DEHYDRATING) on stream 0, and E's
// scope is that of the latest DEHYDRATING status with entity ID E. A
// released BARRIER needs nothing: SCOPE_DIGEST already closed the scope.
func (b *Bridge) onBarrierRegLocked(ss *sessState, f wire.BarrierFrame) {
	if f.Released {
		return
	}
	p, ok := ss.lastDehyd[f.ParentEntityID]
	if !ok {
		b.log.Warn("bridge: BARRIER names a parent the peer never reported DEHYDRATING", "scope", f.ScopeID, "parent", f.ParentEntityID)
		return
	}
	delete(ss.lastDehyd, f.ParentEntityID)
	for i, q := range ss.dehyd {
		if q == p {
			ss.dehyd = append(ss.dehyd[:i], ss.dehyd[i+1:]...)
			break
		}
	}
	if old := ss.scopes[f.ScopeID]; old != nil {
		b.log.Warn("bridge: peer reused a scope ID before its SCOPE_DIGEST", "scope", f.ScopeID, "parent", f.ParentEntityID)
	}
	b.ownScopeRegLocked(ss, f.ScopeID, p)
}

// ownScopeRegLocked records that scope belongs to parent p: the next instance
// of that scope ID in p's attempt.
func (b *Bridge) ownScopeRegLocked(ss *sessState, scope uint32, p parentRef) *scopeOwner {
	a := p.att
	inst := a.scopeUses[scope]
	a.scopeUses[scope] = inst + 1
	own := &scopeOwner{att: a, parent: p.key, inst: inst, depth: p.depth + 1}
	ss.scopes[scope] = own
	for k := range ss.ents { // a reused scope ID: forget the previous use's entities
		if k.scope == scope {
			delete(ss.ents, k)
		}
	}
	return own
}

// newScopeEntityRegLocked registers the first status of an entity in a
// peer-allocated scope (Layer 1). The scope's owner comes from the peer's
// BARRIER (profile 6). For a peer that sends no BARRIER the scope is
// guessed: the oldest entity reported DEHYDRATING at depth-1 that has no
// scope yet (logged once per session).
func (b *Bridge) newScopeEntityRegLocked(ss *sessState, f wire.StatusFrame) *entRef {
	own := ss.scopes[f.ScopeID]
	if own == nil {
		idx := ss.guessParent(f)
		if idx < 0 {
			b.log.Warn("bridge: status in an unknown scope with no dehydrating parent", "scope", f.ScopeID, "entity", f.EntityID)
			return nil
		}
		p := ss.dehyd[idx]
		ss.dehyd = append(ss.dehyd[:idx], ss.dehyd[idx+1:]...)
		if ss.lastDehyd[p.key.id] == p {
			delete(ss.lastDehyd, p.key.id)
		}
		if !ss.guessLog {
			ss.guessLog = true
			b.log.Warn("bridge: the peer sent no BARRIER naming the parent of a new scope (profile 6); attributing it to the oldest DEHYDRATING entity",
				"scope", f.ScopeID, "parent", p.key.id)
		}
		own = b.ownScopeRegLocked(ss, f.ScopeID, p)
	}
	a := own.att
	if !a.newest() {
		return nil // a scope of an earlier attempt, or of a finished document
	}
	sk := entKey{scope: f.ScopeID, id: f.EntityID}
	key := entKey{scope: f.ScopeID, inst: own.inst, id: f.EntityID}
	ref := &entRef{att: a, key: key}
	bindEntRegLocked(ss, sk, ref)
	if a.ents[key] == nil {
		a.ents[key] = &gatewayv1.Entity{EntityId: f.EntityID, ScopeId: f.ScopeID, Depth: uint32(f.Depth),
			ParentId: own.parent.id, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PENDING}
	}
	return ref
}

// onRootStatusLocked maps the root's status to the document (profile 5).
func (d *docRun) onRootStatusLocked(s wire.Status) {
	a := d.att
	switch s {
	case wire.StatusProcessing, wire.StatusDehydrating, wire.StatusRehydrating, wire.StatusRetrying:
		if d.rec.Doc.State == gatewayv1.State_PENDING {
			d.setState(gatewayv1.State_RUNNING, "")
		}
	case wire.StatusComplete:
		a.rootComplete = true
		d.maybeFinishLocked()
	case wire.StatusFailed:
		a.rootFailures++
		if a.rootFailures <= d.plan.retries() && a.rootChildren() == 0 {
			// A whole document under on-failure RETRY: the peer retries it
			// itself (FAILED -> RETRYING); give up if it does not.
			d.armFinishTimerLocked(time.Duration(d.plan.opts.GetCompletionPolicy().GetRetryDelayMs())*time.Millisecond+5*time.Second,
				"the peer reported FAILED for the document and did not retry it")
			return
		}
		c, t := a.allChildrenComplete()
		msg := "the peer reported FAILED for the document"
		if t > 0 {
			msg = fmt.Sprintf("the peer reported FAILED for the document under completion policy %s: %d of %d chunks completed",
				d.plan.opts.GetCompletionPolicy().GetMode(), c, t)
		}
		if a.resultErr != "" {
			// Storing the result failed here first: the peer's FAILED is
			// its consequence, not the cause.
			msg = "the gateway failed, not the peer: " + a.resultErr
		}
		d.finishLocked(gatewayv1.State_FAILED, msg)
	case wire.StatusAbandoned:
		d.finishLocked(gatewayv1.State_FAILED, "the peer abandoned the document (timeout)")
	case wire.StatusSkipped:
		d.finishLocked(gatewayv1.State_FAILED, "the peer skipped the document")
	}
}

// maybeFinishLocked finishes the document once COMPLETE(root) and a verified
// result both arrived (profile 4.3).
func (d *docRun) maybeFinishLocked() {
	a := d.att
	if d.terminal() || !a.rootComplete {
		return
	}
	if a.resultErr != "" {
		d.finishLocked(gatewayv1.State_FAILED, a.resultErr)
		return
	}
	if !a.resultReady {
		if a.mode.awaitResultLocked(d) {
			return
		}
		d.armFinishTimerLocked(resultFinishGrace, "the peer reported COMPLETE but sent no result stream")
		return
	}
	state := gatewayv1.State_SUCCEEDED
	c, t := a.allChildrenComplete()
	msg := ""
	if c < t {
		state = gatewayv1.State_PARTIALLY_SUCCEEDED
		msg = fmt.Sprintf("%d of %d entities completed under completion policy %s", c, t, d.plan.opts.GetCompletionPolicy().GetMode())
	}
	if d.rec.Doc.Error != "" && msg != "" {
		msg = d.rec.Doc.Error + "; " + msg
	} else if d.rec.Doc.Error != "" {
		msg = d.rec.Doc.Error
	}
	d.finishLocked(state, msg)
}

// armFinishTimerLocked finishes d with msg after the given time unless its
// attempt got further by then (or was replaced).
func (d *docRun) armFinishTimerLocked(after time.Duration, msg string) {
	a := d.att
	a.stopFinishTimer()
	a.finishTimer = time.AfterFunc(after, func() {
		d.lock()
		defer d.unlock()
		if !a.newest() {
			return
		}
		if a.rootComplete && a.resultReady {
			d.maybeFinishLocked()
			return
		}
		if e := a.ents[rootKey(a.rootID)]; e != nil && e.Status != gatewayv1.EntityStatus_ENTITY_STATUS_FAILED && !a.rootComplete {
			return // the peer retried meanwhile
		}
		d.finishLocked(gatewayv1.State_FAILED, msg)
	})
}

// takeDigestScopeRegLocked takes the scope a SCOPE_DIGEST closes off the
// session (the peer may recycle the scope ID after its digest) with its
// entity mappings, and returns its owner (nil: an unknown scope). Caller
// holds the registry's mu and the owner's document's lock.
func (b *Bridge) takeDigestScopeRegLocked(ss *sessState, f wire.ScopeDigestFrame) *scopeOwner {
	own := ss.scopes[f.ScopeID]
	if own == nil {
		b.log.Warn("bridge: SCOPE_DIGEST for an unknown scope", "scope", f.ScopeID)
		return nil
	}
	delete(ss.scopes, f.ScopeID)
	for k, r := range ss.ents {
		if k.scope == f.ScopeID && r.att.d == own.att.d {
			delete(ss.ents, k)
		}
	}
	return own
}

// onDigestLocked records a SCOPE_DIGEST of scope own of a and verifies its
// Merkle root against the statuses observed in that scope (profile 6,
// draft Section 9.5). Caller holds the document's lock.
func (a *attempt) onDigestLocked(own *scopeOwner, f wire.ScopeDigestFrame) {
	d := a.d
	var leaves []wire.Leaf
	for k, e := range a.ents {
		if k.scope == f.ScopeID && k.inst == own.inst {
			leaves = append(leaves, wire.Leaf{EntityID: k.id, Status: wire.Status(e.Status)})
		}
	}
	root := wire.MerkleRoot(leaves)
	ok := root == f.MerkleRoot
	dg := &gatewayv1.ScopeDigest{ScopeId: f.ScopeID, EntitiesProcessed: f.Processed, EntitiesSucceeded: f.Succeeded,
		EntitiesFailed: f.Failed, EntitiesDeferred: f.Deferred, MerkleRoot: hexSum(f.MerkleRoot[:]), Verified: ok}
	// Scope IDs may be recycled by the peer: digests are keyed by the
	// scope's instance (and the attempt), never overwritten.
	key := scopeKey{f.ScopeID, own.inst}
	a.digests[key] = dg
	d.out.putDigest(a.gen, key, dg)
	if !ok {
		d.env.m.digestMismatch.Inc()
		d.env.log.Error("bridge: SCOPE_DIGEST Merkle root mismatch", "doc", d.id, "scope", f.ScopeID,
			"reported", dg.MerkleRoot, "recomputed", hexSum(root[:]), "leaves", len(leaves))
		msg := fmt.Sprintf("scope digest mismatch in scope %d: the peer's Merkle root %s differs from the recomputed %s",
			f.ScopeID, dg.MerkleRoot, hexSum(root[:]))
		d.appendError(msg)
	}
	d.addEvent(&gatewayv1.Event{Kind: kindStatus, ScopeId: f.ScopeID, EntityId: own.parent.id,
		EntityStatus: a.ents[own.parent].GetStatus(), Name: "ScopeDigest", Message: fmt.Sprintf("verified=%v", ok)})
}

// onDeferredLocked records the claim check of a DEFERRED status (profile 6).
func (d *docRun) onDeferredLocked(ref *entRef, f wire.StatusFrame) {
	ext, err := f.ClaimCheck()
	if err != nil {
		d.env.log.Warn("bridge: DEFERRED status with a malformed claim check extension", "doc", d.id, "entity", f.EntityID, "err", err)
		return
	}
	id := strconv.FormatUint(ext.ClaimID, 10)
	now := time.Now()
	c := &gatewayv1.ClaimCheck{
		Name: "claims/" + id, ClaimId: id, DocumentId: d.id, EntityId: f.EntityID, ScopeId: f.ScopeID,
		State:      gatewayv1.ClaimCheck_ISSUED,
		ExpireTime: timestamppb.New(time.UnixMicro(int64(ext.ExpiryMicros))),
		CreateTime: timestamppb.New(now),
	}
	cr := &claimRun{c: c, key: ref.key, att: ref.att, slot: ref.att.slotOf(ref.key)}
	d.claims[id] = cr
	d.out.claims[id] = true
	d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: id, ClaimAction: "issued", EntityId: f.EntityID, ScopeId: f.ScopeID})
	d.env.m.claims.WithLabelValues("issued").Inc()
	if via, ok := d.preRedeem[cr.slot]; ok && cr.slot != noSlot {
		// The client already redeemed this slot's claim of an earlier
		// attempt: resume the entity through the new claim (profile 6)
		// once the new claim is durable (resumeDurableLocked, after the
		// flush that writes it): the store redeems only what it holds.
		delete(d.preRedeem, cr.slot)
		if d.resumeVia == nil {
			d.resumeVia = map[string]string{}
		}
		d.resumeVia[id] = via
		d.env.kickFlush()
	}
}

// resumeDurableLocked resumes, through their new claims, the entities
// whose earlier claim the client redeemed before the current attempt
// deferred them again, for the claims a flush has just made durable
// (claims). Caller holds mu; the redemptions run without it.
func (d *docRun) resumeDurableLocked(claims map[string]bool) {
	for id, via := range d.resumeVia {
		if !claims[id] {
			continue
		}
		delete(d.resumeVia, id)
		d.env.wg.Add(1)
		go func() {
			defer d.env.wg.Done()
			if _, err := d.env.redeemRun(d.env.ctx, d, id, via, d.localCommit(id)); err != nil {
				d.env.log.Warn("bridge: resuming a re-deferred entity through an earlier claim failed", "doc", d.id, "claim", id, "via", via, "err", err)
			}
		}()
	}
}

// onSessionClosedLocked fails the non-terminal entities of the session's
// documents locally and re-dispatches those documents (profile 7, 8).
func (b *Bridge) onSessionClosedLocked(ss *sessState, err error) string {
	ss.closed, ss.closedAt = true, time.Now()
	if err != nil {
		ss.closeErr = err.Error()
	}
	failed := b.noteSessionEndLocked(ss, err)
	if pc := ss.pc; !failed && (pc.active == ss || pc.active == nil) && ss.mode.endMeansPeerDown() {
		// The peer is down until a new session is up (a draft-04 session
		// ends after every document: its peer stays idle).
		pc.ok, pc.lastErr, pc.errAt = false, "session lost: "+ss.closeErr, ss.closedAt
		if err == nil {
			pc.lastErr = "session closed"
		}
	}
	b.retireRegLocked(ss)
	delete(b.sessions, ss)
	delete(b.attrib, ss)
	b.kick() // a draft-04 dial may wait for this session to end
	reason := fmt.Sprintf("the session to the PipeStream peer %s closed", ss.pc.addr)
	if err != nil {
		reason = fmt.Sprintf("the session to the PipeStream peer %s was lost: %v", ss.pc.addr, err)
	}
	if len(ss.docs) > 0 {
		b.log.Warn("bridge: session ended with documents in flight; re-dispatching", "addr", ss.pc.addr, "docs", len(ss.docs), "err", err)
	}
	return reason
}

// abortAttemptLocked ends d's current attempt: non-terminal entities become
// FAILED locally, sending stops, and the document is queued again (counted
// against MaxDispatchAttempts when countIt).
func (d *docRun) abortAttemptLocked(reason string, countIt bool) {
	if d.terminal() {
		return
	}
	a := d.att
	if ss := d.sess(); ss != nil {
		ss.pc.aborted.Inc()
		if !d.leaveSession(ss) {
			d.env.sendCancelLocked(ss, d)
		}
	}
	releaseSessLocked(a)
	a.stopSending()
	for k, e := range a.ents {
		if !terminalEntity(e.Status) && e.Status != gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED {
			e.Status = gatewayv1.EntityStatus_ENTITY_STATUS_FAILED
			e.Message = reason
			d.setEntity(k, e)
		}
	}
	a.ended = true
	a.stopFinishTimer()
	if !countIt {
		d.rec.DispatchAttempts-- // not the document's fault (GOAWAY)
	}
	if d.rec.DispatchAttempts >= uint32(d.env.opts.MaxDispatchAttempts) {
		d.finishLocked(gatewayv1.State_FAILED, fmt.Sprintf("gave up after %d dispatch attempts (MaxDispatchAttempts); last error: %s",
			d.rec.DispatchAttempts, reason))
		return
	}
	if d.uploading {
		return // the upload re-queues the document once its content is spooled
	}
	d.env.m.retries.Inc()
	d.enqueueLocked()
}

// sendCancelLocked tells the peer to stop work on d's root: ABANDONED with
// Layer 2, else FAILED (profile 7).
func (env *docEnv) sendCancelLocked(ss *sessState, d *docRun) {
	if d.att.rootID == 0 || ss.s == nil {
		return
	}
	env.giveUpLocked(ss, d, d.att.rootID)
}

// giveUpLocked tells the peer the gateway gave up on root-scope entity id
// of d: ABANDONED with Layer 2, else FAILED (profile 7). The frame is
// written after the caller releases the lock (ctrlout.go).
func (env *docEnv) giveUpLocked(ss *sessState, d *docRun, id uint32) {
	st := wire.StatusFailed
	if ss.n.Layer2 {
		st = wire.StatusAbandoned
	}
	env.sendStatusLocked(ss, d.id, wire.StatusFrame{Status: st, EntityID: id})
}

// onResult receives an entity the peer sent: its session's mode
// attributes it (peerMode.attributeRegLocked: mode_plain.go, mode_profile.go)
// and reads it as a result, or it is refused (logged and counted).
func (b *Bridge) onResult(ss *sessState, e *quicpeer.IncomingEntity) {
	b.mu.Lock()
	mode := ss.mode
	d := lockFound(b.reg, func() *docRun { return resultDocRegLocked(ss, e.Header) })
	ref, r := mode.attributeRegLocked(b.docEnv, ss, e.Header)
	b.mu.Unlock()
	unlockFound(d)
	if ref == nil {
		b.refuseResult(ss, e, r)
		return
	}
	mode.takeResult(b.docEnv, ref, e)
}

// onWholeResult reads a whole result of a's document (profile 4.3): a
// small result is kept for the flush that commits the terminal state, a
// large one goes to the result file (content.go).
func (a *attempt) onWholeResult(e *quicpeer.IncomingEntity) {
	h, d := e.Header, a.d
	inline, spooled, n, err := a.d.env.readResult(d.id, e.Payload, h.PayloadLength, d.diskRetryFor())
	a.d.env.m.bytesOut.Add(float64(n))
	a.d.lock()
	defer a.d.unlock()
	if !a.newest() {
		return
	}
	if err != nil {
		d.resultFailedLocked(err, "storing the result failed")
		return
	}
	a.resultReady = true
	d.out.result = inline
	d.rec.ResultPayload = spooled
	d.rec.ResultContentType = h.ContentType
	d.rec.Doc.ResultSizeBytes = uint64(n)
	d.maybeFinishLocked()
	a.d.env.kickFlush()
}

// resultDocRegLocked names the document whose root an entity the peer sent may
// answer (its parent-id's, else its entity-id's), or nil; attribution
// decides (caller holds the registry's mu).
func resultDocRegLocked(ss *sessState, h *wire.EntityHeader) *docRun {
	id := h.EntityID
	if h.ParentID != nil {
		id = *h.ParentID
	}
	if ref := ss.ents[rootKey(id)]; ref != nil {
		return ref.att.d
	}
	return nil
}

func scopeOf(h *wire.EntityHeader) uint32 {
	if h.ScopeID == nil {
		return 0
	}
	return *h.ScopeID
}
