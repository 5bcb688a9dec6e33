package peer

import (
	"crypto/sha256"
	"strconv"
	"sync"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Inline results (docs/profile.md 4.3.2). A gateway that takes a small
// result in the COMPLETE status itself offers it on the root of a whole
// document with MetaAcceptInlineResult = the most extension octets it
// takes. On a profile connection the peer then sends a result whose
// extension fits as COMPLETE's extension (wire.AppendInlineResultExt: the
// result's entity frame, header with checksum and metadata, then the
// payload), and opens no result stream: the document costs one stream and
// two STATUS frames instead of two streams. Any other result (too large,
// not offered, a plain entity, a dehydrated document's rehydration, a
// redemption) goes on a result stream as profile 4.3 has it.

// MetaAcceptInlineResult on a whole document's root: the gateway takes
// its result inline in COMPLETE, up to this many extension octets
// (decimal). A peer that does not know the key ignores it (entity
// metadata is an open map) and sends a result stream.
const MetaAcceptInlineResult = "pipestream.accept-inline-result"

// inlineScratch is what completeInline needs per result: the extension
// buffer, the result header and its scope-id and checksum. Pooled:
// SendStatus copies the frame out before it returns, and nothing keeps
// the header.
type inlineScratch struct {
	buf   []byte
	h     wire.EntityHeader
	scope uint32
	sum   [sha256.Size]byte
}

var inlineScratches = sync.Pool{New: func() any { return &inlineScratch{buf: make([]byte, 0, 2048)} }}

// inlineOffer is the extension size e's sender takes an inline result
// of (0: none): a profile connection and the offer on e's header.
func (g *engine) inlineOffer(e *entity) int {
	if !g.neg.profile || e.plain {
		return 0
	}
	v, ok := e.header.Metadata[MetaAcceptInlineResult]
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0
	}
	return min(n, wire.MaxExtensionLength)
}

// completeInline reports e COMPLETE with out as its inline result when
// e's sender offered one and it fits the offer; false: send the result
// on a stream instead (nothing was sent).
func (g *engine) completeInline(e *entity, out *Output, docID string) bool {
	offer := g.inlineOffer(e)
	if offer == 0 || len(out.Data) >= offer {
		return false
	}
	sc := inlineScratches.Get().(*inlineScratch)
	defer func() {
		sc.h = wire.EntityHeader{} // no references kept in the pool
		if cap(sc.buf) <= 64<<10 {
			inlineScratches.Put(sc)
		}
	}()
	sc.sum = sha256.Sum256(out.Data)
	fillResultHeader(&sc.h, &sc.scope, e.id, out.ContentType, out.Layer, uint64(len(out.Data)), sc.sum[:], nil)
	ext, err := wire.AppendInlineResultExt(sc.buf[:0], wire.CodecFor(g.neg.format), &sc.h, out.Data)
	sc.buf = ext
	if err != nil || len(ext) > offer {
		return false
	}
	if g.send(e, wire.StatusComplete, ext) {
		g.logFinished(e.ctx, e.id, docID, wire.StatusComplete, len(out.Data))
	}
	return true
}
