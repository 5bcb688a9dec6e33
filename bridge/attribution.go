package bridge

import (
	"fmt"
	"io"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
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

// attributePlainLocked matches an entity a plain peer sent (docs/profile.md
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
// Caller holds b.mu.
func (b *Bridge) attributePlainLocked(ss *sessState, h *wire.EntityHeader) (*entRef, refusal) {
	if sc := scopeOf(h); sc != 0 {
		return nil, refused(refuseUnmatched, "entity %d is in scope %d; the gateway sends root-scope entities only", h.EntityID, sc)
	}
	if h.ParentID != nil {
		b.markOwnNumberingLocked(ss)
		ref := liveRef(ss, *h.ParentID)
		if ref == nil {
			return nil, refused(refuseUnmatched, "parent-id %d names no live entity of this session", *h.ParentID)
		}
		return claimResultLocked(ref)
	}
	ref := liveRef(ss, h.EntityID)
	if ref == nil {
		return nil, refused(refuseUnmatched, "entity-id %d names no live entity of this session and the entity has no parent-id", h.EntityID)
	}
	if b.attribOf(ss).ownNumbering {
		r := refused(refuseAmbiguous, "entity-id %d without parent-id: the peer numbers its own entities on this session, so the id is its own", h.EntityID)
		r.doc = ref.att.d.id
		return nil, r
	}
	return claimResultLocked(ref)
}

// liveRef is the root-scope entity id of this session's running
// documents, or nil.
func liveRef(ss *sessState, id uint32) *entRef {
	ref := ss.ents[rootKey(id)]
	if ref == nil || !ref.att.newest() {
		return nil
	}
	return ref
}

// claimResultLocked records that ref's entity has its result; a second
// one is refused.
func claimResultLocked(ref *entRef) (*entRef, refusal) {
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

// attribOf is ss's attribution state, made on first use (a closed
// session's is not kept: onSessionClosedLocked dropped it). Caller holds
// b.mu.
func (b *Bridge) attribOf(ss *sessState) *sessAttrib {
	if ss.closed {
		if st := b.attrib[ss]; st != nil {
			return st
		}
		return &sessAttrib{} // not kept: nothing is taken after the close (its entities left the session)
	}
	if b.attrib == nil {
		b.attrib = map[*sessState]*sessAttrib{}
	}
	st := b.attrib[ss]
	if st == nil {
		st = &sessAttrib{}
		b.attrib[ss] = st
	}
	return st
}

// markOwnNumberingLocked records that the peer of ss sent an entity of its
// own numbering (one with a parent-id).
func (b *Bridge) markOwnNumberingLocked(ss *sessState) {
	b.attribOf(ss).ownNumbering = true
}

// attributeProfileLocked matches an entity a profile peer sent: a result
// (role result) or result part (role result-part) of R has exactly the
// form of profile 4.3: entity-id R, root scope, no parent-id. A second
// whole result or summary for R is refused; parts are checked by the
// result stream (4.3.1). Caller holds b.mu.
func attributeProfileLocked(ss *sessState, h *wire.EntityHeader) (*attempt, refusal) {
	role := h.Metadata[metaRole]
	switch {
	case role != roleResult && role != roleResultPart:
		return nil, refused(refuseForm, "entity %d carries no %s of a result", h.EntityID, metaRole)
	case h.ParentID != nil:
		return nil, refused(refuseForm, "entity %d carries parent-id %d; a result of the profile names its document's root by entity-id only", h.EntityID, *h.ParentID)
	case scopeOf(h) != 0:
		return nil, refused(refuseForm, "entity %d is in scope %d; results are root-scope entities", h.EntityID, scopeOf(h))
	}
	ref := liveRef(ss, h.EntityID)
	if ref == nil || ref.key != rootKey(ref.att.rootID) {
		return nil, refused(refuseUnmatched, "entity-id %d names no running document's root on this session", h.EntityID)
	}
	if role == roleResultPart {
		return ref.att, refusal{}
	}
	if _, r := claimResultLocked(ref); r.reason != "" {
		return nil, r
	}
	return ref.att, refusal{}
}

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
	st := b.attribOf(ss)
	st.refused++
	n := st.refused
	b.mu.Unlock()
	if n <= refusalsLogged || n%refusalsLogged == 0 {
		b.log.Warn("bridge: refused an entity from the peer as a result (protocol event)", "peer", ss.pc.addr,
			"reason", r.reason, "entity", h.EntityID, "parent", parent, "doc", r.doc, "detail", r.detail, "refused_on_session", n)
	}
	_, _ = io.Copy(io.Discard, e.Payload)
}
