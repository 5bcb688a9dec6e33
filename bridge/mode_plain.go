package bridge

import (
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// plainMode: plain draft-02 (docs/profile.md 9); its machinery (sending,
// result parts, the gateway's own rehydration) is in plain.go. See
// peerMode.
type plainMode struct{}

var _ peerMode = plainMode{}

func (plainMode) name() string    { return modePlain }
func (plainMode) pipelined() bool { return false }

// send: one root entity whose payload is the content, or (a larger one)
// STATUS(R, DEHYDRATING) and plain chunk children.
func (plainMode) send(env *docEnv, j *attempt, _ chunkSource) error {
	return j.sendPlain(!j.d.plan.whole(j.d.size, env.opts.InlineThreshold), true)
}

// attributeRegLocked matches an entity a plain peer sent (docs/profile.md
// 9.4):
//
//  1. Only root-scope entities: the gateway sends no other.
//  2. With a parent-id, the entity is a new one of the peer's (its
//     entity-id is the peer's numbering and is never compared): it answers
//     the live entity whose id is the parent-id, or nothing. The session
//     then counts as one whose peer numbers its own entities.
//  3. Without a parent-id, the entity-id must name a live entity of this
//     session, and the peer must not have numbered an entity of its own on
//     this session (then its entity-ids are its own, and the match would
//     be a coincidence of numbering).
//  4. An entity answered once is answered: a second result for it is
//     refused (the first one stands).
//
// A taken result counts as being read (plainActive) from here on, so the
// settle timers wait for it.
func (plainMode) attributeRegLocked(env *docEnv, ss *sessState, h *wire.EntityHeader) (*entRef, refusal) {
	ref, r := attributePlain(env, ss, h)
	if ref != nil {
		ref.att.plainActive++
	}
	return ref, r
}

func attributePlain(env *docEnv, ss *sessState, h *wire.EntityHeader) (*entRef, refusal) {
	if sc := scopeOf(h); sc != 0 {
		return nil, refused(refuseUnmatched, "entity %d is in scope %d; the gateway sends root-scope entities only", h.EntityID, sc)
	}
	if h.ParentID != nil {
		env.reg.attribOf(ss).ownNumbering = true
		ref := liveRefRegLocked(ss, *h.ParentID)
		if ref == nil {
			return nil, refused(refuseUnmatched, "parent-id %d names no live entity of this session", *h.ParentID)
		}
		return claimResultRegLocked(ref)
	}
	ref := liveRefRegLocked(ss, h.EntityID)
	if ref == nil {
		return nil, refused(refuseUnmatched, "entity-id %d names no live entity of this session and the entity has no parent-id", h.EntityID)
	}
	if env.reg.attribOf(ss).ownNumbering {
		r := refused(refuseAmbiguous, "entity-id %d without parent-id: the peer numbers its own entities on this session, so the id is its own", h.EntityID)
		r.doc = ref.att.d.id
		return nil, r
	}
	return claimResultRegLocked(ref)
}

// takeResult: R's result is the document's result; a chunk's is spooled
// until the document is rehydrated.
func (plainMode) takeResult(env *docEnv, ref *entRef, e *quicpeer.IncomingEntity) {
	env.onPlainResult(ref, e)
}

func (plainMode) childChangedLocked(d *docRun)     { d.checkPlainChildrenLocked() }
func (plainMode) awaitResultLocked(d *docRun) bool { return d.finishPlainLocked() }

// timeoutGrace: none, the gateway is the only one enforcing it.
func (plainMode) timeoutGrace() time.Duration { return 0 }
func (plainMode) timesRehydration() bool      { return true }

func (plainMode) rootPayload(_ *docEnv, _ *sessState, _ *docRun, _ uint32, content []byte) ([]byte, error) {
	return content, nil
}

func (plainMode) placedRegLocked(*docEnv, *sessState)  {}
func (plainMode) docLeftRegLocked(*docEnv, *sessState) {}
func (plainMode) capacity(_ *docEnv, ss *sessState) uint64 {
	return uint64(max(ss.n.MaxWindow, 1))
}
func (plainMode) endMeansPeerDown() bool { return true }
func (plainMode) carriesMetadata() bool  { return true }

// draft04Mode: plainMode on a draft-04 connection (docs/profile.md 1.2):
// every document whole with the six-member header (no metadata, no
// completion policy), one document per connection (the reference
// conversation: the next one dials anew), so a session's end says nothing
// about its peer. See peerMode.
type draft04Mode struct{ plainMode }

var _ peerMode = draft04Mode{}

func (draft04Mode) name() string { return modeDraft04 }

func (draft04Mode) send(env *docEnv, j *attempt, _ chunkSource) error {
	return j.sendPlain(false, false)
}

// placedRegLocked: the session takes no other document.
func (draft04Mode) placedRegLocked(env *docEnv, ss *sessState) {
	ss.goaway = true
	env.retireRegLocked(ss)
}

// docLeftRegLocked: the conversation ends with its document (GOAWAY, the
// peer's echo, close).
func (draft04Mode) docLeftRegLocked(env *docEnv, ss *sessState) {
	if len(ss.docs) == 0 {
		env.endDraft04(ss)
	}
}

// capacity: one document per connection, Options.PeerDraft04Conns
// connections at once.
func (draft04Mode) capacity(env *docEnv, _ *sessState) uint64 {
	return uint64(env.opts.PeerDraft04Conns)
}
func (draft04Mode) endMeansPeerDown() bool { return false }

// carriesMetadata: the six-member header has no metadata member.
func (draft04Mode) carriesMetadata() bool { return false }
