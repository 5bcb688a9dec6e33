package bridge

import (
	"context"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// recover reloads the non-terminal documents after a restart (DESIGN.md
// section 6): entities left non-terminal by the previous process are failed
// locally, and each document is re-dispatched from its spool, or failed
// with a clear error when the spool is missing.
func (b *Bridge) recover(ctx context.Context) error {
	recs, err := b.st.ListNonTerminal(ctx)
	if err != nil {
		return fmt.Errorf("bridge: list non-terminal documents: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, rec := range recs {
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
		b.docs[d.id] = d
		b.m.running.Inc()
		if ents, err := b.st.ListEntities(ctx, rec.Tenant, d.id); err == nil {
			for _, e := range ents {
				if !terminalEntity(e.Status) && e.Status != gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED {
					e.Status = gatewayv1.EntityStatus_ENTITY_STATUS_FAILED
					e.Message = "gateway restarted; the document is re-dispatched"
					d.setEntity(entKey{e.ScopeId, e.EntityId}, e)
				}
			}
			d.ents = map[entKey]*gatewayv1.Entity{}
		}
		if !fileExists(b.st.SpoolPath(d.id)) {
			b.finishLocked(d, gatewayv1.State_FAILED, "the spooled content is missing after a restart; resubmit the document")
			continue
		}
		if d.rec.DispatchAttempts >= uint32(b.opts.MaxDispatchAttempts) {
			b.finishLocked(d, gatewayv1.State_FAILED, fmt.Sprintf("gave up after %d dispatch attempts (MaxDispatchAttempts); last: gateway restarted", d.rec.DispatchAttempts))
			continue
		}
		b.enqueueLocked(d)
	}
	if len(recs) > 0 {
		b.log.Info("bridge: recovered non-terminal documents", "count", len(recs))
	}
	// Issued claims of recovered documents stay in the store; a claim issued
	// on a previous session is redeemed with a fresh entity ID (profile 6).
	b.kickFlush()
	return nil
}

func mustHex(s string) []byte {
	b, _ := hex.DecodeString(s)
	return b
}
