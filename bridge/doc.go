package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
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
// (scope, entity id) on the session the attempt runs on, plus the instance
// of the scope: a peer may reuse a scope ID within one document after its
// SCOPE_DIGEST (profile 2), and each use is a scope of its own. Session-level
// maps (sessState.ents) leave inst 0: there a scope ID names one live scope.
type entKey struct{ scope, inst, id uint32 }

// rootKey is the key of a root-scope entity.
func rootKey(id uint32) entKey { return entKey{id: id} }

// scopeKey is one use of a peer scope in a document's attempt.
type scopeKey struct{ scope, inst uint32 }

// dirtyEnt and dirtyDigest name a row to write: rows are keyed by dispatch
// attempt in the store (older attempts are superseded, store migration 2).
type dirtyEnt struct {
	attempt uint32
	k       entKey
}

type dirtyDigest struct {
	attempt uint32
	k       scopeKey
}

// docRun is the in-memory state of a non-terminal document. Every field is
// guarded by Bridge.mu unless noted.
type docRun struct {
	id     string
	tenant Tenant
	plan   *plan
	rec    *store.DocumentRecord // rec.Doc is the live document (no entity/digest/claim lists)

	// committed is set once the Create batch is durable; before that the
	// flusher skips the document and its events queue in pending.
	committed    bool
	committing   bool // the Create batch is on its way: later events follow it
	persistedRev uint64
	dirty        bool
	dirtySince   time.Time // when dirty was set (flush hold, persist.go)
	pending      []*gatewayv1.Event
	dirtyEnts    map[dirtyEnt]*gatewayv1.Entity // pointer: survives an attempt reset
	dirtyDigests map[dirtyDigest]*gatewayv1.ScopeDigest
	dirtyClaims  map[string]bool

	ents      map[entKey]*gatewayv1.Entity // current attempt
	digests   map[scopeKey]*gatewayv1.ScopeDigest
	scopeUses map[uint32]uint32 // current attempt: uses of each peer scope ID so far
	claims    map[string]*claimRun
	// preRedeem: a claim of an earlier attempt was redeemed before the
	// current attempt deferred the same chunk again (key: chunk slot); the
	// current attempt's claim is redeemed through it when it is issued.
	preRedeem map[int64]string

	// Dispatch state of the current attempt.
	attempt uint32 // 1-based generation, persisted in rec.Private; 0 = never dispatched
	sess    *sessState
	// sessEnts: the session-level mappings (sessState.ents) made for this
	// document, dropped by releaseSessLocked when the attempt ends, so a
	// session outliving thousands of documents holds none of them.
	sessEnts     []sessEnt
	rootID       uint32
	sendDone     bool
	stopSend     context.CancelFunc // stops the current attempt's sending
	rootComplete bool
	rootFailures uint32
	resultReady  bool
	resultErr    string
	queued       bool // in Bridge.queue
	queuedAt     time.Time
	// plain: the current attempt sends plain entities (docs/profile.md 9);
	// plainTotal is its chunk count once all were sent (0 before, and for
	// a document sent whole), plainDone counts its terminal chunks,
	// plainParts holds the chunk results a plain peer returned (spooled),
	// plainSettle waits for a result or the peer's rehydration.
	plain       bool
	plainTotal  int
	plainDone   int
	plainParts  map[uint64]plainPart
	plainSettle *time.Timer
	plainActive int // result streams being read
	// entSince: when each root-scope entity of the attempt was sent or last
	// changed status (entity timeouts, timeouts.go).
	entSince    map[entKey]time.Time
	uploading   bool // an Upload is still streaming content (pipelined)
	finishTimer *time.Timer

	// chunkSizes: whole-document size and SHA-256, known once the content is spooled.
	size int64
	sum  [32]byte
	// inline: the content is in the store's payloads table, not a spool
	// file (content.go); set before the document is committed or
	// recovered, read without the lock afterwards.
	inline bool
	// content is the inline content held in memory from the commit to the
	// first dispatch, which takes it (content.go): the first send does not
	// read back the row it just committed. nil once taken, or when the
	// queue was long at submit (memory stays bounded).
	content []byte
	// resultInline is a small verified result not yet committed: the next
	// flush stores it (store.PayloadResult) with, or before, the terminal
	// state (content.go).
	resultInline []byte
	// rstream assembles the current attempt's streamed result (profile
	// 4.3.1); nil when none is arriving.
	rstream *resultStream
}

// claimRun is a claim of a runtime document.
type claimRun struct {
	c       *gatewayv1.ClaimCheck
	attempt uint32
	key     entKey     // the deferred entity
	sess    *sessState // session that saw DEFERRED
	// slot is what the deferred entity stands for: its chunk index, or -1
	// for the root (a document sent whole). A later attempt re-sends the
	// same slot; that is how a claim of an earlier attempt finds the entity
	// it resumes now (profile 6).
	slot int64
}

// noSlot marks a claim whose entity is in a peer scope (nothing to resume).
const noSlot = -2

// chunk is the slot as the store keeps it with the claim, so that the
// claim is matched to its chunk after restarts (store schema 4).
func (cr *claimRun) chunk() store.ClaimChunk {
	if cr.slot == noSlot {
		return store.ClaimChunk{}
	}
	return store.ClaimChunk{Set: true, Index: cr.slot}
}

func (d *docRun) terminal() bool { return store.IsTerminal(d.rec.Doc.GetState()) }

// addEvent records ev for the document: bumps rev and queues the event for
// the flusher (DESIGN.md section 5: every change is one event). Rev 1 is
// the document's creation (the #document PENDING event of the Create
// batch), so changes start at rev 2. Changes made before the Create commit
// (a pipelined upload, profile 4.2: the peer answers early chunks while the
// client is still uploading) queue like any other and go into the Create
// batch right after the creation event, in order; changes made while the
// Create batch commits (committing) go to the next flush. Either way every
// event has since = the previous event's rev: a watcher sees contiguous
// revisions from 1 (TestPreCommitChangesAreEvents).
func (d *docRun) addEvent(ev *gatewayv1.Event) {
	doc := d.rec.Doc
	now := time.Now()
	doc.Rev++
	doc.UpdateTime = timestamppb.New(now)
	d.markDirty(now)
	ev.Time = timestamppb.New(now)
	ev.DocumentId = d.id
	ev.Rev = doc.Rev
	ev.Since = doc.Rev - 1
	d.pending = append(d.pending, ev)
}

// markDirty notes that d has changes to commit; dirtySince is when the
// oldest of them was made (flush holds progress for at most flushHold).
func (d *docRun) markDirty(now time.Time) {
	if !d.dirty {
		d.dirty = true
		d.dirtySince = now
	}
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
	d.dirtyEnts[dirtyEnt{d.attempt, k}] = e
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
		if k == rootKey(d.rootID) {
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
	r.Private = appendPrivate(nil, d.attempt)
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

// privateV1 is the version byte of DocumentRecord.Private: 0x01, then the
// dispatch attempt generation as a uvarint. The generation keys entity and
// digest rows (store migration 2) and must grow across restarts.
const privateV1 = 0x01

func appendPrivate(b []byte, attempt uint32) []byte {
	return binary.AppendUvarint(append(b, privateV1), uint64(attempt))
}

// parsePrivate returns the attempt generation stored by appendPrivate (0
// for a record written before it existed).
func parsePrivate(b []byte) uint32 {
	if len(b) < 2 || b[0] != privateV1 {
		return 0
	}
	v, n := binary.Uvarint(b[1:])
	if n <= 0 || v > math.MaxUint32 {
		return 0
	}
	return uint32(v)
}
