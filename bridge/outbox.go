package bridge

import (
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// dirtyEnt and dirtyDigest name a row to write: rows are keyed by dispatch
// attempt generation in the store (older attempts are superseded, store
// migration 2), so a change outlives the attempt that made it.
type dirtyEnt struct {
	attempt uint32
	k       entKey
}

type dirtyDigest struct {
	attempt uint32
	k       scopeKey
}

// outbox holds a document's changes not yet committed. A commit takes the
// whole outbox (take) and, when the commit fails, puts it back (putBack)
// before the changes made meanwhile. Guarded by the document's mutex.
type outbox struct {
	dirty bool      // something changed since the last take
	since time.Time // when dirty was set (flush hold, persist.go)

	events  []*gatewayv1.Event
	ents    map[dirtyEnt]*gatewayv1.Entity // pointer: the entity as it is at commit time
	digests map[dirtyDigest]*gatewayv1.ScopeDigest
	claims  map[string]bool // claim ids whose state changed
	// result is a small verified result not yet committed: it is stored
	// (store.PayloadResult) with, or before, the terminal state
	// (content.go). Setting it does not mark the outbox dirty: the change
	// that goes with it (a state, an event) does.
	result []byte
}

func newOutbox() outbox {
	return outbox{ents: map[dirtyEnt]*gatewayv1.Entity{}, digests: map[dirtyDigest]*gatewayv1.ScopeDigest{}, claims: map[string]bool{}}
}

// markDirty notes that there are changes to commit; since is when the
// oldest of them was made (flush holds progress for at most flushHold).
func (o *outbox) markDirty(now time.Time) {
	if !o.dirty {
		o.dirty = true
		o.since = now
	}
}

func (o *outbox) putEntity(gen uint32, k entKey, e *gatewayv1.Entity) {
	o.ents[dirtyEnt{gen, k}] = e
}

func (o *outbox) putDigest(gen uint32, k scopeKey, dg *gatewayv1.ScopeDigest) {
	o.digests[dirtyDigest{gen, k}] = dg
}

// take returns the pending changes and leaves the outbox empty and clean.
func (o *outbox) take() outbox {
	t := *o
	*o = newOutbox()
	return t
}

// putBack returns changes a failed commit took: they go before the ones
// made since (events in order; a row changed since keeps its newer value).
func (o *outbox) putBack(t outbox, now time.Time) {
	o.events = append(t.events, o.events...)
	o.markDirty(now)
	for k, e := range t.ents {
		if _, ok := o.ents[k]; !ok {
			o.ents[k] = e
		}
	}
	for k, dg := range t.digests {
		if _, ok := o.digests[k]; !ok {
			o.digests[k] = dg
		}
	}
	for k := range t.claims {
		o.claims[k] = true
	}
	if o.result == nil {
		o.result = t.result
	}
}

// holdable reports whether the changes are only progress that may wait
// for the document's next change (flushHold): its running state and its
// entities' statuses. A result, a claim or a scope digest is never held:
// each is what a client, a redemption or a restart needs durable now.
func (o *outbox) holdable() bool {
	return len(o.claims) == 0 && len(o.digests) == 0 && o.result == nil
}

// appendTo adds the changes o (taken from d's outbox) to batch: entity,
// digest and claim rows, events in order, the small result. Create and
// flush both commit through it (submit.go, persist.go). Caller holds
// d's lock (claims are read from d).
func (o *outbox) appendTo(batch *store.Batch, d *docRun) {
	for k, e := range o.ents {
		batch.Entities = append(batch.Entities, store.EntityRecord{DocID: d.id, Entity: proto.Clone(e).(*gatewayv1.Entity),
			Attempt: k.attempt, ScopeInstance: k.k.inst})
	}
	for k, dg := range o.digests {
		batch.Digests = append(batch.Digests, store.DigestRecord{DocID: d.id, Digest: proto.Clone(dg).(*gatewayv1.ScopeDigest),
			Attempt: k.attempt, ScopeInstance: k.k.inst})
	}
	for id := range o.claims {
		cr := d.claims[id]
		c := proto.Clone(cr.c).(*gatewayv1.ClaimCheck)
		c.Name = ""
		batch.Claims = append(batch.Claims, store.ClaimRecord{Tenant: string(d.tenant), Claim: c, Chunk: cr.chunk()})
	}
	for _, ev := range o.events {
		batch.Events = append(batch.Events, store.EventAppend{Tenant: string(d.tenant), Event: ev})
	}
	if o.result != nil {
		batch.Payloads = append(batch.Payloads, store.PayloadRecord{DocID: d.id, Kind: store.PayloadResult, Body: o.result})
	}
}
