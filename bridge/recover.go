package bridge

import (
	"context"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// recover reloads the non-terminal documents after a restart
// (docs/architecture.md): entities left non-terminal by the previous process are failed
// locally, and each document is re-dispatched from its spool (or its inline
// content, content.go), or failed with a clear error when that is missing.
//
// With a Leaser store (lease.go) only the documents whose lease it acquired
// are recovered; the takeover scan recovers more the same way later.
func (b *Bridge) recover(ctx context.Context) error {
	recs, err := b.listRecoverable(ctx)
	if err != nil {
		return fmt.Errorf("bridge: list non-terminal documents: %w", err)
	}
	b.recoverRecords(ctx, recs)
	if len(recs) > 0 {
		b.log.Info("bridge: recovered non-terminal documents", "count", len(recs))
	}
	return nil
}

// recoverRecords loads recs into memory and queues them for a new attempt.
func (b *Bridge) recoverRecords(ctx context.Context, recs []*recoverable) {
	for _, r := range recs {
		b.recoverRecord(ctx, r)
	}
	b.kickFlush()
}

// recoverRecord loads r into memory and queues it for a new attempt.
func (b *Bridge) recoverRecord(ctx context.Context, r *recoverable) {
	rec := r.rec
	if old := lockDocOf(b.reg, func() *docRun { return b.docs[rec.Doc.Id] }); old != nil {
		// Our lease of it was lost and is ours again (a new epoch): the
		// stored record is the truth, not what memory still has.
		old.dropLocked("re-acquired with a new lease")
		unlockFound(old)
	}
	opts := &gatewayv1.SubmitOptions{
		ContentType: rec.Doc.ContentType, RequestId: rec.Doc.RequestId, Split: rec.Doc.Split,
		CompletionPolicy: rec.Doc.CompletionPolicy, Metadata: rec.Doc.Metadata, DisplayName: rec.Doc.DisplayName,
	}
	p, err := newPlan(opts)
	if err != nil {
		// Options were validated at submit; a newer, stricter version
		// must not wedge the document.
		p = &plan{opts: opts, strategy: opts.GetSplit().GetStrategy(), chunkBytes: int(max(opts.GetSplit().GetChunkBytes(), 1))}
	}
	d := b.newDocRun(rec.Doc.Id, Tenant(rec.Tenant), p)
	d.rec = rec
	d.rec.Doc = proto.Clone(rec.Doc).(*gatewayv1.Document)
	d.rec.Doc.Entities, d.rec.Doc.Digests, d.rec.Doc.ClaimChecks = nil, nil, nil
	d.committed = true
	d.persistedRev = rec.Doc.Rev
	d.size = int64(rec.Doc.SizeBytes)
	copy(d.sum[:], mustHex(rec.Doc.Checksum))
	// Every record written before inline content existed names its
	// spool file; "" means the content is in the payloads table.
	d.inline = !rec.ContentPayload
	d.lock()
	defer d.unlock()
	b.mu.Lock()
	ok := b.reg.register(d)
	b.mu.Unlock()
	if !ok {
		return // submitted or recovered again meanwhile: that one is driven
	}
	b.m.running.Inc()
	// The next dispatch is a new attempt: its entity rows supersede the
	// previous process's (store migration 2), so those are left as
	// they are. Issued claims stay redeemable through the new attempt
	// (profile 6): remember what each deferred entity stood for.
	d.att = idleAttempt(d, parsePrivate(rec.Private))
	b.loadClaimsLocked(ctx, d)
	if !b.contentExists(ctx, d) {
		d.finishLocked(gatewayv1.State_FAILED, "the spooled content is missing after a restart; resubmit the document")
		return
	}
	if d.rec.DispatchAttempts >= uint32(b.opts.MaxDispatchAttempts) {
		d.finishLocked(gatewayv1.State_FAILED, fmt.Sprintf("gave up after %d dispatch attempts (MaxDispatchAttempts); last: gateway restarted", d.rec.DispatchAttempts))
		return
	}
	d.enqueueLocked()
}

func mustHex(s string) []byte {
	b, _ := hex.DecodeString(s)
	return b
}

// loadClaimsLocked loads d's ISSUED claims with the chunk (or root) their
// entity stood for: stored with the claim (store schema 4), or, for claims
// stored before that, found among the newest stored attempt's entities.
// Entity ids restart with every session, so only the stored chunk
// identifies the entity of a claim issued two or more attempts ago.
//
// A REDEEMED claim says the client authorised its chunk: the new attempt
// resumes that chunk's entity as soon as the peer defers it again
// (preRedeem), without another redemption. That covers a redemption
// committed while nobody drove the document (another replica redeemed it
// before the takeover; remoteclaims.go) and one whose gateway stopped
// before the peer had the entity back.
func (b *Bridge) loadClaimsLocked(ctx context.Context, d *docRun) {
	recs, err := b.st.ListClaims(ctx, string(d.tenant), d.id)
	if err != nil {
		b.log.Warn("bridge: loading claims of a recovered document", "doc", d.id, "err", err)
		return
	}
	var ents []*gatewayv1.Entity // newest attempt, read once if needed
	for _, r := range recs {
		c := r.Claim
		if c.State != gatewayv1.ClaimCheck_ISSUED && c.State != gatewayv1.ClaimCheck_REDEEMED {
			continue
		}
		cr := &claimRun{c: proto.Clone(c).(*gatewayv1.ClaimCheck), att: d.att, key: entKey{scope: c.ScopeId, id: c.EntityId}, slot: noSlot, durable: true}
		switch {
		case r.Chunk.Set:
			cr.slot = r.Chunk.Index
		case c.ScopeId == 0:
			if ents == nil {
				if ents, err = b.st.ListEntities(ctx, string(d.tenant), d.id); err != nil {
					b.log.Warn("bridge: loading entities of a recovered document", "doc", d.id, "err", err)
				}
			}
			for _, e := range ents {
				if e.ScopeId == 0 && e.EntityId == c.EntityId {
					cr.slot = int64(e.ChunkIndex)
					if e.ParentId == 0 {
						cr.slot = -1
					}
				}
			}
		}
		if c.State == gatewayv1.ClaimCheck_REDEEMED {
			if cr.slot != noSlot {
				d.preRedeem[cr.slot] = c.ClaimId
			}
			continue
		}
		d.claims[c.ClaimId] = cr
	}
}
