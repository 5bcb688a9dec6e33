package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

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
// is sent again with pipestream.claim-id. A replay answers ErrClaimRedeemed,
// an expired claim ErrClaimExpired, an unknown one (or another tenant's)
// ErrNotFound.
func (b *Bridge) Redeem(ctx context.Context, t Tenant, claimID string) (*gatewayv1.ClaimCheck, error) {
	if err := checkClaimID(claimID); err != nil {
		return nil, err
	}
	what := "claim " + claimID
	rec, err := b.st.GetClaim(ctx, string(t), claimID)
	if err != nil {
		return nil, mapStoreErr(what, err)
	}
	now := time.Now()
	switch c := rec.Claim; {
	case c.State == gatewayv1.ClaimCheck_REDEEMED:
		return nil, mapStoreErr(what, store.ErrClaimRedeemed)
	case c.State == gatewayv1.ClaimCheck_EXPIRED || (c.ExpireTime != nil && !now.Before(c.ExpireTime.AsTime())):
		return nil, mapStoreErr(what, store.ErrClaimExpired)
	}
	b.mu.Lock()
	d := b.docs[rec.Claim.DocumentId]
	if d == nil || d.terminal() {
		b.mu.Unlock()
		return nil, fmt.Errorf("%s belongs to document %s, which is finished; nothing waits for it: %w", what, rec.Claim.DocumentId, ErrFailedPrecondition)
	}
	cr := d.claims[claimID]
	if cr == nil || cr.attempt != d.attempt || d.sess == nil || cr.sess != d.sess {
		b.mu.Unlock()
		if d.sess == nil {
			return nil, fmt.Errorf("document %s is waiting for a peer session; retry the redemption later: %w", d.id, ErrUnavailable)
		}
		return nil, fmt.Errorf("%s was issued to an earlier dispatch of document %s, which was re-dispatched since; redeem the newest claim: %w",
			what, d.id, ErrFailedPrecondition)
	}
	ss := d.sess
	e := proto.Clone(d.ents[cr.key]).(*gatewayv1.Entity)
	isRoot := cr.key == entKey{0, d.rootID}
	if cr.key.scope != 0 {
		b.mu.Unlock()
		return nil, fmt.Errorf("%s defers an entity the peer created in its scope %d; the gateway has no payload to resume it: %w",
			what, cr.key.scope, ErrFailedPrecondition)
	}
	b.mu.Unlock()

	res, err := b.commit(ctx, &store.Batch{Redeem: &store.RedeemClaim{Tenant: string(t), ClaimID: claimID, Now: now}})
	if err != nil {
		return nil, mapStoreErr(what, err)
	}
	b.m.claims.WithLabelValues("redeemed").Inc()
	b.mu.Lock()
	cr.c = proto.Clone(res.Claim).(*gatewayv1.ClaimCheck)
	cr.c.DocumentId = d.id
	d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: claimID, ClaimAction: "redeemed", EntityId: e.EntityId, ScopeId: e.ScopeId})
	b.kickFlush()
	b.mu.Unlock()

	if err := b.sendRedemption(ctx, d, ss, e, isRoot, claimID); err != nil {
		switch wire.CodeOf(err) {
		case wire.CodeClaimExpired:
			b.rejectClaim(d, claimID, gatewayv1.ClaimCheck_EXPIRED, "expired")
			return nil, fmt.Errorf("the peer rejected %s as expired (PIPESTREAM_CLAIM_EXPIRED): %w", what, ErrClaimExpired)
		case wire.CodeClaimNotFound:
			b.rejectClaim(d, claimID, gatewayv1.ClaimCheck_REDEEMED, "rejected")
			return nil, fmt.Errorf("the peer does not know %s or it was redeemed before (PIPESTREAM_CLAIM_NOT_FOUND): %w", what, ErrClaimRedeemed)
		}
		return nil, fmt.Errorf("%s is redeemed but resuming the entity failed (%v); the document is re-dispatched if its session is lost: %w",
			what, err, ErrUnavailable)
	}
	return publicClaim(cr.c, time.Now()), nil
}

// rejectClaim records the peer's rejection of a redemption.
func (b *Bridge) rejectClaim(d *docRun, claimID string, st gatewayv1.ClaimCheck_ClaimState, action string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.m.claims.WithLabelValues(action).Inc()
	cr := d.claims[claimID]
	if cr == nil {
		return
	}
	cr.c.State = st
	d.dirtyClaims[claimID] = true
	d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: claimID, ClaimAction: action, Message: "rejected by the peer"})
	b.kickFlush()
}

// sendRedemption sends the deferred entity's original payload again with
// pipestream.claim-id, reusing its entity ID on the session that saw the
// DEFERRED status (profile 6).
func (b *Bridge) sendRedemption(ctx context.Context, d *docRun, ss *sessState, e *gatewayv1.Entity, isRoot bool, claimID string) error {
	f, err := b.st.OpenSpool(d.id)
	if err != nil {
		return fmt.Errorf("open spool: %w", err)
	}
	defer f.Close()
	if isRoot {
		content, err := io.ReadAll(io.LimitReader(f, maxWholeBytes+1))
		if err != nil {
			return err
		}
		env, err := ss.codec.MarshalPipeDoc(b.envelope(d, e.EntityId, content))
		if err != nil {
			return err
		}
		md := d.plan.rootMetadata()
		md[metaClaimID] = claimID
		return ss.s.SendEntity(ctx, b.rootHeader(d, e.EntityId, env, md), bytes.NewReader(env))
	}
	if e.SizeBytes > maxChunkBytes {
		return fmt.Errorf("chunk of %d bytes exceeds the chunk limit", e.SizeBytes)
	}
	buf := make([]byte, e.SizeBytes)
	if _, err := f.ReadAt(buf, int64(e.ChunkOffset)); err != nil {
		return fmt.Errorf("read chunk from spool: %w", err)
	}
	parent := e.ParentId
	md := d.plan.childMetadata(uint64(e.ChunkIndex))
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
	b.mu.Lock()
	for _, r := range recs {
		id := r.Claim.ClaimId
		if d := b.docs[r.Claim.DocumentId]; d != nil && d.claims[id] != nil && !d.terminal() {
			cr := d.claims[id]
			if cr.c.State != gatewayv1.ClaimCheck_ISSUED {
				continue
			}
			cr.c.State = gatewayv1.ClaimCheck_EXPIRED
			d.dirtyClaims[id] = true
			d.addEvent(&gatewayv1.Event{Kind: kindClaim, ClaimId: id, ClaimAction: "expired", EntityId: r.Claim.EntityId, ScopeId: r.Claim.ScopeId})
			b.m.claims.WithLabelValues("expired").Inc()
			continue
		}
		c := proto.Clone(r.Claim).(*gatewayv1.ClaimCheck)
		c.State = gatewayv1.ClaimCheck_EXPIRED
		orphans = append(orphans, store.ClaimRecord{Tenant: r.Tenant, Claim: c})
	}
	b.kickFlush()
	b.mu.Unlock()
	if len(orphans) > 0 {
		if _, err := b.commit(ctx, &store.Batch{Claims: orphans}); err != nil && ctx.Err() == nil {
			b.log.Warn("bridge: marking expired claims failed", "err", err)
		}
	}
}
