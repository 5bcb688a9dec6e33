package bridge

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Event kinds (docs/architecture.md).
const (
	kindStatus   = "#status"
	kindDocument = "#document"
	kindClaim    = "#claim"
)

// docRun is the in-memory state of a non-terminal document (and of a
// finished one until its terminal state is durable). Its fields live as
// long as the document in this process; what one dispatch attempt needs
// lives in att, what waits to be committed in out. Every field is guarded
// by mu unless noted (and, until the registry's mu is taken only around
// registry state, by that too: doclock.go).
type docRun struct {
	// mu guards the document and its attempts; it is taken before the
	// registry's mu, never after (doclock.go).
	mu sync.Mutex
	// env is what the document's code may reach (bridge.go); never the
	// Bridge itself. Set when the docRun is made, never changed.
	env    *docEnv
	id     string
	tenant Tenant
	plan   *plan
	rec    *store.DocumentRecord // rec.Doc is the live document (no entity/digest/claim lists)

	// att is the newest dispatch attempt (attempt.go): never nil, an idle
	// one (no session) until the first dispatch in this process.
	att *attempt
	// out holds the changes not yet committed (outbox.go).
	out outbox
	// committed is set once the Create batch is durable; before that the
	// flusher skips the document and its changes wait in out.
	committed    bool
	committing   bool   // the Create batch is on its way: later changes follow it
	persistedRev uint64 // the revision the store holds (the next update's PrevRev)
	durableRev   uint64 // the highest revision a flush committed (waitDurable)

	// claims are the document's claim checks of every attempt (a claim of
	// an earlier attempt stays redeemable, profile 6).
	claims map[string]*claimRun
	// preRedeem: a claim of an earlier attempt was redeemed before the
	// current attempt deferred the same chunk again (key: chunk slot); the
	// current attempt's claim is redeemed through it when it is issued.
	preRedeem map[int64]string
	// resumeVia: a claim the current attempt was issued for such a slot →
	// the earlier claim redeemed for it; the entity is resumed through the
	// new claim once a flush made it durable (resumeDurableLocked).
	resumeVia map[string]string

	queued bool // in the registry's queue; written under both locks
	// finished: d reached a terminal state (setState). Read without d's
	// lock by whoever holds only the registry's: a finished document left
	// in the queue (it leaves at the next placement) is no work.
	finished atomic.Bool
	queuedAt time.Time
	// waitSince: when d started waiting for a session that carries it
	// (its first queueing since the peer last reported on it); --peer-wait
	// counts from here, so attempts on sessions that end at once (not
	// counted against MaxDispatchAttempts) cannot keep it waiting forever.
	waitSince time.Time
	// dropped: its lease is lost (lease.go); another replica drives it, and
	// nothing of this process touches it any more.
	dropped   bool
	uploading bool // an Upload is still streaming content (pipelined)

	// size and sum: the whole document's size and SHA-256, known once the
	// content is spooled.
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
	// pending is the content of a document dispatched before its Create
	// commits (ridecreate.go): every send reads it until the commit, when
	// the store has it (or the document is finished). nil otherwise.
	pending []byte
	// settled is closed when the document reaches a terminal state, for
	// the Submit that waits to commit its creation with it (ridecreate.go);
	// nil when nothing waits.
	settled chan struct{}
}

// claimRun is a claim of a runtime document.
type claimRun struct {
	c *gatewayv1.ClaimCheck
	// att is the attempt the claim was issued to (on att.ss, the session
	// that saw DEFERRED); for a claim loaded at recovery, the idle attempt
	// standing for the previous process's newest one.
	att *attempt
	key entKey // the deferred entity
	// slot is what the deferred entity stands for: its chunk index, or -1
	// for the root (a document sent whole). A later attempt re-sends the
	// same slot; that is how a claim of an earlier attempt finds the entity
	// it resumes now (profile 6).
	slot int64
	// durable: the store holds the claim (a flush committed it, or it was
	// loaded at recovery); only then can it be redeemed there.
	durable bool
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

// sess is the session d's current attempt runs on; nil when none runs
// (never dispatched here, queued, aborted or abandoned).
func (d *docRun) sess() *sessState {
	if d.att.ended {
		return nil
	}
	return d.att.ss
}

func (d *docRun) terminal() bool { return store.IsTerminal(d.rec.Doc.GetState()) }

// addEvent records ev for the document: bumps rev and queues the event in
// the outbox (docs/architecture.md: every change is one event). Rev 1 is
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
	d.out.markDirty(now)
	ev.Time = timestamppb.New(now)
	ev.DocumentId = d.id
	ev.Rev = doc.Rev
	ev.Since = doc.Rev - 1
	d.out.events = append(d.out.events, ev)
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
		d.finished.Store(true)
	}
	d.addEvent(&gatewayv1.Event{Kind: kindDocument, State: s, Message: msg})
	if store.IsTerminal(s) && d.settled != nil {
		close(d.settled)
		d.settled = nil
	}
}

// setEntity records a status change of entity k of the current attempt
// and its #status event.
func (d *docRun) setEntity(k entKey, e *gatewayv1.Entity) {
	d.att.ents[k] = e
	d.out.putEntity(d.att.gen, k, e)
	d.addEvent(&gatewayv1.Event{Kind: kindStatus, EntityId: e.EntityId, ScopeId: e.ScopeId, EntityStatus: e.Status})
}

// appendError appends msg to the document's error.
func (d *docRun) appendError(msg string) {
	if d.rec.Doc.Error == "" {
		d.rec.Doc.Error = msg
	} else {
		d.rec.Doc.Error += "; " + msg
	}
}

// snapshot returns a copy of the record for a store write (counts of the
// current attempt filled, its generation in Private).
func (d *docRun) snapshot() *store.DocumentRecord {
	r := *d.rec
	r.Private = appendPrivate(nil, d.att.gen)
	r.Doc = proto.Clone(d.rec.Doc).(*gatewayv1.Document)
	r.Doc.EntityCounts = d.att.counts()
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

// setWaitReason sets why d waits ("" once it no longer does), with the
// #document event that carries the reason into the event log (as
// superviseWaitLocked does). Caller holds the document's lock.
func (d *docRun) setWaitReason(why string) {
	if d.rec.Doc.WaitReason == why {
		return
	}
	d.rec.Doc.WaitReason = why
	d.addEvent(&gatewayv1.Event{Kind: kindDocument, State: d.rec.Doc.State, Message: why})
}
