package peer

import (
	"errors"
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
	raw, err := g.readPayload(h, payload)
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

	// The deferred entity of this session, if the stream reuses its ID.
	g.mu.Lock()
	de := g.deferred[h.EntityID]
	if de != nil && (de.claim == nil || de.claim.ID != id) {
		de = nil
	}
	if de != nil {
		delete(g.deferred, h.EntityID)
	}
	g.mu.Unlock()
	if de != nil {
		de.stopClaimTimer()
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
	e.payload = raw
	if rec.ParentID == 0 && rec.Chunk < 0 { // a whole root: the payload is its PipeDoc envelope
		env, err := g.decodeEnvelope(h, raw)
		if err != nil {
			g.reject(h, nil, wire.CodeOf(err), err.Error())
			return
		}
		e.payload = env.Blob
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
	switch res.kind {
	case resultSucceeded:
		g.send(e, wire.StatusComplete, nil)
		g.childFinished(e, outcomeSucceeded, res.out)
	case resultFailed:
		g.childFinished(e, outcomeFailed, nil)
	case resultSkipped:
		g.childFinished(e, outcomeSkipped, nil)
	case resultAbandoned:
		g.childFinished(e, outcomeAbandoned, nil)
	}
}
