package peer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"maps"
	"strconv"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Streamed results (docs/profile.md 4.3.1). A Concatenator's result is the
// children's outputs in chunk order, so the peer does not have to wait for
// the last child: every COMPLETE output the output frontier (resulthash.go)
// passes is sent at once as a result part, an entity stream of the root
// with role result-part and chunk-info {part number, offset}, and
// rehydration ends with a summary entity (no payload; part count, length
// and SHA-256 of the whole result in metadata). The result then crosses
// QUIC while the gateway is still uploading, instead of after it.
//
// Parts go out one after another in part order from the goroutine that
// moves the frontier (d.omu held): a child settling behind a part being
// sent waits, which is the backpressure the gateway's reading sets. When
// streaming cannot go on (a send fails, a part's processor is not a
// Concatenator), the parts stop and rehydration sends the whole result as
// one stream (4.3); the gateway then drops the parts it got.

// Metadata of streamed results (profile 4.4).
const (
	MetaResultParts  = "pipestream.result-parts"
	MetaResultLength = "pipestream.result-length"
	MetaResultSHA256 = "pipestream.result-sha256"
	// MetaAcceptResultParts = "1" on a child: its sender takes streamed
	// results. Without it (a gateway that predates them) the peer sends
	// the result as one stream, as profile 4.3 has it.
	MetaAcceptResultParts = "pipestream.accept-result-parts"
	roleResultPart        = "result-part"
)

// resultParts is the streamed result of a document, guarded by doc.omu.
type resultParts struct {
	on    bool  // the first part was sent
	off   bool  // streaming stopped (or never applies): one result stream
	sent  int   // parts sent
	bytes int64 // octets sent in parts
}

// partMeta is the metadata of every result part, shared read-only.
var partMeta = map[string]string{MetaRole: roleResultPart}

// streamPart sends the COMPLETE output sp of child e as the next result
// part of d, from data when it is sp's bytes in memory, else from the
// spool. Caller holds d.omu. A failure stops streaming for d.
func (g *engine) streamPart(d *doc, e *entity, sp *spooled, data []byte) {
	p := &d.parts
	if p.off {
		return
	}
	// A plain document's result is always one stream (plaindoc.go).
	if _, ok := e.proc.(Concatenator); !ok || e.plain || g.lim.noStreamResults || e.header.Metadata[MetaAcceptResultParts] != "1" || d.ctx.Err() != nil {
		p.off = true
		return
	}
	var sum []byte
	switch {
	case sp.same && len(e.header.Checksum) == sha256.Size:
		sum = e.header.Checksum // the verified input checksum: same bytes
	case data != nil:
		s := sha256.Sum256(data)
		sum = s[:]
	default:
		h := sha256.New()
		if _, err := d.copySpooled(h, sp, make([]byte, spoolBufferBytes)); err != nil {
			g.stopParts(d, err)
			return
		}
		sum = h.Sum(nil)
	}
	var r io.Reader
	if data != nil {
		r = bytes.NewReader(data)
	} else {
		sec, err := d.spool.section(sp)
		if err != nil {
			g.stopParts(d, err)
			return
		}
		r = sec
	}
	scope := uint32(0)
	h := &wire.EntityHeader{EntityID: d.id, ScopeID: &scope, Layer: sp.layer, ContentType: sp.contentType,
		PayloadLength: uint64(sp.size), Checksum: sum, Metadata: partMeta,
		ChunkInfo: &wire.ChunkInfo{ChunkIndex: uint64(p.sent), ChunkOffset: uint64(p.bytes)}}
	if err := g.c.SendEntity(d.ctx, h, r); err != nil {
		g.stopParts(d, err)
		return
	}
	p.on = true
	p.sent++
	p.bytes += sp.size
}

// stopParts ends streaming for d: rehydration sends one result stream.
// Caller holds d.omu.
func (g *engine) stopParts(d *doc, err error) {
	d.parts.off = true
	g.log.Debug("result parts stopped; the result goes as one stream", "entity", d.id, "parts_sent", d.parts.sent, "err", err)
}

// sendSummary ends a streamed result: it sends the summary entity when
// every part of parts went out as a result part, and reports false (send
// the result as one stream instead) otherwise.
func (g *engine) sendSummary(d *doc, c Concatenator, parts []part, counts [2]int) (int64, bool, error) {
	n, sum, ok := g.resultSum(d, parts) // also streams the parts the frontier still had to pass
	d.omu.Lock()
	p := d.parts
	d.omu.Unlock()
	if !ok || !p.on || p.off || p.sent != len(parts) || p.bytes != n {
		if p.on {
			g.log.Debug("streamed result incomplete; sending it as one stream", "entity", d.id, "parts_sent", p.sent, "parts", len(parts))
		}
		return 0, false, nil
	}
	first := &Output{ContentType: parts[0].sp.contentType, Layer: parts[0].sp.layer}
	ct, layer := c.ConcatType(first)
	h := resultHeader(d.id, ct, layer, 0, nil, &counts)
	md := maps.Clone(h.Metadata)
	md[MetaResultParts] = strconv.Itoa(p.sent)
	md[MetaResultLength] = strconv.FormatInt(n, 10)
	md[MetaResultSHA256] = hex.EncodeToString(sum)
	h.Metadata = md
	return n, true, g.c.SendEntity(d.ctx, h, bytes.NewReader(nil))
}
