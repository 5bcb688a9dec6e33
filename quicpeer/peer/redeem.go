package peer

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// redeem handles a claim-check redemption stream (docs/profile.md 6): an
// entity stream carrying the deferred entity's original payload and
// pipestream.claim-id. An unknown, replayed or settled claim aborts the
// stream with PIPESTREAM_CLAIM_NOT_FOUND (0x0B), an expired one with
// PIPESTREAM_CLAIM_EXPIRED (0x0A); either also gets FAILED for the stream's
// entity unless that entity is the one still waiting for the claim. An accepted claim is processed without
// its fault: PROCESSING, then COMPLETE (or a failure). A redeemed child
// whose document is still open on this session goes into that document's
// rehydration; anything else gets a result stream of its own (profile 4.3).
func (g *engine) redeem(h *wire.EntityHeader, payload io.Reader, abort func(wire.ErrorCode)) {
	id, err := strconv.ParseUint(h.Metadata[MetaClaimID], 10, 64)
	if err != nil {
		g.reject(h, abort, wire.CodeEntityInvalid, MetaClaimID+" is not a decimal 64-bit claim id")
		return
	}
	rec, ok := g.claims.Get(id)
	switch {
	case !ok || rec.Redeemed:
		g.log.Info("claim rejected", "claim", id, "entity", h.EntityID, "code", wire.CodeClaimNotFound, "known", ok, "redeemed", rec.Redeemed)
		g.reject(h, abort, wire.CodeClaimNotFound, "claim unknown or already redeemed")
		return
	case rec.Settled || !g.now().Before(rec.Expiry):
		g.log.Info("claim rejected", "claim", id, "entity", h.EntityID, "code", wire.CodeClaimExpired, "expiry", rec.Expiry.UTC())
		g.reject(h, abort, wire.CodeClaimExpired, "claim expired")
		return
	}
	// Read and verify the payload before consuming the claim, so a corrupt
	// redemption does not burn it.
	limit := g.lim.maxEntityBytes
	if rec.ParentID != 0 || rec.Chunk >= 0 {
		limit = g.lim.maxChunkBytes
	}
	if h.PayloadLength > uint64(limit) {
		g.reject(h, abort, wire.CodeEntityTooLarge, fmt.Sprintf("payload-length %d exceeds the peer's limit %d", h.PayloadLength, limit))
		return
	}
	release, err := g.admit(g.ctx, h.PayloadLength)
	if err != nil {
		abort(wire.CodeNoError)
		return
	}
	defer release()
	raw, err := g.readPayload(h, payload, limit)
	if err != nil {
		g.payloadFailed(&entity{id: h.EntityID, header: h}, abort, err)
		return
	}
	if _, err := g.claims.Redeem(id); err != nil {
		code := wire.CodeInternalError
		switch {
		case errors.Is(err, ErrClaimNotFound):
			code = wire.CodeClaimNotFound
		case errors.Is(err, ErrClaimExpired):
			code = wire.CodeClaimExpired
		}
		g.log.Info("claim rejected", "claim", id, "entity", h.EntityID, "code", code, "err", err)
		g.reject(h, abort, code, err.Error())
		return
	}
	g.log.Info("claim redeemed", "claim", id, "entity", h.EntityID, "doc", rec.DocID, "processor", rec.Processor)

	// The deferred entity of this session: the stream reuses its ID, or
	// (fresh ID) the claim record names a child of a document still open.
	g.mu.Lock()
	de := g.deferred[h.EntityID]
	if de != nil && (de.claim == nil || de.claim.ID != id) {
		de = nil
	}
	superseded := false
	if de == nil && rec.SessionID == g.c.ID() && rec.ParentID != 0 && rec.Chunk >= 0 {
		if dd := g.docs[rec.ParentID]; dd != nil && !dd.cancelled && !dd.finishing {
			if cs := dd.children[uint64(rec.Chunk)]; cs != nil && !dd.man.Resolved(cs.mid) && cs.e.claim != nil && cs.e.claim.ID == id {
				de, superseded = cs.e, true
			}
		}
	}
	if de != nil && g.deferred[de.id] == de {
		delete(g.deferred, de.id)
	}
	g.mu.Unlock()
	if de != nil {
		de.stopClaimTimer()
	}
	if superseded {
		// The fresh entity stands for the chunk from now on; the deferred ID
		// is resolved so that the gateway's cursor can pass it.
		g.send(de, wire.StatusSkipped, nil)
		g.log.Info("deferred entity superseded by its redemption", "entity", de.id, "redemption", h.EntityID, "claim", id)
	}

	md := maps.Clone(rec.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	maps.Copy(md, h.Metadata)
	md[MetaProcessor] = rec.Processor
	hh := *h
	hh.Metadata = md
	parent := g.ctx
	var d *doc
	if de != nil && de.doc != nil {
		d = de.doc
		parent = d.ctx
	}
	e, err := g.newEntity(parent, &hh, md)
	if err != nil {
		g.reject(h, nil, wire.CodeEntityInvalid, err.Error())
		return
	}
	defer e.cancel(nil)
	e.redeemed, e.chunk, e.doc, e.docID = true, rec.Chunk, d, rec.DocID
	if de != nil {
		e.depth = de.depth
	}
	if d != nil {
		g.mu.Lock()
		live := !d.cancelled && !d.finishing
		if cs := d.children[uint64(rec.Chunk)]; live && cs != nil && !d.man.Resolved(cs.mid) {
			cs.e = e // cancel and timeouts now reach the redemption
		}
		g.mu.Unlock()
		if !live {
			abort(wire.CodeNoError)
			return
		}
		if err := g.c.SetDetached(0, d.id, false); err != nil { // R can finish again
			g.log.Debug("root not re-attached", "entity", d.id, "err", err)
		}
	}
	e.plain = rec.Plain
	if e.payload, err = g.redeemedPayload(h, &rec, raw); err != nil {
		g.reject(h, nil, wire.CodeOf(err), err.Error())
		return
	}
	if d == nil {
		g.mu.Lock()
		g.jobs[e.id] = e
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			if g.jobs[e.id] == e {
				delete(g.jobs, e.id)
			}
			g.mu.Unlock()
		}()
	}
	if !g.send(e, wire.StatusProcessing, nil) {
		return
	}
	res := g.run(e)
	if d == nil {
		g.finishStandalone(e, res, rec.DocID)
		return
	}
	g.finishChild(e, res)
}

// redeemedPayload is the content a redemption carries: raw itself, or for
// a profile document sent whole the blob of its PipeDoc envelope.
func (g *engine) redeemedPayload(h *wire.EntityHeader, rec *ClaimRecord, raw []byte) ([]byte, error) {
	if rec.Plain || rec.ParentID != 0 || rec.Chunk >= 0 {
		return raw, nil
	}
	env, err := g.decodeEnvelope(h, raw)
	if err != nil {
		return nil, err
	}
	return env.Blob, nil
}
