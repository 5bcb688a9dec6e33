package bridge

import (
	"fmt"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Entity timeouts (docs/profile.md 9.3): the completion policy's
// timeout-ms (draft-02 default 300,000 ms) bounds every entity of a
// running attempt, measured from when it was sent or last changed status.
// A peer that enforces it itself (this project's does, profile 5) acts
// first; the gateway acts timeoutGrace later, so that a peer that reads an
// entity, says PROCESSING and never finishes cannot hold a document
// forever. An entity the peer never reported on gets at least
// pendingTimeoutFloor; entities waiting on their children (DEHYDRATING),
// on a claim (DEFERRED) or resuming themselves (YIELDED) are not timed.

// defaultTimeoutMs is draft-02's completion-policy timeout-ms default.
const defaultTimeoutMs = 300_000

// superviseTimeoutLocked ends the first overdue entity of d's attempt
// when it runs.
func (d *docRun) superviseTimeoutLocked(now time.Time) {
	if d.terminal() || d.sess() == nil || d.dropped {
		return
	}
	if k, e, ok := d.overdue(now); ok {
		d.timeoutLocked(k, e)
	}
}

// overdue returns an entity of d's attempt past its timeout.
func (d *docRun) overdue(now time.Time) (entKey, *gatewayv1.Entity, bool) {
	a := d.att
	limit := time.Duration(defaultTimeoutMs) * time.Millisecond
	if ms := d.plan.opts.GetCompletionPolicy().GetTimeoutMs(); ms > 0 {
		limit = time.Duration(ms) * time.Millisecond
	}
	grace := a.mode.timeoutGrace()
	for k, since := range a.entSince {
		e := a.ents[k]
		if e == nil || !timedStatus(e.Status, a.mode.timesRehydration()) {
			continue
		}
		l := limit
		if e.Status == gatewayv1.EntityStatus_ENTITY_STATUS_PENDING {
			l = max(l, pendingTimeoutFloor)
		}
		if now.Sub(since) > l+grace {
			return k, e, true
		}
	}
	return entKey{}, nil, false
}

// timedStatus: statuses of an entity being worked on. A profile peer's
// rehydration (streaming the result) is not bounded by timeout-ms (profile
// 5); a plain peer's is.
func timedStatus(s gatewayv1.EntityStatus, rehydration bool) bool {
	switch s {
	case gatewayv1.EntityStatus_ENTITY_STATUS_PENDING, gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING,
		gatewayv1.EntityStatus_ENTITY_STATUS_RETRYING:
		return true
	case gatewayv1.EntityStatus_ENTITY_STATUS_REHYDRATING:
		return rehydration
	}
	return false
}

// timeoutLocked runs the on-timeout action for entity k of d: the entity
// is ABANDONED at the peer; a chunk under SKIP is left out and the
// document goes on; under RETRY the document is dispatched again while
// attempts remain; otherwise (FAIL, unspecified, DEFER, which needs a
// claim only the peer can issue) the document fails with an error naming
// the entity, the peer and what the peer last reported.
func (d *docRun) timeoutLocked(k entKey, e *gatewayv1.Entity) {
	cp := d.plan.opts.GetCompletionPolicy()
	ms := cp.GetTimeoutMs()
	if ms == 0 {
		ms = defaultTimeoutMs
	}
	a := d.att
	what := "document root"
	if k != rootKey(a.rootID) {
		what = fmt.Sprintf("chunk %d", e.ChunkIndex)
	}
	msg := fmt.Sprintf("entity %d (%s) timed out: no terminal status within timeout-ms %d at the peer %s, which last reported %s",
		e.EntityId, what, ms, a.peerAddr(), wire.Status(e.Status))
	d.env.log.Warn("bridge: entity timed out", "doc", d.id, "entity", e.EntityId, "status", e.Status, "timeout_ms", ms)
	d.abandonAtPeerLocked(k)
	e.Status = gatewayv1.EntityStatus_ENTITY_STATUS_ABANDONED
	e.Message = msg
	d.setEntity(k, e)
	delete(a.entSince, k)
	switch {
	case cp.GetOnTimeout() == gatewayv1.CompletionPolicy_SKIP && k != rootKey(a.rootID):
		a.mode.childChangedLocked(d)
	case cp.GetOnTimeout() == gatewayv1.CompletionPolicy_RETRY:
		d.abortAttemptLocked(msg, true)
	default:
		d.finishLocked(gatewayv1.State_FAILED, msg)
	}
	d.env.kickFlush()
}

// abandonAtPeerLocked tells the peer the gateway gave up on entity k.
func (d *docRun) abandonAtPeerLocked(k entKey) {
	if ss := d.sess(); ss != nil && k.scope == 0 && !d.env.sessClosed(ss) {
		d.env.giveUpLocked(ss, d, k.id)
	}
}
