package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// ClaimNotifier is the optional part of a Store shared by several gateway
// replicas (pgstore) that tells the replica driving a document of the
// redemptions other replicas committed for it (docs/scale-out.md, Claims
// across replicas). The hook may be called more than once for a claim and
// must not block.
type ClaimNotifier interface {
	SetClaimRedeemedHook(func(docID, claimID string))
}

// shared reports whether the store is shared by several gateways.
func (b *Bridge) shared() bool {
	_, ok := b.st.(Leaser)
	return ok
}

// redeemForOwner redeems a claim of a document this gateway does not drive:
// another replica drives it, or none does until the takeover scan finds
// its lease expired. The store commits the redemption exactly once, as for
// any redemption. The replica that drives the document is told by its
// store (ClaimNotifier) and resumes the entity at its peer; a replica that
// takes the document over later resumes it from the stored claim
// (loadClaimsLocked). The answer does not wait for the peer's
// acknowledgment: a refusal shows on the claim's events and on the
// document.
func (b *Bridge) redeemForOwner(ctx context.Context, t Tenant, rec *store.ClaimRecord, now time.Time) (*gatewayv1.ClaimCheck, error) {
	docID, claimID := rec.Claim.DocumentId, rec.Claim.ClaimId
	doc, err := b.st.GetDocument(ctx, string(t), docID, false)
	if err != nil {
		return nil, mapStoreErr("document "+docID, err)
	}
	if store.IsTerminal(doc.Doc.GetState()) {
		return nil, b.settledRefusal(ctx, t, claimID,
			fmt.Errorf("claim %s belongs to document %s, which is finished; nothing waits for it: %w", claimID, docID, ErrFailedPrecondition))
	}
	stored, err := b.commitRedeem(ctx, t, docID, rec.Claim, now,
		"redeemed through another gateway replica; the replica that drives the document resumes the entity")
	if err != nil {
		return nil, err
	}
	b.log.Info("bridge: claim redeemed for the replica that drives its document", "doc", docID, "claim", claimID)
	return publicClaim(stored, time.Now()), nil
}

// redeemedElsewhere is the store's ClaimNotifier hook: another replica
// redeemed claimID of docID, which this gateway drives.
func (b *Bridge) redeemedElsewhere(docID, claimID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx.Err() != nil {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.resumeRedeemed(docID, claimID)
	}()
}

// resumeRedeemed resumes the entity of claimID, which another replica
// redeemed, through this gateway's session: the redemption this gateway
// would have run itself, with the store's commit already done.
func (b *Bridge) resumeRedeemed(docID, claimID string) {
	b.mu.Lock()
	locked := lockFound(b.reg, func() *docRun { return b.docs[docID] })
	d := locked
	if d == nil || d.terminal() || d.claims[claimID] == nil || d.claims[claimID].c.State != gatewayv1.ClaimCheck_ISSUED {
		b.mu.Unlock()
		unlockFound(locked)
		return // not driven here, or redeemed here already (a repeated notification)
	}
	d, cr, err := b.claimToRedeemLocked(docID, claimID)
	b.mu.Unlock()
	if err != nil {
		locked.unlock()
		b.log.Warn("bridge: another replica redeemed a claim this gateway cannot resume", "doc", docID, "claim", claimID, "err", err)
		return
	}
	// Claimed for this resumption: a repeated notification finds it
	// redeemed and stops above. Its event was committed with the
	// redemption (commitRedeem).
	cr.c.State = gatewayv1.ClaimCheck_REDEEMED
	running := cr.att.current()
	locked.unlock()
	commit := func(ctx context.Context, _ string) (*gatewayv1.ClaimCheck, error) {
		rec, err := b.st.GetClaim(ctx, string(d.tenant), claimID)
		if err != nil {
			return nil, mapStoreErr("claim "+claimID, err)
		}
		return rec.Claim, nil
	}
	if running {
		_, err = b.redeemRun(b.ctx, d, claimID, "", commit)
	} else {
		_, err = b.redeemEarlier(b.ctx, d, cr, claimID, commit)
	}
	if err != nil {
		b.log.Warn("bridge: resuming an entity whose claim another replica redeemed failed", "doc", docID, "claim", claimID, "err", err)
		return
	}
	b.log.Info("bridge: resumed an entity whose claim another replica redeemed", "doc", docID, "claim", claimID)
}
