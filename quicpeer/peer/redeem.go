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
	id, rec, ok := g.redeemableClaim(h, abort)
	if !ok {
		return
	}
	// Read and verify the payload before consuming the claim, so a corrupt
	// redemption does not burn it.
	raw, release, ok := g.readRedemption(h, &rec, payload, abort)
	if !ok {
		return
	}
	defer release()
	if !g.consumeClaim(h, id, abort) {
		return
	}
	g.log.Info("claim redeemed", "claim", id, "entity", h.EntityID, "doc", rec.DocID, "processor", rec.Processor)
	de := g.takeDeferred(h, id, &rec)
	e, d, ok := g.redemptionEntity(h, &rec, de, abort)
	if !ok {
		return
	}
	defer e.cancel(nil)
	var err error
	if e.payload, err = g.redeemedPayload(h, &rec, raw); err != nil {
		g.reject(h, nil, wire.CodeOf(err), err.Error())
		return
	}
	if d == nil {
		g.track(e)
		defer g.untrack(e)
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

// redeemableClaim parses the stream's claim id and checks the claim: an
// unknown or replayed one is refused with 0x0B, an expired or settled one
// with 0x0A (ok false: the stream was rejected).
func (g *engine) redeemableClaim(h *wire.EntityHeader, abort func(wire.ErrorCode)) (uint64, ClaimRecord, bool) {
	id, err := strconv.ParseUint(h.Metadata[MetaClaimID], 10, 64)
	if err != nil {
		g.reject(h, abort, wire.CodeEntityInvalid, MetaClaimID+" is not a decimal 64-bit claim id")
		return 0, ClaimRecord{}, false
	}
	rec, ok := g.claims.Get(id)
	switch {
	case !ok || rec.Redeemed:
		g.log.Info("claim rejected", "claim", id, "entity", h.EntityID, "code", wire.CodeClaimNotFound, "known", ok, "redeemed", rec.Redeemed)
		g.reject(h, abort, wire.CodeClaimNotFound, "claim unknown or already redeemed")
		return 0, rec, false
	case rec.Settled || !g.now().Before(rec.Expiry):
		g.log.Info("claim rejected", "claim", id, "entity", h.EntityID, "code", wire.CodeClaimExpired, "expiry", rec.Expiry.UTC())
		g.reject(h, abort, wire.CodeClaimExpired, "claim expired")
		return 0, rec, false
	}
	return id, rec, true
}

// readRedemption reads and verifies the redemption's payload within the
// limit of what the claim deferred (a chunk or a whole document) and the
// payload budget; release returns the budget.
func (g *engine) readRedemption(h *wire.EntityHeader, rec *ClaimRecord, payload io.Reader, abort func(wire.ErrorCode)) (raw []byte, release func(), ok bool) {
	limit := g.lim.maxEntityBytes
	if rec.ParentID != 0 || rec.Chunk >= 0 {
		limit = g.lim.maxChunkBytes
	}
	if h.PayloadLength > uint64(limit) {
		g.reject(h, abort, wire.CodeEntityTooLarge, fmt.Sprintf("payload-length %d exceeds the peer's limit %d", h.PayloadLength, limit))
		return nil, nil, false
	}
	release, err := g.admit(g.ctx, h.PayloadLength)
	if err != nil {
		abort(wire.CodeNoError)
		return nil, nil, false
	}
	raw, err = g.readPayload(h, payload, limit)
	if err != nil {
		release()
		g.payloadFailed(&entity{id: h.EntityID, header: h}, abort, err)
		return nil, nil, false
	}
	return raw, release, true
}

// consumeClaim marks the claim redeemed (exactly once, durably); a claim
// that another redemption consumed meanwhile, or that expired, rejects the
// stream.
func (g *engine) consumeClaim(h *wire.EntityHeader, id uint64, abort func(wire.ErrorCode)) bool {
	_, err := g.claims.Redeem(id)
	if err == nil {
		return true
	}
	code := wire.CodeInternalError
	switch {
	case errors.Is(err, ErrClaimNotFound):
		code = wire.CodeClaimNotFound
	case errors.Is(err, ErrClaimExpired):
		code = wire.CodeClaimExpired
	}
	g.log.Info("claim rejected", "claim", id, "entity", h.EntityID, "code", code, "err", err)
	g.reject(h, abort, code, err.Error())
	return false
}

// takeDeferred finds the deferred entity of this session the redemption
// resumes: the stream reuses its ID, or (fresh ID) the claim record names
// a child of a document still open, which the redemption then supersedes
// (the deferred ID is reported SKIPPED so that the gateway's cursor can
// pass it). nil when none waits here.
func (g *engine) takeDeferred(h *wire.EntityHeader, id uint64, rec *ClaimRecord) *entity {
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
		g.send(de, wire.StatusSkipped, nil)
		g.log.Info("deferred entity superseded by its redemption", "entity", de.id, "redemption", h.EntityID, "claim", id)
	}
	return de
}

// redemptionEntity builds the entity that runs the redemption: the claim's
// metadata and processor, without its fault, and, for a chunk of a
// document still open here, a place in that document (d); ok false when
// the stream was rejected (the document ended meanwhile).
func (g *engine) redemptionEntity(h *wire.EntityHeader, rec *ClaimRecord, de *entity, abort func(wire.ErrorCode)) (*entity, *doc, bool) {
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
		return nil, nil, false
	}
	e.redeemed, e.chunk, e.doc, e.docID, e.plain = true, rec.Chunk, d, rec.DocID, rec.Plain
	if de != nil {
		e.depth = de.depth
	}
	if d != nil && !g.joinDocument(e, d, rec) {
		e.cancel(nil)
		abort(wire.CodeNoError)
		return nil, nil, false
	}
	return e, d, true
}

// joinDocument puts redemption e in its chunk's place in document d, so
// that cancel and timeouts reach it, and lets R finish again; false when
// d ended meanwhile.
func (g *engine) joinDocument(e *entity, d *doc, rec *ClaimRecord) bool {
	g.mu.Lock()
	live := !d.cancelled && !d.finishing
	if cs := d.children[uint64(rec.Chunk)]; live && cs != nil && !d.man.Resolved(cs.mid) {
		cs.e = e
	}
	g.mu.Unlock()
	if !live {
		return false
	}
	if err := g.c.SetDetached(0, d.id, false); err != nil { // R can finish again
		g.log.Debug("root not re-attached", "entity", d.id, "err", err)
	}
	return true
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
