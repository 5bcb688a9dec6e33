package peer

import (
	"bytes"
	"crypto/sha256"
	"io"
	"sync"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Plain entities (docs/profile.md "Plain use (no profile)"). The profile
// (PipeDoc envelope, summary root, claims, result roles and parts) applies
// only to entities whose header metadata carries pipestream.profile = 1.
// Every other entity is a plain draft-02 entity: its payload is the raw
// content, processed 1:1 (draft-02 PROCESS, TRANSFORM) with the processor
// its metadata names (passthrough by default), or, as a child (parent-id
// and chunk-info) of a parent the client announced DEHYDRATING, rehydrated
// N:1 into the parent (plaindoc.go). Its result is the generic form of
// plainResultHeader, whose stream starts before COMPLETE (finishPlain);
// nothing else goes on stream 0 for it but its statuses.

// MetaProfile = ProfileVersion on an entity header puts the entity in the
// profile (docs/profile.md 4). The gateway sets it on every root, child
// and claim redemption it sends in profile mode.
const (
	MetaProfile    = "pipestream.profile"
	ProfileVersion = "1"
)

// isProfile reports whether h opts into the profile.
func isProfile(h *wire.EntityHeader) bool { return h.Metadata[MetaProfile] == ProfileVersion }

// plainEntity dispatches an entity without the profile marker: a child of
// a dehydrated parent (parent-id and chunk-info), a stream for a parent the
// client announced DEHYDRATING (ignored: plain parents have no root
// stream), or an entity processed 1:1 on its own.
func (g *engine) plainEntity(h *wire.EntityHeader, payload io.Reader, abort func(wire.ErrorCode)) {
	switch {
	case h.ParentID != nil && h.ChunkInfo != nil:
		if scopeOf(h) != 0 {
			g.reject(h, abort, wire.CodeScopeInvalid, "children of client dehydration must be in scope 0")
			return
		}
		g.child(h, payload, abort)
	case g.announced(h.EntityID):
		// A plain parent's result is its children's; a stream of its own
		// has no place in plain N:1 (docs/profile.md, plain use). It is
		// stopped with 0x00 and gets no status: R's outcome is its
		// children's.
		g.log.Warn("entity stream for a parent announced DEHYDRATING ignored", "entity", h.EntityID)
		abort(wire.CodeNoError)
	default:
		g.standalone(h, payload, abort, true)
	}
}

// announced reports whether the client announced root id DEHYDRATING and
// the document is still open.
func (g *engine) announced(id uint32) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.docs[id]
	return d != nil && d.dehydrating
}

// plainResultHeader is the generic result of a plain entity: exactly
// entity-id (the input's), layer, content-type, payload-length and
// checksum; no scope-id, parent-id, metadata or chunk-info.
func plainResultHeader(id uint32, ct string, layer uint8, n uint64, sum []byte) *wire.EntityHeader {
	if ct == "" {
		ct = "application/octet-stream"
	}
	return &wire.EntityHeader{EntityID: id, Layer: layer, ContentType: ct, PayloadLength: n, Checksum: sum}
}

// resultHeaderFor is the result header of a plain entity (generic form)
// or of a profile entity (profile 4.3, with children counts when set).
func resultHeaderFor(plain bool, id uint32, ct string, layer uint8, n uint64, sum []byte, counts *[2]int) *wire.EntityHeader {
	if plain {
		return plainResultHeader(id, ct, layer, n, sum)
	}
	return resultHeader(id, ct, layer, n, sum, counts)
}

// finishPlain sends a plain entity's result and its COMPLETE. COMPLETE
// goes as soon as the result stream has started (its header is written):
// a client that reads results finds the stream open before COMPLETE, and
// one that never accepts it (the draft-04 reference client reads only
// stream 0) still gets COMPLETE instead of a peer blocked on flow control.
// It returns once the result is written (out.Data may alias a pooled
// payload buffer that the caller releases), or the session ends.
func (g *engine) finishPlain(e *entity, out *Output, docID string) {
	sum := sha256.Sum256(out.Data)
	h := resultHeaderFor(true, e.id, out.ContentType, out.Layer, uint64(len(out.Data)), sum[:], nil)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		// The session's context, not the entity's: the entity ends with
		// its COMPLETE while the result may still be on its way.
		done <- g.c.SendEntity(g.ctx, h, &startReader{r: bytes.NewReader(out.Data), started: started})
	}()
	finished := false
	select {
	case <-started:
	case err := <-done:
		if err != nil {
			g.log.Warn("result not sent", "entity", e.id, "err", err)
			g.send(e, wire.StatusFailed, nil)
			return
		}
		finished = true
	}
	if g.send(e, wire.StatusComplete, nil) {
		g.logFinished(e.ctx, e.id, docID, wire.StatusComplete, len(out.Data))
	}
	if finished {
		return
	}
	if err := <-done; err != nil {
		g.log.Debug("result stream after COMPLETE ended", "entity", e.id, "err", err)
	}
}

// startReader closes started at its first Read: the entity header has
// been written by then.
type startReader struct {
	r       io.Reader
	started chan struct{}
	once    sync.Once
}

func (s *startReader) Read(p []byte) (int, error) {
	s.once.Do(func() { close(s.started) })
	return s.r.Read(p)
}
