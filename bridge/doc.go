package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Event kinds (DESIGN.md section 5).
const (
	kindStatus   = "#status"
	kindDocument = "#document"
	kindClaim    = "#claim"
)

// entKey identifies an entity of a document's current dispatch attempt:
// (scope, entity id) on the session the attempt runs on.
type entKey struct{ scope, id uint32 }

// docRun is the in-memory state of a non-terminal document. Every field is
// guarded by Bridge.mu unless noted.
type docRun struct {
	id     string
	tenant Tenant
	plan   *plan
	rec    *store.DocumentRecord // rec.Doc is the live document (no entity/digest/claim lists)

	// committed is set once the Create batch is durable; before that no
	// events are produced and the flusher skips the document.
	committed    bool
	committing   bool // the Create batch is on its way: later events follow it
	persistedRev uint64
	dirty        bool
	pending      []*gatewayv1.Event
	dirtyEnts    map[entKey]*gatewayv1.Entity // pointer: survives an attempt reset
	dirtyDigests map[uint32]bool
	dirtyClaims  map[string]bool

	ents    map[entKey]*gatewayv1.Entity // current attempt
	digests map[uint32]*gatewayv1.ScopeDigest
	claims  map[string]*claimRun

	// Dispatch state of the current attempt.
	attempt      uint32 // 1-based; 0 = never dispatched
	sess         *sessState
	rootID       uint32
	sendDone     bool
	stopSend     context.CancelFunc // stops the current attempt's sending
	rootComplete bool
	rootFailures uint32
	resultReady  bool
	resultErr    string
	queued       bool // in Bridge.queue
	uploading    bool // an Upload is still streaming content (pipelined)
	finishTimer  *time.Timer

	// chunkSizes: whole-document size and SHA-256, known once the content is spooled.
	size int64
	sum  [32]byte
}

// claimRun is a claim of a runtime document.
type claimRun struct {
	c       *gatewayv1.ClaimCheck
	attempt uint32
	key     entKey     // the deferred entity
	sess    *sessState // session that saw DEFERRED
}

func (d *docRun) terminal() bool { return store.IsTerminal(d.rec.Doc.GetState()) }

// addEvent records ev for the document: bumps rev and queues the event for
// the flusher. Before the Create commit only rev moves (the Create batch
// carries a snapshot).
func (d *docRun) addEvent(ev *gatewayv1.Event) {
	doc := d.rec.Doc
	now := time.Now()
	doc.Rev++
	doc.UpdateTime = timestamppb.New(now)
	d.dirty = true
	if !d.committed && !d.committing {
		return
	}
	ev.Time = timestamppb.New(now)
	ev.DocumentId = d.id
	ev.Rev = doc.Rev
	ev.Since = doc.Rev - 1
	d.pending = append(d.pending, ev)
}

// setState moves the document to s (with an error message for FAILED).
func (d *docRun) setState(s gatewayv1.State, msg string) {
	doc := d.rec.Doc
	if doc.State == s && msg == "" {
		return
	}
	doc.State = s
	if msg != "" {
		doc.Error = msg
	}
	if store.IsTerminal(s) {
		doc.FinishTime = timestamppb.Now()
	}
	d.addEvent(&gatewayv1.Event{Kind: kindDocument, State: s, Message: msg})
}

// setEntity records an entity status change and its #status event.
func (d *docRun) setEntity(k entKey, e *gatewayv1.Entity) {
	d.ents[k] = e
	d.dirtyEnts[k] = e
	d.addEvent(&gatewayv1.Event{Kind: kindStatus, EntityId: e.EntityId, ScopeId: e.ScopeId, EntityStatus: e.Status})
}

// counts computes entity counts by status over the current attempt.
func (d *docRun) counts() *gatewayv1.EntityCounts {
	c := &gatewayv1.EntityCounts{}
	for _, e := range d.ents {
		c.Total++
		switch e.Status {
		case gatewayv1.EntityStatus_ENTITY_STATUS_PENDING, gatewayv1.EntityStatus_ENTITY_STATUS_UNSPECIFIED:
			c.Pending++
		case gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING, gatewayv1.EntityStatus_ENTITY_STATUS_DEHYDRATING,
			gatewayv1.EntityStatus_ENTITY_STATUS_REHYDRATING, gatewayv1.EntityStatus_ENTITY_STATUS_CHECKPOINT:
			c.Processing++
		case gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE:
			c.Complete++
		case gatewayv1.EntityStatus_ENTITY_STATUS_FAILED:
			c.Failed++
		case gatewayv1.EntityStatus_ENTITY_STATUS_DEFERRED:
			c.Deferred++
		case gatewayv1.EntityStatus_ENTITY_STATUS_SKIPPED:
			c.Skipped++
		case gatewayv1.EntityStatus_ENTITY_STATUS_ABANDONED:
			c.Abandoned++
		case gatewayv1.EntityStatus_ENTITY_STATUS_YIELDED:
			c.Yielded++
		case gatewayv1.EntityStatus_ENTITY_STATUS_RETRYING:
			c.Retrying++
		}
	}
	return c
}

// allChildrenComplete reports whether every non-root entity is COMPLETE.
func (d *docRun) allChildrenComplete() (complete, total int) {
	for k, e := range d.ents {
		if k.scope == 0 && k.id == d.rootID {
			continue
		}
		total++
		if e.Status == gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE {
			complete++
		}
	}
	return complete, total
}

// snapshot returns a copy of the record for a store write (counts filled).
func (d *docRun) snapshot() *store.DocumentRecord {
	r := *d.rec
	r.Doc = proto.Clone(d.rec.Doc).(*gatewayv1.Document)
	r.Doc.EntityCounts = d.counts()
	r.Doc.Entities, r.Doc.Digests, r.Doc.ClaimChecks = nil, nil, nil
	return &r
}

// entityStatus maps a wire status to the API enum (same numbering).
func entityStatus(s wire.Status) gatewayv1.EntityStatus { return gatewayv1.EntityStatus(s) }

// terminalEntity reports whether an API entity status is final for counting
// purposes (FAILED counts as final; the peer may still retry it).
func terminalEntity(s gatewayv1.EntityStatus) bool {
	switch s {
	case gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE, gatewayv1.EntityStatus_ENTITY_STATUS_FAILED,
		gatewayv1.EntityStatus_ENTITY_STATUS_SKIPPED, gatewayv1.EntityStatus_ENTITY_STATUS_ABANDONED:
		return true
	}
	return false
}

func hexSum(b []byte) string { return hex.EncodeToString(b) }

func sumOf(b []byte) [32]byte { return sha256.Sum256(b) }
