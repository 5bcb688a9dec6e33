package wire

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// Fast paths for the CBOR entity header, the one structure decoded and
// encoded per entity stream (and, at the end of this file, for a whole
// document's pipe-doc envelope, decoded per small document). They handle the common shapes without
// reflection and fall back to the generic cbor/v2 modes for anything else,
// so the accepted language and the results are exactly those of the
// generic path (cborfast_test.go checks both against each other):
//
//   - decodeCBORHeaderFast accepts only a definite-length map of known,
//     distinct text keys whose values have the expected major type and
//     range (no tags, no indefinite lengths, no null, no trailing data,
//     valid UTF-8, checksum of 32 octets, metadata of definite text pairs,
//     chunk-info with its three members, no completion-policy); any other
//     input returns ok=false
//     and the caller decodes it generically (which reports the error, if
//     any). Lengths in the input only ever slice the input itself.
//   - appendCBORHeaderFast encodes headers without completion-policy, with at most maxFastMetadata metadata pairs and
//     valid UTF-8 text, in the deterministic encoding of cborEnc (keys
//     length-first, shortest integers).

// cborHead decodes the item head at b[i:]: major type, argument and the
// offset after the head. ok is false for a short input or an additional
// information of 28-31 (reserved, indefinite length).
func cborHead(b []byte, i int) (major byte, arg uint64, next int, ok bool) {
	if i >= len(b) {
		return 0, 0, 0, false
	}
	ib := b[i]
	major, ai := ib>>5, ib&0x1f
	i++
	var n int
	switch {
	case ai < 24:
		return major, uint64(ai), i, true
	case ai == 24:
		n = 1
	case ai == 25:
		n = 2
	case ai == 26:
		n = 4
	case ai == 27:
		n = 8
	default:
		return 0, 0, 0, false
	}
	if len(b)-i < n {
		return 0, 0, 0, false
	}
	var v uint64
	for _, c := range b[i : i+n] {
		v = v<<8 | uint64(c)
	}
	return major, v, i + n, true
}

// cborString returns the definite-length string of major type want at
// b[i:] (aliasing b) and the offset after it.
func cborString(b []byte, i int, want byte) ([]byte, int, bool) {
	m, l, i, ok := cborHead(b, i)
	if !ok || m != want || l > uint64(len(b)-i) {
		return nil, 0, false
	}
	return b[i : i+int(l)], i + int(l), true
}

// cborUint returns the unsigned integer at b[i:] if it is at most max.
func cborUint(b []byte, i int, max uint64) (uint64, int, bool) {
	m, v, i, ok := cborHead(b, i)
	if !ok || m != 0 || v > max {
		return 0, 0, false
	}
	return v, i, true
}

// maxFastMetadata is the most metadata pairs appendCBORHeaderFast sorts
// on the stack; headers with more are encoded generically.
const maxFastMetadata = 32

// headerBox holds a decoded header and the members it points to in one
// allocation.
type headerBox struct {
	h             EntityHeader
	parent, scope uint32
	sum           [32]byte
	chunk         ChunkInfo
}

const (
	hkEntityID = 1 << iota
	hkParentID
	hkScopeID
	hkLayer
	hkContentType
	hkPayloadLength
	hkChecksum
	hkMetadata
	hkChunkInfo
)

// decodeCBORHeaderFast decodes b as an entity header when it has one of
// the common shapes (see above); ok=false means "decode generically". It
// scans the whole input before it allocates, so an input handed to the
// generic decoder costs no garbage. It does not validate the header
// (validateEntityHeader does).
func decodeCBORHeaderFast(b []byte) (h *EntityHeader, ok bool) {
	m, n, i, ok := cborHead(b, 0)
	if !ok || m != 5 || n > uint64(len(b)) { // each pair takes >= 2 octets
		return nil, false
	}
	var sc headerScan // on the stack; copied to the heap once the scan succeeded
	for range n {
		var key []byte
		if key, i, ok = cborString(b, i, 3); !ok {
			return nil, false
		}
		var bit uint
		if bit, i, ok = sc.member(string(key), b, i); !ok || sc.seen&bit != 0 {
			return nil, false
		}
		sc.seen |= bit
	}
	const required = hkEntityID | hkLayer | hkPayloadLength
	if i != len(b) || sc.seen&required != required {
		return nil, false
	}
	return sc.header(b)
}

// headerScan is what decodeCBORHeaderFast has read so far.
type headerScan struct {
	box  headerBox
	seen uint // hk* bits of the members read
	ct   []byte
	md   int // offset of the metadata map
	mdN  uint64
}

// member reads the value of member key at b[i:]; bit is the member's hk*
// bit, ok=false an unknown member (completion-policy included) or a value
// of another shape.
func (sc *headerScan) member(key string, b []byte, i int) (bit uint, next int, ok bool) {
	var v uint64
	switch key {
	case "entity-id":
		v, next, ok = cborUint(b, i, math.MaxUint32)
		sc.box.h.EntityID = uint32(v)
		return hkEntityID, next, ok
	case "parent-id":
		v, next, ok = cborUint(b, i, math.MaxUint32)
		sc.box.parent = uint32(v)
		return hkParentID, next, ok
	case "scope-id":
		v, next, ok = cborUint(b, i, math.MaxUint32)
		sc.box.scope = uint32(v)
		return hkScopeID, next, ok
	case "layer":
		v, next, ok = cborUint(b, i, math.MaxUint8)
		sc.box.h.Layer = uint8(v)
		return hkLayer, next, ok
	case "payload-length":
		sc.box.h.PayloadLength, next, ok = cborUint(b, i, math.MaxUint64)
		return hkPayloadLength, next, ok
	case "content-type":
		sc.ct, next, ok = cborString(b, i, 3)
		return hkContentType, next, ok && utf8.Valid(sc.ct)
	case "checksum":
		var s []byte
		s, next, ok = cborString(b, i, 2)
		copy(sc.box.sum[:], s)
		return hkChecksum, next, ok && len(s) == len(sc.box.sum)
	case "metadata":
		sc.md = i
		sc.mdN, next, ok = scanCBORMetadata(b, i)
		return hkMetadata, next, ok
	case "chunk-info":
		sc.box.chunk, next, ok = decodeCBORChunkInfo(b, i)
		return hkChunkInfo, next, ok
	}
	return 0, 0, false
}

// header builds the scanned header on the heap (one allocation, plus the
// metadata map); ok=false for a duplicate metadata key.
func (sc *headerScan) header(b []byte) (*EntityHeader, bool) {
	var meta map[string]string
	if sc.seen&hkMetadata != 0 {
		var ok bool
		if meta, ok = decodeCBORMetadata(b, sc.md, sc.mdN); !ok {
			return nil, false
		}
	}
	p := new(headerBox)
	*p = sc.box
	p.h.ContentType = internContentType(sc.ct)
	p.h.Metadata = meta
	if sc.seen&hkParentID != 0 {
		p.h.ParentID = &p.parent
	}
	if sc.seen&hkScopeID != 0 {
		p.h.ScopeID = &p.scope
	}
	if sc.seen&hkChecksum != 0 {
		p.h.Checksum = p.sum[:]
	}
	if sc.seen&hkChunkInfo != 0 {
		p.h.ChunkInfo = &p.chunk
	}
	return &p.h, true
}

// scanCBORMetadata checks the metadata map at b[i:] (a definite map of at
// most cborMaxMapPairs pairs of definite, valid UTF-8 text strings) and
// returns its pair count and the offset after it.
func scanCBORMetadata(b []byte, i int) (uint64, int, bool) {
	m, n, i, ok := cborHead(b, i)
	if !ok || m != 5 || n > cborMaxMapPairs || n > uint64(len(b)-i) {
		return 0, 0, false
	}
	for range 2 * n {
		var s []byte
		if s, i, ok = cborString(b, i, 3); !ok || !utf8.Valid(s) {
			return 0, 0, false
		}
	}
	return n, i, true
}

// decodeCBORMetadata builds the map scanCBORMetadata checked at b[i:];
// ok is false for a duplicate key.
func decodeCBORMetadata(b []byte, i int, n uint64) (map[string]string, bool) {
	_, _, i, _ = cborHead(b, i)
	md := make(map[string]string, n) // n <= cborMaxMapPairs and <= len(b)
	for range n {
		var k, v []byte
		k, i, _ = cborString(b, i, 3)
		v, i, _ = cborString(b, i, 3)
		if _, dup := md[string(k)]; dup {
			return nil, false
		}
		md[internMeta(k)] = internMeta(v)
	}
	return md, true
}

// internMeta returns the profile's frequent metadata keys and values
// (docs/profile.md 4.4) as constants, and a new string for anything
// else: every entity and result header carries a few of them, so
// decoding them costs no allocation each.
func internMeta(b []byte) string {
	switch string(b) { // compiled without converting b
	case "pipestream.profile":
		return "pipestream.profile"
	case "pipestream.processor":
		return "pipestream.processor"
	case "pipestream.role":
		return "pipestream.role"
	case "pipestream.accept-inline-result":
		return "pipestream.accept-inline-result"
	case "pipestream.accept-result-parts":
		return "pipestream.accept-result-parts"
	case "pipestream.children-complete":
		return "pipestream.children-complete"
	case "pipestream.children-total":
		return "pipestream.children-total"
	case "1":
		return "1"
	case "result":
		return "result"
	case "result-part":
		return "result-part"
	case "passthrough":
		return "passthrough"
	case "16384":
		return "16384"
	}
	return string(b)
}

// internContentType returns the content types most entities and results
// carry as constants (no allocation per header), and a new string for
// anything else.
func internContentType(b []byte) string {
	switch string(b) { // compiled without converting b
	case "":
		return ""
	case "application/octet-stream":
		return "application/octet-stream"
	case "text/plain":
		return "text/plain"
	case "application/json":
		return "application/json"
	}
	return string(b)
}

// decodeCBORChunkInfo decodes a chunk-info map with exactly its three
// members, each once.
func decodeCBORChunkInfo(b []byte, i int) (ChunkInfo, int, bool) {
	var c ChunkInfo
	m, n, i, ok := cborHead(b, i)
	if !ok || m != 5 || n != 3 {
		return c, 0, false
	}
	var seen uint
	for range n {
		var key []byte
		if key, i, ok = cborString(b, i, 3); !ok {
			return c, 0, false
		}
		var bit uint
		var v uint64
		v, i, ok = cborUint(b, i, math.MaxUint64)
		switch string(key) {
		case "total-chunks":
			bit, c.TotalChunks = 1, v
		case "chunk-index":
			bit, c.ChunkIndex = 2, v
		case "chunk-offset":
			bit, c.ChunkOffset = 4, v
		default:
			return c, 0, false
		}
		if !ok || seen&bit != 0 {
			return c, 0, false
		}
		seen |= bit
	}
	return c, i, true
}

// appendCBORHead appends a head with the shortest argument encoding.
func appendCBORHead(b []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(b, m|byte(v))
	case v <= math.MaxUint8:
		return append(b, m|24, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, m|27), v)
	}
}

func appendCBORText(b []byte, s string) []byte {
	return append(appendCBORHead(b, 3, uint64(len(s))), s...)
}

// appendCBORHeaderFast appends the deterministic CBOR of h to b when h has
// a common shape (see above); ok=false means "encode generically".
func appendCBORHeaderFast(b []byte, h *EntityHeader) ([]byte, bool) {
	if len(h.Metadata) > maxFastMetadata || h.CompletionPolicy != nil || !utf8.ValidString(h.ContentType) {
		return b, false
	}
	// Metadata keys in the deterministic order: length-first, then
	// bytewise (the encoded heads of equal-length keys are equal).
	var ks [maxFastMetadata]string
	keys := ks[:0]
	for k, v := range h.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return b, false
		}
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
	n := uint64(3) // layer, entity-id, payload-length
	if len(h.Checksum) > 0 {
		n++
	}
	if len(keys) > 0 {
		n++
	}
	if h.ScopeID != nil {
		n++
	}
	if h.ParentID != nil {
		n++
	}
	if h.ContentType != "" {
		n++
	}
	if h.ChunkInfo != nil {
		n++
	}
	// Keys sorted length-first, then bytewise (RFC 8949 4.2.3).
	b = appendCBORHead(b, 5, n)
	b = appendCBORHead(appendCBORText(b, "layer"), 0, uint64(h.Layer))
	if len(h.Checksum) > 0 {
		b = append(appendCBORHead(appendCBORText(b, "checksum"), 2, uint64(len(h.Checksum))), h.Checksum...)
	}
	if len(keys) > 0 {
		b = appendCBORHead(appendCBORText(b, "metadata"), 5, uint64(len(keys)))
		for _, k := range keys {
			b = appendCBORText(appendCBORText(b, k), h.Metadata[k])
		}
	}
	if h.ScopeID != nil {
		b = appendCBORHead(appendCBORText(b, "scope-id"), 0, uint64(*h.ScopeID))
	}
	b = appendCBORHead(appendCBORText(b, "entity-id"), 0, uint64(h.EntityID))
	if h.ParentID != nil {
		b = appendCBORHead(appendCBORText(b, "parent-id"), 0, uint64(*h.ParentID))
	}
	if ci := h.ChunkInfo; ci != nil {
		b = appendCBORHead(appendCBORText(b, "chunk-info"), 5, 3)
		b = appendCBORHead(appendCBORText(b, "chunk-index"), 0, ci.ChunkIndex)
		b = appendCBORHead(appendCBORText(b, "chunk-offset"), 0, ci.ChunkOffset)
		b = appendCBORHead(appendCBORText(b, "total-chunks"), 0, ci.TotalChunks)
	}
	if h.ContentType != "" {
		b = appendCBORText(appendCBORText(b, "content-type"), h.ContentType)
	}
	b = appendCBORHead(appendCBORText(b, "payload-length"), 0, h.PayloadLength)
	return b, true
}

// Pipe-doc bits of decodeCBORPipeDocFast.
const (
	pdDocID = 1 << iota
	pdEntityID
	pdBlob
	pdOwnership
)

// decodeCBORPipeDocFast decodes b as a pipe-doc (Section 7) when it has
// the shape a whole document's envelope has: a definite map of doc-id
// (valid UTF-8 text), entity-id (at most 32 bits), optionally blob (a
// byte string) and optionally ownership with owner-id and an optional
// group-id (valid UTF-8 text, no scopes), each member once, and nothing
// after it. Anything else (scopes, unknown members, tags, null,
// indefinite lengths, an ownership without owner-id) returns ok=false and
// the caller decodes it generically. The blob is copied out of b, as the
// generic decoder does, unless share is set: then it aliases b. It does
// not validate the envelope.
func decodeCBORPipeDocFast(b []byte, share bool) (*PipeDoc, bool) {
	m, n, i, ok := cborHead(b, 0)
	if !ok || m != 5 || n > 4 {
		return nil, false
	}
	var (
		seen      uint
		doc, blob []byte
		id        uint64
		own       ownershipScan
	)
	for range n {
		var key []byte
		if key, i, ok = cborString(b, i, 3); !ok {
			return nil, false
		}
		var bit uint
		switch string(key) {
		case "doc-id":
			bit = pdDocID
			doc, i, ok = cborString(b, i, 3)
			ok = ok && utf8.Valid(doc)
		case "entity-id":
			bit = pdEntityID
			id, i, ok = cborUint(b, i, math.MaxUint32)
		case "blob":
			bit = pdBlob
			blob, i, ok = cborString(b, i, 2)
		case "ownership":
			bit = pdOwnership
			i, ok = own.scan(b, i)
		default:
			return nil, false
		}
		if !ok || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
	}
	if i != len(b) || seen&(pdDocID|pdEntityID) != pdDocID|pdEntityID {
		return nil, false
	}
	d := &PipeDoc{DocID: string(doc), EntityID: uint32(id)}
	switch {
	case seen&pdBlob == 0:
	case share:
		d.Blob = blob[:len(blob):len(blob)]
	default:
		d.Blob = append([]byte{}, blob...)
	}
	if seen&pdOwnership != 0 {
		d.Ownership = &OwnershipContext{OwnerID: string(own.owner), GroupID: string(own.group)}
	}
	return d, true
}

// ownershipScan reads an ownership map of owner-id and an optional
// group-id.
type ownershipScan struct{ owner, group []byte }

func (o *ownershipScan) scan(b []byte, i int) (int, bool) {
	m, n, i, ok := cborHead(b, i)
	if !ok || m != 5 || n < 1 || n > 2 {
		return 0, false
	}
	var seen uint
	for range n {
		var key, v []byte
		if key, i, ok = cborString(b, i, 3); !ok {
			return 0, false
		}
		if v, i, ok = cborString(b, i, 3); !ok || !utf8.Valid(v) {
			return 0, false
		}
		var bit uint
		switch string(key) {
		case "owner-id":
			bit, o.owner = 1, v
		case "group-id":
			bit, o.group = 2, v
		default:
			return 0, false
		}
		if seen&bit != 0 {
			return 0, false
		}
		seen |= bit
	}
	return i, seen&1 != 0
}

// pipeDocFast reports whether appendCBORPipeDocFast encodes d: no scopes
// and valid UTF-8 text.
func pipeDocFast(d *PipeDoc) bool {
	if o := d.Ownership; o != nil && (len(o.Scopes) > 0 || !utf8.ValidString(o.OwnerID) || !utf8.ValidString(o.GroupID)) {
		return false
	}
	return utf8.ValidString(d.DocID)
}

// appendCBORPipeDocFast appends the deterministic CBOR of d to b when
// pipeDocFast(d); ok=false means "encode generically". Keys length-first,
// then bytewise: blob (omitted when empty), doc-id, entity-id, ownership
// (group-id, omitted when empty, then owner-id).
func appendCBORPipeDocFast(b []byte, d *PipeDoc) ([]byte, bool) {
	if !pipeDocFast(d) {
		return b, false
	}
	n := uint64(2)
	if len(d.Blob) > 0 {
		n++
	}
	if d.Ownership != nil {
		n++
	}
	b = appendCBORHead(b, 5, n)
	if len(d.Blob) > 0 {
		b = append(appendCBORHead(appendCBORText(b, "blob"), 2, uint64(len(d.Blob))), d.Blob...)
	}
	b = appendCBORText(appendCBORText(b, "doc-id"), d.DocID)
	b = appendCBORHead(appendCBORText(b, "entity-id"), 0, uint64(d.EntityID))
	if o := d.Ownership; o != nil {
		b = appendCBORText(b, "ownership")
		if o.GroupID != "" {
			b = appendCBORText(appendCBORText(appendCBORHead(b, 5, 2), "group-id"), o.GroupID)
		} else {
			b = appendCBORHead(b, 5, 1)
		}
		b = appendCBORText(appendCBORText(b, "owner-id"), o.OwnerID)
	}
	return b, true
}
