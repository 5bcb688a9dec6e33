package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// checkClaimID validates a claim id: the decimal form of a 64-bit id.
func checkClaimID(id string) error {
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return invalidf("claim id %q must be a decimal 64-bit number", id)
	}
	return nil
}

func publicClaim(c *gatewayv1.ClaimCheck, now time.Time) *gatewayv1.ClaimCheck {
	out := proto.Clone(c).(*gatewayv1.ClaimCheck)
	out.Name = "claims/" + out.ClaimId
	if out.State == gatewayv1.ClaimCheck_ISSUED && out.ExpireTime != nil && !now.Before(out.ExpireTime.AsTime()) {
		out.State = gatewayv1.ClaimCheck_EXPIRED
	}
	return out
}

// GetClaim returns a claim check of the tenant.
func (b *Bridge) GetClaim(ctx context.Context, t Tenant, claimID string) (*gatewayv1.ClaimCheck, error) {
	if err := checkClaimID(claimID); err != nil {
		return nil, err
	}
	rec, err := b.st.GetClaim(ctx, string(t), claimID)
	if err != nil {
		return nil, mapStoreErr("claim "+claimID, err)
	}
	return publicClaim(rec.Claim, time.Now()), nil
}

// Redeem resumes a deferred entity exactly once (profile 6): the store
// moves the claim ISSUED -> REDEEMED atomically, then the original payload
// is sent again with pipestream.claim-id, and Redeem waits for the peer's
// answer (the redeemed entity's next status, or the stream abort). A replay
// answers ErrClaimRedeemed, an expired claim ErrClaimExpired, an unknown one
// (or another tenant's) ErrNotFound.
//
// A claim issued to an earlier dispatch attempt of the document (the
// document was re-dispatched after a lost session or a gateway restart)
// stays redeemable: the new attempt sends the same chunk again, and the peer
// defers it again with a new claim; redeeming the old claim resumes the
// entity through the new one (at once, or as soon as the new attempt
// defers it). Both claims end REDEEMED; the events say which one carried
// the redemption.
func (b *Bridge) Redeem(ctx context.Context, t Tenant, claimID string) (*gatewayv1.ClaimCheck, error) {
	if err := checkClaimID(claimID); err != nil {
		return nil, err
	}
	now := time.Now()
	rec, err := b.redeemableClaim(ctx, t, claimID, now)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.docs[rec.Claim.DocumentId] == nil && b.shared() {
		b.mu.Unlock()
		return b.redeemForOwner(ctx, t, rec, now)
	}
	locked := lockFound(b.reg, func() *docRun { return b.docs[rec.Claim.DocumentId] })
	d, cr, err := b.claimToRedeemLocked(rec.Claim.DocumentId, claimID)
	running := false
	if err == nil {
		if running = cr.att.current(); !running {
			err = d.issuerGoneRegLocked(cr, claimID)
		}
	}
	b.mu.Unlock()
	unlockFound(locked)
	if err != nil {
		return nil, b.settledRefusal(ctx, t, claimID, err)
	}
	commit := func(ctx context.Context, msg string) (*gatewayv1.ClaimCheck, error) {
		return b.commitRedeem(ctx, t, rec.Claim.DocumentId, rec.Claim, now, msg)
	}
	if running {
		return b.redeemRun(ctx, d, claimID, "", commit)
	}
	return b.redeemEarlier(ctx, d, cr, claimID, commit)
}

// settledRefusal answers a redemption refused for the state of the
// claim's document (finished, re-dispatched...): when the claim was
// redeemed or expired meanwhile, that is the answer. A concurrent
// redemption may have committed, and its document finished, between this
// one's read of the claim and its look at the document.
func (b *Bridge) settledRefusal(ctx context.Context, t Tenant, claimID string, refusal error) error {
	if _, err := b.redeemableClaim(ctx, t, claimID, time.Now()); err != nil {
		return err
	}
	return refusal
}

// redeemCommit makes a redemption durable, with its #claim redeemed event
// (msg says how), and returns the claim as stored: commitRedeem for a
// redemption through this gateway, a read of the committed claim for one
// another replica committed with its event (remoteclaims.go).
type redeemCommit func(ctx context.Context, msg string) (*gatewayv1.ClaimCheck, error)

// expireClaimLocked marks claim r EXPIRED on d, the claim's document, and
// reports whether d holds it; an ISSUED claim of a document not running
// here is marked in the store (an orphan).
func (d *docRun) expireClaimLocked(r *store.ClaimRecord) bool {
	id := r.Claim.ClaimId
	if d.claims[id] == nil || d.terminal() {
		return false
	}
	cr := d.claims[id]
	if cr.c.State != gatewayv1.ClaimCheck_ISSUED {
		return true
	}
	cr.c.State = gatewayv1.ClaimCheck_EXPIRED
	d.out.claims[id] = true
	d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: id, ClaimAction: "expired", EntityId: r.Claim.EntityId, ScopeId: r.Claim.ScopeId})
	d.env.m.claims.WithLabelValues("expired").Inc()
	return true
}

// claimToRedeemLocked finds the running document of claim claimID and the
// claim there, or says why it cannot be redeemed. Caller holds mu.
func (b *Bridge) claimToRedeemLocked(docID, claimID string) (*docRun, *claimRun, error) {
	what := "claim " + claimID
	d := b.docs[docID]
	if d == nil || d.terminal() {
		return nil, nil, fmt.Errorf("%s belongs to document %s, which is finished; nothing waits for it: %w", what, docID, ErrFailedPrecondition)
	}
	cr := d.claims[claimID]
	switch {
	case cr == nil || cr.slot == noSlot && cr.key.scope == 0:
		return nil, nil, fmt.Errorf("%s was issued to an earlier dispatch of document %s whose entity the gateway no longer knows; redeem the document's newest claim: %w",
			what, d.id, ErrFailedPrecondition)
	case cr.key.scope != 0:
		return nil, nil, fmt.Errorf("%s defers an entity the peer created in its scope %d; the gateway has no payload to resume it: %w",
			what, cr.key.scope, ErrFailedPrecondition)
	}
	return d, cr, nil
}

// issuerGoneRegLocked refuses the redemption of a claim whose entity waits at
// a peer that is gone: the session of the attempt that got the claim ended,
// its peer has no session now, and the document runs on no other peer yet
// (it is queued for re-dispatch, or waits for any peer). The client
// retries: once the document runs again, on any peer, the claim resumes it
// through the new attempt's claim (redeemEarlier). A claim of an attempt of
// an earlier process (no session known) takes the redeemEarlier path as
// before. Caller holds d's lock and the registry's mu.
func (d *docRun) issuerGoneRegLocked(cr *claimRun, claimID string) error {
	ss := cr.att.ss
	if ss == nil || !ss.closed || d.att.current() || ss.pc.usableLocked() != nil {
		return nil
	}
	d.env.m.claims.WithLabelValues("peer_unavailable").Inc()
	since := ss.closedAt.UTC().Format(time.RFC3339)
	why := "its session ended"
	if ss.closeErr != "" {
		why = "its session was lost: " + ss.closeErr
	}
	if pc := ss.pc; pc.lastErr != "" && pc.errAt.After(ss.closedAt) {
		why += "; reconnecting fails: " + pc.lastErr
	}
	return fmt.Errorf("claim %s was issued by the PipeStream peer %s, unreachable since %s (%s); document %s is queued to run again "+
		"on a healthy peer: retry the redemption in a few seconds (once the document runs again, on any peer, this claim resumes "+
		"the entity through the new attempt's claim): %w", claimID, ss.pc.addr, since, why, d.id, ErrPeerUnavailable)
}

// redeemEarlier redeems cr, a claim of an earlier attempt of d: the store
// marks it REDEEMED, and the entity is resumed through the current
// attempt's claim for the same chunk (or root): at once when that claim
// is issued already, else as soon as the peer defers the chunk again
// (preRedeem, onDeferredLocked).
func (b *Bridge) redeemEarlier(ctx context.Context, d *docRun, cr *claimRun, claimID string, commit redeemCommit) (*gatewayv1.ClaimCheck, error) {
	d.lock()
	cur := d.currentClaimLocked(cr.slot, claimID)
	msg := fmt.Sprintf("issued to dispatch attempt %d; resumes the entity of attempt %d", cr.att.gen, d.att.gen)
	d.unlock()
	stored, err := commit(ctx, msg)
	if err != nil {
		return nil, err
	}
	d.lock()
	if cur == "" {
		// The current attempt may have deferred the chunk while the store
		// committed the redemption (mu was not held): its claim is issued
		// now, and preRedeem would never be consumed.
		cur = d.currentClaimLocked(cr.slot, claimID)
	}
	switch {
	case cur == "": // resumed once the peer defers it again
		d.preRedeem[cr.slot] = claimID
	case !d.claims[cur].durable:
		// The store redeems only what it holds: resume through the new
		// claim once the flush that writes it commits (resumeDurableLocked).
		if d.resumeVia == nil {
			d.resumeVia = map[string]string{}
		}
		d.resumeVia[cur] = claimID
		cur = ""
	}
	d.redeemedLocked(cr, stored)
	d.out.claims[claimID] = true
	out := publicClaim(cr.c, time.Now())
	b.kickFlush()
	d.unlock()
	if cur != "" {
		if _, err := b.redeemRun(ctx, d, cur, claimID, d.localCommit(cur)); err != nil {
			return nil, fmt.Errorf("claim %s is redeemed, but resuming the entity through the current claim %s failed: %w", claimID, cur, err)
		}
	}
	return out, nil
}

// currentClaimLocked returns the ISSUED claim of d's running attempt for
// slot, other than except ("" when there is none). Caller holds mu.
func (d *docRun) currentClaimLocked(slot int64, except string) string {
	cur := ""
	for id, c := range d.claims {
		if id != except && c.att.current() && c.slot == slot && c.c.State == gatewayv1.ClaimCheck_ISSUED {
			cur = id
		}
	}
	return cur
}

// commitRedeem moves claim c (of document docID) from ISSUED to REDEEMED
// in the store, exactly once (a replay fails with ErrClaimRedeemed), with
// its #claim redeemed event (msg says how) in the same transaction, and
// returns the claim as stored. Every redemption goes through it, whichever
// replica commits it and whether the replica that drives the document is
// alive: a state change is never committed without its event. The event
// is outside the document's revision chain (rev 0): a replica that does
// not drive the document cannot move its rev, and the replica that does
// need not (redeemedLocked).
func (env *docEnv) commitRedeem(ctx context.Context, t Tenant, docID string, c *gatewayv1.ClaimCheck, now time.Time, msg string) (*gatewayv1.ClaimCheck, error) {
	claimID := c.GetClaimId()
	ev := &gatewayv1.Event{Kind: kindClaim, Time: timestamppb.New(now), DocumentId: docID, ClaimId: claimID,
		ClaimAction: "redeemed", EntityId: c.GetEntityId(), ScopeId: c.GetScopeId(), Message: msg}
	res, err := env.commit(ctx, &store.Batch{
		Redeem: &store.RedeemClaim{Tenant: string(t), ClaimID: claimID, Now: now},
		Events: []store.EventAppend{{Tenant: string(t), Event: ev}},
	})
	if err != nil {
		return nil, mapStoreErr("claim "+claimID, err)
	}
	env.m.claims.WithLabelValues("redeemed").Inc()
	return res.Claim, nil
}

// localCommit is the redeemCommit of a redemption through this gateway
// of claim claimID of d.
func (d *docRun) localCommit(claimID string) redeemCommit {
	return func(ctx context.Context, msg string) (*gatewayv1.ClaimCheck, error) {
		d.lock()
		var c *gatewayv1.ClaimCheck
		if cr := d.claims[claimID]; cr != nil {
			c = proto.Clone(cr.c).(*gatewayv1.ClaimCheck)
		}
		d.unlock()
		if c == nil {
			return nil, fmt.Errorf("claim %s of document %s is no longer known here; retry: %w", claimID, d.id, ErrUnavailable)
		}
		c.ClaimId = claimID
		return d.env.commitRedeem(ctx, d.tenant, d.id, c, time.Now(), msg)
	}
}

// redeemedLocked records on cr a redemption the store committed (stored)
// with its event (commitRedeem). Caller holds mu.
func (d *docRun) redeemedLocked(cr *claimRun, stored *gatewayv1.ClaimCheck) {
	cr.c = proto.Clone(stored).(*gatewayv1.ClaimCheck)
	cr.c.DocumentId = d.id
}

// redeemableClaim loads a claim and refuses one already redeemed or
// expired at now.
func (b *Bridge) redeemableClaim(ctx context.Context, t Tenant, claimID string, now time.Time) (*store.ClaimRecord, error) {
	what := "claim " + claimID
	rec, err := b.st.GetClaim(ctx, string(t), claimID)
	if err != nil {
		return nil, mapStoreErr(what, err)
	}
	switch c := rec.Claim; {
	case c.State == gatewayv1.ClaimCheck_REDEEMED:
		return nil, mapStoreErr(what, store.ErrClaimRedeemed)
	case c.State == gatewayv1.ClaimCheck_CANCELLED:
		return nil, mapStoreErr(what, store.ErrClaimCancelled)
	case c.State == gatewayv1.ClaimCheck_EXPIRED || (c.ExpireTime != nil && !now.Before(c.ExpireTime.AsTime())):
		return nil, mapStoreErr(what, store.ErrClaimExpired)
	}
	return rec, nil
}

// redeemRun redeems claim claimID of d's current attempt (via: the earlier
// claim the client redeemed, "" when it is this one) and waits for the
// peer's answer: the redeemed entity's next status on the session
// (PROCESSING or later: accepted; FAILED or ABANDONED: refused), or the
// stream abort with PIPESTREAM_CLAIM_EXPIRED / _CLAIM_NOT_FOUND. A peer
// that refuses after the payload was fully written only aborts the stream,
// which quic-go does not report once the stream was closed (FIN). A peer
// that has not answered within redeemAckTimeout (slow, or one such
// refusal) leaves the redemption pending: Redeem returns the claim as the
// store holds it (REDEEMED) and the answer is awaited and recorded later
// (redeemPending); silence is never recorded as a refusal. A refusal is
// recorded on the claim (event with a message), the entity and the
// document.
func (env *docEnv) redeemRun(ctx context.Context, d *docRun, claimID, via string, commit redeemCommit) (*gatewayv1.ClaimCheck, error) {
	what := "claim " + claimID
	d.lock()
	cr := d.claims[claimID]
	if cr == nil || !cr.att.current() {
		d.unlock()
		return nil, fmt.Errorf("document %s was re-dispatched or finished while %s was being redeemed; retry: %w", d.id, what, ErrUnavailable)
	}
	ss := cr.att.ss
	e := proto.Clone(cr.att.ents[cr.key]).(*gatewayv1.Entity)
	isRoot := cr.key == rootKey(cr.att.rootID)
	mode := cr.att.mode
	d.unlock()

	msg := ""
	if via != "" {
		msg = "redeemed through claim " + via + " of an earlier dispatch attempt"
	}
	stored, err := commit(ctx, msg)
	if err != nil {
		return nil, err
	}
	sk := entKey{id: e.EntityId}
	w := &redeemWaiter{d: d, claimID: claimID, ch: make(chan wire.Status, 1)}
	d.lock()
	d.redeemedLocked(cr, stored)
	env.regLock()
	ss.waiters[sk] = w
	env.regUnlock()
	env.kickFlush()
	d.unlock()

	if err := env.sendRedemption(ctx, d, ss, e, isRoot, mode, claimID); err != nil {
		if st, answered := env.dropWaiter(ss, sk, w); answered {
			// The peer answered before the send failed (a refusal, then
			// STOP_SENDING on the rest of the payload): the status handler
			// recorded that answer, which is the one Redeem reports; the
			// send's error is not recorded a second time.
			return env.answeredClaim(d, cr, claimID, st)
		}
		switch wire.CodeOf(err) {
		case wire.CodeClaimExpired:
			d.rejectClaim(claimID, gatewayv1.ClaimCheck_EXPIRED, "expired", "the peer refused the redemption: PIPESTREAM_CLAIM_EXPIRED")
			return nil, fmt.Errorf("the peer rejected %s as expired (PIPESTREAM_CLAIM_EXPIRED): %w", what, ErrClaimExpired)
		case wire.CodeClaimNotFound:
			d.rejectClaim(claimID, gatewayv1.ClaimCheck_REDEEMED, "rejected", "the peer refused the redemption: PIPESTREAM_CLAIM_NOT_FOUND (unknown or already redeemed)")
			return nil, fmt.Errorf("the peer does not know %s or it was redeemed before (PIPESTREAM_CLAIM_NOT_FOUND): %w", what, ErrClaimRedeemed)
		}
		return nil, fmt.Errorf("%s is redeemed but resuming the entity failed (%v); the document is re-dispatched if its session is lost: %w",
			what, err, ErrUnavailable)
	}
	t := time.NewTimer(redeemAckTimeout.Load())
	defer t.Stop()
	select {
	case st := <-w.ch:
		if err := redeemAnswerErr(claimID, st); err != nil {
			return nil, err
		}
	case <-t.C:
		// The peer has not answered yet: the redemption stays pending and
		// the peer decides it (redeemPending), never this timer.
		d.redeemPending(cr, claimID, ss, sk, w)
	case <-ss.s.Done():
		if st, answered := env.dropWaiter(ss, sk, w); answered {
			// The answer came with the session's last frames.
			return env.answeredClaim(d, cr, claimID, st)
		}
		d.carryRedemption(cr, claimID)
		return nil, fmt.Errorf("%s: the peer session ended before the peer acknowledged the redemption; the document is re-dispatched and the redemption resumes the entity through the new attempt's claim: %w", what, ErrUnavailable)
	case <-ctx.Done():
		// The caller left; the peer's answer is still recorded.
		d.redeemPending(cr, claimID, ss, sk, w)
		return nil, ctx.Err()
	}
	d.lock()
	out := publicClaim(cr.c, time.Now())
	d.unlock()
	return out, nil
}

// answeredClaim is Redeem's result once the peer answered the redemption
// (the status handler recorded the answer, answerLocked): the refusal's
// error, or the claim as it stands.
func (env *docEnv) answeredClaim(d *docRun, cr *claimRun, claimID string, st wire.Status) (*gatewayv1.ClaimCheck, error) {
	if err := redeemAnswerErr(claimID, st); err != nil {
		return nil, err
	}
	d.lock()
	defer d.unlock()
	return publicClaim(cr.c, time.Now()), nil
}

// redeemWaiter is a redemption waiting for the peer's answer: the redeemed
// entity's next status on the session. The status handler takes it out of
// the session's waiters (onStatusRegLocked), records the answer on the
// document in the same critical section as the status itself
// (answerLocked), and only then hands the status to ch. So whoever reads
// ch sees the answer recorded, and a refusal whose FAILED also finishes
// the document is recorded before the document's final flush, never after
// it (where it would be lost).
type redeemWaiter struct {
	d       *docRun
	claimID string
	ch      chan wire.Status // buffered: the answer, sent once, after it is recorded
	// pending is the wait reason redeemPending set while the answer is
	// awaited off the caller ("" while Redeem itself waits); guarded by
	// d's lock.
	pending string
}

// Why a refused redemption is recorded on the claim, entity and document.
const (
	whyRedeemFailed    = "the peer refused the redemption (FAILED for the redeemed entity)"
	whyRedeemAbandoned = "the peer abandoned the deferred entity: its claim expired before the redemption"
)

// answerLocked records the peer's answer st (the redeemed entity's next
// status) to the redemption (caller holds w.d's lock): FAILED is a
// refusal, ABANDONED an expiry at the peer, anything else an acceptance.
// A pending wait reason clears.
func (w *redeemWaiter) answerLocked(st wire.Status) {
	d := w.d
	d.clearWaitReasonLocked(w.pending)
	switch st {
	case wire.StatusFailed:
		d.rejectClaimLocked(w.claimID, gatewayv1.ClaimCheck_REDEEMED, "rejected", whyRedeemFailed)
	case wire.StatusAbandoned:
		d.rejectClaimLocked(w.claimID, gatewayv1.ClaimCheck_EXPIRED, "expired", whyRedeemAbandoned)
	}
}

// answered records st (answerLocked) under w.d's lock when the caller did
// not hold it, then hands st to whoever waits on the redemption.
func (w *redeemWaiter) answered(st wire.Status, recorded bool) {
	if !recorded {
		w.d.lock()
		w.answerLocked(st)
		w.d.unlock()
	}
	w.ch <- st // buffered, sent once: never blocks
}

// dropWaiter takes w out of ss's waiters when nobody answered it yet
// (answered false). When the status handler took it first, the answer is
// on its way (answered: recorded, then sent on w.ch) and dropWaiter
// returns it.
func (env *docEnv) dropWaiter(ss *sessState, sk entKey, w *redeemWaiter) (wire.Status, bool) {
	env.regLock()
	mine := ss.waiters[sk] == w
	if mine {
		delete(ss.waiters, sk)
	}
	env.regUnlock()
	if mine {
		return 0, false
	}
	return <-w.ch, true
}

// redeemAnswerErr is what Redeem returns for the peer's answer st to the
// redemption of claimID (recorded by answerLocked): FAILED is a refusal,
// ABANDONED an expiry at the peer, anything else an acceptance (nil).
func redeemAnswerErr(claimID string, st wire.Status) error {
	what := "claim " + claimID
	switch st {
	case wire.StatusFailed:
		return fmt.Errorf("the peer refused %s (FAILED for the redeemed entity): %w", what, ErrFailedPrecondition)
	case wire.StatusAbandoned:
		return fmt.Errorf("the peer abandoned the entity of %s: the claim expired at the peer: %w", what, ErrClaimExpired)
	}
	return nil
}

// redeemPending keeps waiting, off the caller, for the peer's answer to
// the redemption of claimID (issue 21 item 4: a claim is decided by the
// peer, not by a timer). Meanwhile the document's wait reason says that
// the redemption is pending (with a #document event, as for any wait
// reason); the status handler records the answer and clears it
// (redeemWaiter.answerLocked). When the attempt ends first (its session
// was lost, or it was aborted) and the document runs again, the
// redemption is carried to the next attempt (carryRedemption): it resumes
// the entity through the claim the peer issues there. A document that
// finished or was dropped records nothing more.
func (d *docRun) redeemPending(cr *claimRun, claimID string, ss *sessState, sk entKey, w *redeemWaiter) {
	a := cr.att
	why := fmt.Sprintf("claim %s is redeemed and its entity was sent to the PipeStream peer %s at %s; waiting for the peer's answer to the redemption",
		claimID, ss.pc.addr, time.Now().UTC().Format(time.RFC3339))
	d.lock()
	if a.current() {
		w.pending = why
		d.setWaitReason(why)
		d.env.kickFlush()
	}
	d.unlock()
	d.env.log.Info("bridge: the peer has not answered a redemption yet; it stays pending", "doc", d.id, "claim", claimID, "peer", ss.pc.addr)
	d.env.wg.Add(1)
	go func() {
		defer d.env.wg.Done()
		st, answered, closing := wire.Status(0), false, false
		select {
		case st = <-w.ch:
			answered = true
		case <-ss.s.Done(): // the session ended: the attempt is aborted
		case <-a.ctx.Done(): // aborted, finished or dropped
		case <-d.env.ctx.Done():
			closing = true
		}
		if !answered {
			st, answered = d.env.dropWaiter(ss, sk, w)
		}
		d.lock()
		d.clearWaitReasonLocked(why) // an answer recorded cleared it already
		d.unlock()
		switch {
		case answered:
			if err := redeemAnswerErr(claimID, st); err != nil {
				d.env.log.Warn("bridge: the peer answered a pending redemption with a refusal", "doc", d.id, "claim", claimID, "err", err)
			}
		case !closing:
			d.carryRedemption(cr, claimID) // when the document runs again
		}
	}()
}

// clearWaitReasonLocked clears the document's wait reason while it still
// is why (caller holds mu); a terminal document's state event already
// says why it stopped, so it clears without an event of its own.
func (d *docRun) clearWaitReasonLocked(why string) {
	if why == "" || d.rec.Doc.WaitReason != why {
		return
	}
	if d.terminal() {
		d.rec.Doc.WaitReason = ""
	} else {
		d.setWaitReason("")
	}
	d.env.kickFlush()
}

// carryRedemption carries a redemption the peer did not answer before its
// session ended to d's next attempt: when the peer defers the same chunk
// (or root) again, the entity is resumed through the new claim
// (preRedeem, onDeferredLocked), as for a claim of an earlier attempt.
func (d *docRun) carryRedemption(cr *claimRun, claimID string) {
	d.lock()
	defer d.unlock()
	if d.terminal() || d.dropped || cr.slot == noSlot || cr.key.scope != 0 {
		return
	}
	if d.preRedeem == nil {
		d.preRedeem = map[int64]string{}
	}
	d.preRedeem[cr.slot] = claimID
}

// rejectClaim records the peer's refusal of a redemption (rejectClaimLocked)
// under mu.
func (d *docRun) rejectClaim(claimID string, st gatewayv1.ClaimCheck_ClaimState, action, why string) {
	d.lock()
	defer d.unlock()
	d.rejectClaimLocked(claimID, st, action, why)
}

// rejectClaimLocked records the peer's refusal of a redemption on the claim
// (state and a #claim event with why), the deferred entity and the
// document (caller holds mu).
func (d *docRun) rejectClaimLocked(claimID string, st gatewayv1.ClaimCheck_ClaimState, action, why string) {
	d.env.m.claims.WithLabelValues(action).Inc()
	d.env.log.Warn("bridge: the peer refused a redemption", "doc", d.id, "claim", claimID, "why", why)
	cr := d.claims[claimID]
	if cr == nil {
		return
	}
	cr.c.State = st
	d.out.claims[claimID] = true
	msg := "claim " + claimID + ": " + why
	if e := d.att.ents[cr.key]; e != nil && cr.att == d.att {
		e.Message = msg
		d.out.putEntity(d.att.gen, cr.key, e)
	}
	d.appendError(msg)
	d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: claimID, ClaimAction: action, EntityId: cr.c.EntityId, ScopeId: cr.c.ScopeId, Message: why})
	d.env.kickFlush()
}

// sendRedemption sends the deferred entity's original payload again with
// pipestream.claim-id, reusing its entity ID on the session that saw the
// DEFERRED status (profile 6), read from the spool or the inline content.
// The payload is what the deferred entity carried: for a plain document's
// root the raw content (profile 9.1), else the envelope.
func (env *docEnv) sendRedemption(ctx context.Context, d *docRun, ss *sessState, e *gatewayv1.Entity, isRoot bool, mode peerMode, claimID string) error {
	f, err := env.openContent(ctx, d)
	if err != nil {
		return fmt.Errorf("open spool: %w", err)
	}
	defer f.Close()
	if isRoot {
		content, err := io.ReadAll(io.LimitReader(f, maxWholeBytes+1))
		if err != nil {
			return err
		}
		md := d.plan.rootMetadata(true)
		md[metaClaimID] = claimID
		payload, err := mode.rootPayload(env, ss, d, e.EntityId, content)
		if err != nil {
			return err
		}
		return ss.s.SendEntity(ctx, d.rootHeader(e.EntityId, payload, md), bytes.NewReader(payload))
	}
	if e.SizeBytes > maxChunkBytes {
		return fmt.Errorf("chunk of %d bytes exceeds the chunk limit", e.SizeBytes)
	}
	buf := make([]byte, e.SizeBytes)
	if _, err := f.ReadAt(buf, int64(e.ChunkOffset)); err != nil {
		return fmt.Errorf("read chunk from spool: %w", err)
	}
	parent := e.ParentId
	md := d.plan.childMetadata(uint64(e.ChunkIndex), true)
	md[metaClaimID] = claimID
	sum := sumOf(buf)
	h := &wire.EntityHeader{
		EntityID: e.EntityId, ParentID: &parent, Layer: 0, ContentType: d.rec.Doc.ContentType,
		PayloadLength: uint64(len(buf)), Checksum: sum[:], Metadata: md,
		ChunkInfo:        &wire.ChunkInfo{ChunkIndex: uint64(e.ChunkIndex), ChunkOffset: e.ChunkOffset},
		CompletionPolicy: d.plan.wirePolicy(),
	}
	return ss.s.SendEntity(ctx, h, bytes.NewReader(buf))
}

// closeClaimsLocked ends the open claims of d, which just became terminal:
// nothing waits for their deferred entities any more, so each ISSUED claim
// becomes CANCELLED (EXPIRED when its expiry has passed) with a #claim
// event. The claim rows and events go to the store in the outbox batch
// that carries the document's terminal update (one transaction); the
// store keeps a claim that a redemption committed first (ClaimRecord).
// Caller holds mu.
func (d *docRun) closeClaimsLocked() {
	now := time.Now()
	st := d.rec.Doc.GetState()
	for _, id := range sortedClaimIDs(d.claims) {
		cr := d.claims[id]
		if cr.c.State != gatewayv1.ClaimCheck_ISSUED {
			continue
		}
		state, action := gatewayv1.ClaimCheck_CANCELLED, "cancelled"
		msg := fmt.Sprintf("document %s is %s; nothing waits for the deferred entity", d.id, st)
		if exp := cr.c.ExpireTime; exp != nil && !now.Before(exp.AsTime()) {
			state, action, msg = gatewayv1.ClaimCheck_EXPIRED, "expired", ""
		}
		cr.c.State = state
		d.out.claims[id] = true
		d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: id, ClaimAction: action, EntityId: cr.c.EntityId, ScopeId: cr.c.ScopeId, Message: msg})
		d.env.m.claims.WithLabelValues(action).Inc()
	}
}

// sortedClaimIDs lists the ids of claims in ascending order (numeric ids
// compare by length first), so that their events have a stable order.
func sortedClaimIDs(claims map[string]*claimRun) []string {
	ids := make([]string, 0, len(claims))
	for id := range claims {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
	return ids
}

// sweepClaims marks ISSUED claims past their expiry EXPIRED.
func (b *Bridge) sweepClaims(ctx context.Context) {
	now := time.Now()
	recs, err := b.st.ListIssuedClaims(ctx, now)
	if err != nil {
		if !errors.Is(err, store.ErrClosed) && ctx.Err() == nil {
			b.log.Warn("bridge: listing expired claims failed", "err", err)
		}
		return
	}
	var orphans []store.ClaimRecord
	for _, r := range recs {
		d := lockDocOf(b.reg, func() *docRun { return b.docs[r.Claim.DocumentId] })
		if d == nil || !d.expireClaimLocked(r) {
			c := proto.Clone(r.Claim).(*gatewayv1.ClaimCheck)
			c.State = gatewayv1.ClaimCheck_EXPIRED
			orphans = append(orphans, store.ClaimRecord{Tenant: r.Tenant, Claim: c})
		}
		unlockFound(d)
	}
	b.kickFlush()
	if len(orphans) > 0 {
		if _, err := b.commit(ctx, &store.Batch{Claims: orphans}); err != nil && ctx.Err() == nil {
			b.log.Warn("bridge: marking expired claims failed", "err", err)
		}
	}
}
