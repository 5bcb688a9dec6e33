package bridge

import (
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// peerMode is how the documents of one session talk to its peer (issue
// 21 item 2, in the manner of connect-go's protocol interface). A session
// gets one when its handshake completes (chooseModeLocked) and every attempt on
// it keeps it; the rest of the package asks the mode and never branches on
// the framing or the profile itself. There are three:
//
//   - profileMode (mode_profile.go): this project's profile
//     (docs/profile.md 4-8): PipeDoc envelopes, pipelined uploads, results
//     of role result / result-part naming R by entity-id.
//   - plainMode (mode_plain.go): plain draft-02 (docs/profile.md 9): raw
//     content, whole or as chunk children; results are the peer's own
//     entities, attributed by parent-id first (9.4); the gateway
//     rehydrates R itself when the peer does not.
//   - draft04Mode (mode_plain.go): plainMode on a draft-04 connection:
//     every document whole with the six-member header, one document per
//     connection (the reference conversation).
//
// The ...RegLocked methods run with the registry's mu held (and the
// document's lock, where there is one); childChangedLocked and
// awaitResultLocked under the document's lock alone; send and
// takeResult with no lock (they read and write streams, and lock the
// document for each step).
type peerMode interface {
	// name is the mode as /healthz and the logs show it.
	name() string
	// send performs attempt j: the document's streams to the peer (src
	// non-nil: chunks of an upload in progress, profile only).
	send(env *docEnv, j *attempt, src chunkSource) error
	// pipelined reports whether a document may be sent while its upload
	// runs (startPipe); else it is sent from the spool.
	pipelined() bool
	// attributeRegLocked matches an entity the peer sent to the live entity
	// of ss it answers, or says why it is refused (docs/profile.md 9.4:
	// the attribution rules of the mode, all of them in its method).
	attributeRegLocked(env *docEnv, ss *sessState, h *wire.EntityHeader) (*entRef, refusal)
	// takeResult reads a result entity attributed to ref and records it
	// on ref's attempt.
	takeResult(env *docEnv, ref *entRef, e *quicpeer.IncomingEntity)
	// childChangedLocked runs after a child entity of d's attempt
	// changed status (the plain modes may rehydrate R themselves).
	childChangedLocked(d *docRun)
	// awaitResultLocked decides d, whose root is COMPLETE while no result
	// is in yet; it reports whether it took over (else the caller waits
	// resultFinishGrace for a result stream).
	awaitResultLocked(d *docRun) bool
	// timeoutGrace is added to an entity's timeout-ms before the gateway
	// acts (a peer that enforces the timeout itself gets the first word).
	timeoutGrace() time.Duration
	// timesRehydration reports whether an entity REHYDRATING is under the
	// entity timeout (profile 5: a profile peer's streamed result is not).
	timesRehydration() bool
	// rootPayload is what a root entity's payload is for content: a
	// PipeDoc envelope or the raw content (a redemption resends it).
	rootPayload(env *docEnv, ss *sessState, d *docRun, id uint32, content []byte) ([]byte, error)
	// placedRegLocked runs once an attempt was placed on ss.
	placedRegLocked(env *docEnv, ss *sessState)
	// docLeftRegLocked runs once a document finished or left ss.
	docLeftRegLocked(env *docEnv, ss *sessState)
	// capacity is how many documents ss takes at once (placement's load).
	capacity(env *docEnv, ss *sessState) uint64
	// endMeansPeerDown reports whether the session's end marks its peer
	// down until a new session is up.
	endMeansPeerDown() bool
	// carriesMetadata reports whether the entity headers sent in this
	// mode carry metadata (the processor, the request metadata): placement
	// gives a document that needs them (plan.needsMetadata) only to a
	// session whose mode does.
	carriesMetadata() bool
}

// Mode names (PeerStatus, logs).
const (
	modeProfile = "profile"
	modePlain   = "plain"
	modeDraft04 = "draft-04"
)

// chooseModeLocked picks the mode of a session whose handshake completed: its
// framing (a draft-04 server is detected on receipt, and kept for the next
// dials to the peer), and the profile only on draft-02 with the peer's
// consent (or when told to).
func (b *Bridge) chooseModeLocked(ss *sessState) peerMode {
	if ss.s.Framing() == wire.FramingDraft04 {
		if ss.pc.mode == quicpeer.FramingAuto {
			ss.pc.framing = quicpeer.FramingDraft04
		}
		return draft04Mode{}
	}
	switch b.opts.PeerProfile {
	case ProfileOn:
		return profileMode{}
	case ProfileAuto:
		if ss.n.Profile {
			return profileMode{}
		}
	}
	return plainMode{}
}
