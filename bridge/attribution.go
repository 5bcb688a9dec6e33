package bridge

import (
	"fmt"
	"io"

	"github.com/pipestream/gateway/quicpeer"
)

// Result attribution (docs/profile.md 9.4): which live entity of this
// session an entity the peer sent answers. The peer's entity ids are its
// own numbering (draft-02 Section 9.1: each sender assigns its IDs; an
// entity is immutable and a transformation is a new entity), so an
// entity-id is compared with the gateway's ids only where the
// conversation leaves no other reading. Every entity is matched to at
// most one entity of one attempt of this session, through sessState.ents
// only: a result can reach no document but the one whose entity it
// answers, whatever its tenant.
//
// The rules themselves are each mode's (peerMode.attributeRegLocked): plain
// draft-02 and draft-04 peers in mode_plain.go (plainMode.attributeRegLocked,
// parent-id first), profile peers in mode_profile.go
// (profileMode.attributeRegLocked). This file holds what they share.

// Why an entity the peer sent was not taken as a result (the reason label
// of pipestream_bridge_results_refused_total).
const (
	refuseUnmatched = "unmatched" // it names no live entity of this session
	refuseDuplicate = "duplicate" // the entity it answers already has its result
	refuseAmbiguous = "ambiguous" // only its entity-id could match, and the peer numbers its own entities
	refuseForm      = "form"      // not in the form the profile's results take (4.3)
)

// refusal says why an entity was not taken (reason "" = taken).
type refusal struct {
	reason, detail string
	doc            string // the document concerned, when one is
}

func refused(reason, format string, a ...any) refusal {
	return refusal{reason: reason, detail: fmt.Sprintf(format, a...)}
}

// liveRefRegLocked is the root-scope entity id of this session's running
// documents, or nil.
func liveRefRegLocked(ss *sessState, id uint32) *entRef {
	ref := ss.ents[rootKey(id)]
	if ref == nil || !ref.att.newest() {
		return nil
	}
	return ref
}

// claimResultRegLocked records that ref's entity has its result; a second
// one is refused.
func claimResultRegLocked(ref *entRef) (*entRef, refusal) {
	a := ref.att
	if a.answered[ref.key] {
		r := refused(refuseDuplicate, "entity %d already has its result", ref.key.id)
		r.doc = a.d.id
		return nil, r
	}
	if a.answered == nil {
		a.answered = map[entKey]bool{}
	}
	a.answered[ref.key] = true
	return ref, refusal{}
}

// sessAttrib is what attribution learned about one session: whether its
// peer numbers its own entities, and how many entities it refused (the
// log line is written for the first refusalsLogged and then every
// refusalsLogged-th, the metric counts every one).
type sessAttrib struct {
	ownNumbering bool
	refused      int
}

// refusalsLogged bounds the WARN lines per session (see sessAttrib).
const refusalsLogged = 20

// refuseResult discards an entity that is no result the gateway takes: a
// protocol event, logged and counted, never silently dropped or taken.
func (b *Bridge) refuseResult(ss *sessState, e *quicpeer.IncomingEntity, r refusal) {
	h := e.Header
	parent := "none"
	if h.ParentID != nil {
		parent = fmt.Sprint(*h.ParentID)
	}
	b.m.resultsRefused.WithLabelValues(r.reason).Inc()
	b.mu.Lock()
	st := b.reg.attribOf(ss)
	st.refused++
	n := st.refused
	b.mu.Unlock()
	if n <= refusalsLogged || n%refusalsLogged == 0 {
		b.log.Warn("bridge: refused an entity from the peer as a result (protocol event)", "peer", ss.pc.addr,
			"reason", r.reason, "entity", h.EntityID, "parent", parent, "doc", r.doc, "detail", r.detail, "refused_on_session", n)
	}
	_, _ = io.Copy(io.Discard, e.Payload)
}
