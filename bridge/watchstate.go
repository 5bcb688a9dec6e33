package bridge

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// scopeDigestEvent names the #status event of a scope digest (handler.go).
const scopeDigestEvent = "ScopeDigest"

// docAsOf rebuilds, for a replaying WatchDocument, the document as it was
// after each event. The store keeps only the newest document row (the
// flusher coalesces many events into one row update, so intermediate rows
// never exist), but the events of a document carry every change that the
// document's evolving fields are made of:
//
//   - rev and update_time: the event's rev and time;
//   - state, error and wait_reason: #document events (a non-terminal one
//     carries the wait reason, a terminal one the error message);
//   - entity_counts: #status events (entity status per scope and entity);
//   - claim_checks: #claim events (issued, redeemed, expired).
//
// The fields that never change after creation (content type, size,
// checksum, split, metadata, create_time...) come from the stored
// document. What no event carries (scope digests, result size, result
// absence, finish_time) comes from the stored document from the terminal
// #document event on; before it they are empty, as they were. An event
// whose rev is the stored document's rev gets the stored document itself.
//
// The fold needs the document's events from rev 1. When retention pruned
// the first ones (the document's oldest retained event has since > 0),
// counts and claims start from what is retained: docs/events.md.
type docAsOf struct {
	cur    *gatewayv1.Document // the stored document (newest)
	doc    *gatewayv1.Document // the fold so far
	ents   map[[2]uint32]gatewayv1.EntityStatus
	claims map[string]*gatewayv1.ClaimCheck // by claim id, from the store
}

// newDocAsOf starts the fold from the stored document cur (not modified)
// and the document's claims as stored (for their times and entity).
func newDocAsOf(cur *gatewayv1.Document) *docAsOf {
	doc := proto.Clone(cur).(*gatewayv1.Document)
	doc.State = gatewayv1.State_PENDING
	doc.Rev, doc.Error, doc.WaitReason = 0, "", ""
	doc.EntityCounts = &gatewayv1.EntityCounts{}
	doc.Digests, doc.ClaimChecks, doc.Entities = nil, nil, nil
	doc.ResultSizeBytes, doc.ResultAbsent, doc.FinishTime = 0, false, nil
	doc.UpdateTime = cur.GetCreateTime()
	f := &docAsOf{cur: cur, doc: doc, ents: map[[2]uint32]gatewayv1.EntityStatus{}, claims: map[string]*gatewayv1.ClaimCheck{}}
	for _, c := range cur.GetClaimChecks() {
		f.claims[c.GetClaimId()] = c
	}
	return f
}

// setCurrent replaces the stored document the fold ends with (a live
// event newer than it arrived).
func (f *docAsOf) setCurrent(cur *gatewayv1.Document) {
	f.cur = cur
	for _, c := range cur.GetClaimChecks() {
		f.claims[c.GetClaimId()] = c
	}
}

// apply folds ev into the document and returns a copy of the document
// after it (the stored document when ev is its newest change).
func (f *docAsOf) apply(ev *gatewayv1.Event) *gatewayv1.Document {
	d := f.doc
	if ev.GetRev() > 0 {
		d.Rev = ev.GetRev()
	}
	if ev.GetTime() != nil {
		d.UpdateTime = ev.GetTime()
	}
	switch ev.GetKind() {
	case kindDocument:
		f.applyState(ev)
	case kindStatus:
		if ev.GetName() == scopeDigestEvent {
			// The scope's id with its parent's entity id (the parent lives
			// in the enclosing scope): no entity changed.
			break
		}
		f.ents[[2]uint32{ev.GetScopeId(), ev.GetEntityId()}] = ev.GetEntityStatus()
		d.EntityCounts = countStatuses(f.ents)
	case kindClaim:
		f.applyClaim(ev)
	}
	if ev.GetRev() != 0 && ev.GetRev() == f.cur.GetRev() {
		return proto.Clone(f.cur).(*gatewayv1.Document)
	}
	return proto.Clone(d).(*gatewayv1.Document)
}

func (f *docAsOf) applyState(ev *gatewayv1.Event) {
	d := f.doc
	d.State = ev.GetState()
	if !store.IsTerminal(d.State) {
		// A #document event without a state change carries the wait reason
		// (superviseQueueLocked); a state change clears it.
		d.WaitReason = ev.GetMessage()
		return
	}
	d.WaitReason = ""
	if ev.GetMessage() != "" {
		d.Error = ev.GetMessage()
	}
	d.FinishTime = ev.GetTime()
	if store.IsTerminal(f.cur.GetState()) {
		// What no event carries is final with the terminal state.
		d.FinishTime = f.cur.GetFinishTime()
		d.Digests = f.cur.GetDigests()
		d.ResultSizeBytes = f.cur.GetResultSizeBytes()
		d.ResultAbsent = f.cur.GetResultAbsent()
		d.Error = f.cur.GetError()
	}
}

func (f *docAsOf) applyClaim(ev *gatewayv1.Event) {
	id := ev.GetClaimId()
	c := f.findClaim(id)
	if c == nil {
		c = &gatewayv1.ClaimCheck{Name: "claims/" + id, ClaimId: id, DocumentId: ev.GetDocumentId(),
			EntityId: ev.GetEntityId(), ScopeId: ev.GetScopeId()}
		if st := f.claims[id]; st != nil {
			c.ExpireTime, c.CreateTime = st.GetExpireTime(), st.GetCreateTime()
		}
		f.doc.ClaimChecks = append(f.doc.ClaimChecks, c)
	}
	switch ev.GetClaimAction() {
	case "issued":
		c.State = gatewayv1.ClaimCheck_ISSUED
	case "redeemed":
		c.State = gatewayv1.ClaimCheck_REDEEMED
		c.RedeemTime = ev.GetTime()
	case "expired":
		c.State = gatewayv1.ClaimCheck_EXPIRED
	case "cancelled":
		c.State = gatewayv1.ClaimCheck_CANCELLED
	}
}

func (f *docAsOf) findClaim(id string) *gatewayv1.ClaimCheck {
	for _, c := range f.doc.ClaimChecks {
		if c.GetClaimId() == id {
			return c
		}
	}
	return nil
}

// countStatuses counts entity statuses as attempt.counts does.
func countStatuses(ents map[[2]uint32]gatewayv1.EntityStatus) *gatewayv1.EntityCounts {
	c := &gatewayv1.EntityCounts{}
	for _, s := range ents {
		c.Total++
		countStatus(c, s)
	}
	return c
}

// foldBefore folds the document's retained events below seq into f (the
// part of its history a replay from seq does not send).
func (b *Bridge) foldBefore(ctx context.Context, t Tenant, id string, seq uint64, f *docAsOf) error {
	from := uint64(0)
	for from < seq {
		evs, err := b.st.ReadEvents(ctx, store.EventQuery{From: from, Tenant: string(t), DocID: id})
		if err != nil {
			return mapStoreErr("events of document "+id, err)
		}
		if len(evs) == 0 {
			return nil
		}
		for i := range evs {
			if evs[i].Seq >= seq {
				return nil
			}
			ev, err := evs[i].Decode()
			if err != nil {
				return err
			}
			f.apply(ev)
		}
		from = evs[len(evs)-1].Seq + 1
	}
	return nil
}
