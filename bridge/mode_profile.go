package bridge

import (
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// profileMode: this project's profile (docs/profile.md 4-8). See peerMode.
type profileMode struct{}

var _ peerMode = profileMode{}

func (profileMode) name() string    { return modeProfile }
func (profileMode) pipelined() bool { return true }

// send: whole (an envelope carrying the blob, 4.1) or dehydrated (R, chunk
// children, then R's envelope with the totals, 4.2).
func (profileMode) send(env *docEnv, j *attempt, src chunkSource) error { return j.sendProfile(src) }

// attributeRegLocked matches an entity a profile peer sent: a result (role
// result) or result part (role result-part) of R has exactly the form of
// profile 4.3: entity-id R, root scope, no parent-id. A second whole
// result or summary for R is refused; parts are checked by the result
// stream (4.3.1).
func (profileMode) attributeRegLocked(env *docEnv, ss *sessState, h *wire.EntityHeader) (*entRef, refusal) {
	role := h.Metadata[metaRole]
	switch {
	case role != roleResult && role != roleResultPart:
		return nil, refused(refuseForm, "entity %d carries no %s of a result", h.EntityID, metaRole)
	case h.ParentID != nil:
		return nil, refused(refuseForm, "entity %d carries parent-id %d; a result of the profile names its document's root by entity-id only", h.EntityID, *h.ParentID)
	case scopeOf(h) != 0:
		return nil, refused(refuseForm, "entity %d is in scope %d; results are root-scope entities", h.EntityID, scopeOf(h))
	}
	ref := liveRefRegLocked(ss, h.EntityID)
	if ref == nil || ref.key != rootKey(ref.att.rootID) {
		return nil, refused(refuseUnmatched, "entity-id %d names no running document's root on this session", h.EntityID)
	}
	if role == roleResultPart {
		return ref, refusal{}
	}
	return claimResultRegLocked(ref)
}

// takeResult: a part of a streamed result (4.3.1), its summary, or a
// whole result.
func (profileMode) takeResult(env *docEnv, ref *entRef, e *quicpeer.IncomingEntity) {
	a, h := ref.att, e.Header
	if h.Metadata[metaRole] == roleResultPart {
		a.onResultPart(e)
		return
	}
	if _, streamed := h.Metadata[metaResultParts]; streamed {
		a.onResultSummary(e)
		return
	}
	a.onWholeResult(e)
}

func (profileMode) childChangedLocked(*docRun)     {}
func (profileMode) awaitResultLocked(*docRun) bool { return false }
func (profileMode) timeoutGrace() time.Duration    { return timeoutGrace }
func (profileMode) timesRehydration() bool         { return false }

func (profileMode) rootPayload(env *docEnv, ss *sessState, d *docRun, id uint32, content []byte) ([]byte, error) {
	return ss.codec.MarshalPipeDoc(d.envelope(id, content))
}

func (profileMode) placedRegLocked(*docEnv, *sessState)  {}
func (profileMode) docLeftRegLocked(*docEnv, *sessState) {}
func (profileMode) capacity(_ *docEnv, ss *sessState) uint64 {
	return uint64(max(ss.n.MaxWindow, 1))
}
func (profileMode) endMeansPeerDown() bool { return true }
func (profileMode) carriesMetadata() bool  { return true }
