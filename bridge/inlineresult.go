package bridge

import (
	"strconv"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Inline results (docs/profile.md 4.3.2). On a profile session the
// gateway offers, on the root of every whole document, to take the result
// inline in the COMPLETE status (metaAcceptInline = inlineResultOffer
// extension octets). A peer that takes the offer sends COMPLETE with E=1
// and the result's entity frame (header with checksum and metadata, then
// the payload) as its extension, and no result stream: the document ends
// on that one frame. The result is verified (wire.StatusFrame.InlineResult:
// length, SHA-256, entity-id) before any lock is taken, attributed as the
// root's result under the registry's mu (a result stream for the same
// root is then a duplicate), and stored under the document's lock exactly
// as a small result stream is (onWholeResult: kept for the flush that
// commits the terminal state). A COMPLETE extension the attempt did not
// offer is skipped (draft-02 Section 6.6.1); one longer than the offer is
// never buffered (quicpeer.Limits.InlineResultBytes) and fails the
// document as a result that failed verification does.

// inlineResultOffer is the most extension octets of an inline result the
// gateway takes: results up to ~16 KiB (the header is a few hundred
// octets) ride on stream 0, larger ones come on a stream. It stays far
// below maxStoredInline, so an inline result never touches the disk
// before its commit, and below the 64 KiB a STATUS frame could hold up
// stream 0 for other documents.
const inlineResultOffer = 16 << 10

var inlineResultOfferStr = strconv.Itoa(inlineResultOffer)

// inlineResult is a COMPLETE's inline result, decoded and verified: its
// header and a copy of its payload, or why it failed.
type inlineResult struct {
	h       *wire.EntityHeader
	payload []byte
	err     error
}

// decodeInline decodes the inline result of a root-scope COMPLETE with an
// extension (nil for any other frame). It holds no lock: f.Ext is the
// session's read buffer, valid for this callback; the payload is copied.
func decodeInline(c wire.Codec, f *wire.StatusFrame) *inlineResult {
	if f.Status != wire.StatusComplete || !f.HasExt || f.ScopeID != 0 || f.EntityID == wire.ConnectionEntity || c == nil {
		return nil
	}
	h, p, err := f.InlineResult(c, inlineResultOffer)
	if err != nil {
		return &inlineResult{err: err}
	}
	return &inlineResult{h: h, payload: append(make([]byte, 0, len(p)), p...)}
}

// inlineForRegLocked attributes in, the inline result of the COMPLETE
// status of ref, as the root's result when its attempt offered one, and
// returns it (nil: no inline result, or not taken: the extension is
// skipped). Caller holds the registry's mu and the document's lock.
func inlineForRegLocked(env *docEnv, ss *sessState, ref *entRef, in *inlineResult) *inlineResult {
	if in == nil {
		return nil
	}
	a := ref.att
	if ref.key != rootKey(a.rootID) || a.inlineOffer == 0 {
		env.log.Debug("bridge: skipping a COMPLETE extension the gateway did not offer", "peer", ss.pc.addr, "entity", ref.key.id)
		return nil
	}
	if _, r := claimResultRegLocked(ref); r.reason != "" {
		env.m.resultsRefused.WithLabelValues(r.reason).Inc()
		env.log.Warn("bridge: refused an inline result (protocol event)", "peer", ss.pc.addr, "reason", r.reason, "entity", ref.key.id, "doc", r.doc, "detail", r.detail)
		return nil
	}
	return in
}

// takeInlineLocked stores a verified inline result as the result of a's
// document (as onWholeResult stores a small result stream), or records
// why it failed. Caller holds the document's lock.
func (a *attempt) takeInlineLocked(in *inlineResult) {
	d := a.d
	if in.err != nil {
		d.resultFailedLocked(in.err, "the inline result failed")
		return
	}
	d.env.m.bytesOut.Add(float64(len(in.payload)))
	d.env.m.inlineResults.Inc()
	a.resultReady = true
	d.out.result = in.payload
	d.rec.ResultPayload = false
	d.rec.ResultContentType = in.h.ContentType
	d.rec.Doc.ResultSizeBytes = uint64(len(in.payload))
}
