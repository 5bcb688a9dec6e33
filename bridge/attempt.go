package bridge

import (
	"context"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// entKey identifies an entity of a document's dispatch attempt: (scope,
// entity id) on the session the attempt runs on, plus the instance of the
// scope: a peer may reuse a scope ID within one document after its
// SCOPE_DIGEST (profile 2), and each use is a scope of its own. Session-level
// maps (sessState.ents) leave inst 0: there a scope ID names one live scope.
type entKey struct{ scope, inst, id uint32 }

// rootKey is the key of a root-scope entity.
func rootKey(id uint32) entKey { return entKey{id: id} }

// scopeKey is one use of a peer scope in a document's attempt.
type scopeKey struct{ scope, inst uint32 }

// attempt is one dispatch attempt of a document on a session (see the
// package doc). It is made whole by newAttemptLocked for every dispatch
// and never reused: a callback that holds an attempt asks whether it is
// still the document's by comparing pointers (current, newest). d, ss,
// gen and ctx never change; every other field is guarded by its
// document's mutex (docRun.mu).
type attempt struct {
	d   *docRun
	ss  *sessState // the session it runs on; nil for the idle attempt
	gen uint32     // 1-based generation, persisted in rec.Private; keys its rows
	ctx context.Context

	// stop ends the attempt's sending (nil once called, and for the idle
	// attempt).
	stop context.CancelFunc
	// ended: the attempt was aborted or its upload abandoned; it runs on
	// no session any more (the document waits for the next attempt).
	ended bool

	ents      map[entKey]*gatewayv1.Entity
	digests   map[scopeKey]*gatewayv1.ScopeDigest
	scopeUses map[uint32]uint32 // uses of each peer scope ID so far
	// entSince: when each root-scope entity was sent or last changed
	// status (entity timeouts, timeouts.go).
	entSince map[entKey]time.Time
	// sessEnts: the session-level mappings (sessState.ents) made for this
	// attempt, dropped by releaseSessLocked when it ends, so a session
	// outliving thousands of documents holds none of them.
	sessEnts []sessEnt

	// answered: the entities (R, chunks) whose result the peer sent;
	// a second one is refused (attribution.go).
	answered map[entKey]bool

	// dispatched: the dispatcher started it (counted in its peer's
	// sending until its sending returns); a pipelined upload's is not.
	dispatched   bool
	rootID       uint32
	carried      bool // the peer reported on one of its entities
	sendDone     bool // every stream of the document was sent
	rootComplete bool
	rootFailures uint32
	resultReady  bool   // a verified result is stored (or absent, plain)
	resultErr    string // why the result failed (the document fails with it)
	finishTimer  *time.Timer
	// inlineOffer: the root's header offered an inline result of up to
	// this many extension octets (profile 4.3.2); 0: none, a COMPLETE's
	// extension is skipped.
	inlineOffer int
	// rstream assembles the streamed result (profile 4.3.1); nil when none
	// is arriving.
	rstream *resultStream

	// mode: how the attempt talks to its peer (mode.go; its session's).
	mode peerMode
	// Plain modes (docs/profile.md 9): plainTotal is its chunk count once all were sent (0 before, and for
	// a document sent whole), plainParts holds the chunk results a plain
	// peer returned (spooled), plainSettle waits for a result or the peer's
	// rehydration, plainActive counts result streams being read.
	plainTotal  int
	plainParts  map[uint64]plainPart
	plainSettle *time.Timer
	plainActive int
	// awaitingParts: the assembly waits for the results of completed
	// chunks (awaitMissingPartsLocked).
	awaitingParts bool
}

// idleAttempt stands for "no attempt runs" before d's first dispatch in
// this process; gen is the newest generation the store knows (0 for a new
// document, the previous process's after a restart).
func idleAttempt(d *docRun, gen uint32) *attempt {
	return &attempt{d: d, gen: gen, ended: true, mode: profileMode{}, ents: map[entKey]*gatewayv1.Entity{},
		digests: map[scopeKey]*gatewayv1.ScopeDigest{}, scopeUses: map[uint32]uint32{}}
}

// newAttemptLocked makes d's next attempt and binds it to ss (caller
// holds d's lock alone): newAttemptRegLocked, then attemptStartedLocked.
func (d *docRun) newAttemptLocked(ss *sessState) *attempt {
	d.env.regLock()
	a, prev := d.newAttemptRegLocked(ss)
	d.env.regUnlock()
	d.attemptStartedLocked(prev)
	return a
}

// placeRegLocked starts d's next attempt on ss, the session placement
// picked, and moves placement's round-robin past ss's peer: the next tie
// goes to the next peer. Caller holds d's lock and the registry's mu.
func (d *docRun) placeRegLocked(ss *sessState) (a, prev *attempt) {
	d.env.reg.rotatePast(ss.pc)
	return d.newAttemptRegLocked(ss)
}

// newAttemptRegLocked makes d's next attempt on ss and does the
// registry's part of it: ss takes d, ss's mode hears of it, and the
// session mappings of the previous attempt (prev) are released. The new
// attempt starts empty. Caller holds d's lock and the registry's mu, then
// calls attemptStartedLocked(prev) without the registry's.
func (d *docRun) newAttemptRegLocked(ss *sessState) (a, prev *attempt) {
	prev = d.att
	releaseSessRegLocked(prev)
	ctx, cancel := context.WithCancel(d.env.ctx)
	a = &attempt{d: d, ss: ss, gen: prev.gen + 1, ctx: ctx, stop: cancel,
		ents: map[entKey]*gatewayv1.Entity{}, digests: map[scopeKey]*gatewayv1.ScopeDigest{},
		scopeUses: map[uint32]uint32{}, entSince: map[entKey]time.Time{}, mode: ss.mode}
	d.att = a
	d.rec.DispatchAttempts++
	ss.docs[d] = struct{}{}
	d.rec.Doc.WaitReason = ""
	ss.mode.placedRegLocked(d.env, ss)
	return a, prev
}

// attemptStartedLocked is the document's part of a new attempt: what the
// previous attempt (prev) held in the gateway is dropped and the change
// marked for the flusher.
func (d *docRun) attemptStartedLocked(prev *attempt) {
	prev.dropResultStreamLocked()
	prev.dropPlainLocked()
	d.out.markDirty(time.Now())
}

// peerAddr is the address of the peer the attempt runs on ("" for the
// idle attempt).
func (a *attempt) peerAddr() string {
	if a.ss == nil {
		return ""
	}
	return a.ss.pc.addr
}

// newest reports whether a is still its document's newest attempt and the
// document is not finished (a may have ended: the document waits for the
// next one). Caller holds the document's lock.
func (a *attempt) newest() bool { return a.d.att == a && !a.d.terminal() && !a.d.dropped }

// current reports whether a is still its document's running attempt: the
// newest, not ended, the document not finished. Caller holds the document's lock.
func (a *attempt) current() bool { return a.newest() && !a.ended }

// stopSending cancels the attempt's sending (once).
func (a *attempt) stopSending() {
	if a.stop != nil {
		a.stop()
		a.stop = nil
	}
}

// stopFinishTimer stops the attempt's finish timer, if armed.
func (a *attempt) stopFinishTimer() {
	if a.finishTimer != nil {
		a.finishTimer.Stop()
	}
}

// counts computes entity counts by status over the attempt.
func (a *attempt) counts() *gatewayv1.EntityCounts {
	c := &gatewayv1.EntityCounts{}
	for _, e := range a.ents {
		c.Total++
		countStatus(c, e.Status)
	}
	return c
}

// countStatus counts one entity of status s into c.
func countStatus(c *gatewayv1.EntityCounts, s gatewayv1.EntityStatus) {
	switch s {
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

// allChildrenComplete reports how many non-root entities there are and how
// many of them are COMPLETE.
func (a *attempt) allChildrenComplete() (complete, total int) {
	for k, e := range a.ents {
		if k == rootKey(a.rootID) {
			continue
		}
		total++
		if e.Status == gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE {
			complete++
		}
	}
	return complete, total
}

// rootChildren counts the children of the root.
func (a *attempt) rootChildren() int {
	n := 0
	for k := range a.ents {
		if k.scope == 0 && k.id != a.rootID {
			n++
		}
	}
	return n
}

// slotOf is what entity k of the attempt stands for: its chunk index, -1
// for the root, noSlot for an entity in a peer scope.
func (a *attempt) slotOf(k entKey) int64 {
	switch {
	case k.scope != 0:
		return noSlot
	case k == rootKey(a.rootID):
		return -1
	}
	if e := a.ents[k]; e != nil {
		return int64(e.ChunkIndex)
	}
	return noSlot
}
