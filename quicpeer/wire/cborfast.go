package wire

import (
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// Fast paths for the CBOR entity header, the one structure decoded and
// encoded per entity stream. They handle the common shapes without
// reflection and fall back to the generic cbor/v2 modes for anything else,
// so the accepted language and the results are exactly those of the
// generic path (cborfast_test.go checks both against each other):
//
//   - decodeCBORHeaderFast accepts only a definite-length map of known,
//     distinct text keys whose values have the expected major type and
//     range (no tags, no indefinite lengths, no null, no trailing data,
//     valid UTF-8, checksum of 32 octets, metadata of definite text pairs,
//     no chunk-info or completion-policy); any other input returns ok=false
//     and the caller decodes it generically (which reports the error, if
//     any). Lengths in the input only ever slice the input itself.
//   - appendCBORHeaderFast encodes headers without metadata, chunk-info or
//     completion-policy, with valid UTF-8 content-type, in the deterministic
//     encoding of cborEnc (keys length-first, shortest integers).

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

// headerBox holds a decoded header and the members it points to in one
// allocation.
type headerBox struct {
	h             EntityHeader
	parent, scope uint32
	sum           [32]byte
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
)

// decodeCBORHeaderFast decodes b as an entity header when it has one of
// the common shapes (see above); ok=false means "decode generically". It
// does not validate the header (validateEntityHeader does).
func decodeCBORHeaderFast(b []byte) (h *EntityHeader, ok bool) {
	m, n, i, ok := cborHead(b, 0)
	if !ok || m != 5 || n > uint64(len(b)) { // each pair takes >= 2 octets
		return nil, false
	}
	box := new(headerBox)
	var seen uint
	for range n {
		var key []byte
		if key, i, ok = cborString(b, i, 3); !ok {
			return nil, false
		}
		var bit uint
		var v uint64
		switch string(key) {
		case "entity-id":
			bit = hkEntityID
			v, i, ok = cborUint(b, i, math.MaxUint32)
			box.h.EntityID = uint32(v)
		case "parent-id":
			bit = hkParentID
			v, i, ok = cborUint(b, i, math.MaxUint32)
			box.parent = uint32(v)
			box.h.ParentID = &box.parent
		case "scope-id":
			bit = hkScopeID
			v, i, ok = cborUint(b, i, math.MaxUint32)
			box.scope = uint32(v)
			box.h.ScopeID = &box.scope
		case "layer":
			bit = hkLayer
			v, i, ok = cborUint(b, i, math.MaxUint8)
			box.h.Layer = uint8(v)
		case "payload-length":
			bit = hkPayloadLength
			box.h.PayloadLength, i, ok = cborUint(b, i, math.MaxUint64)
		case "content-type":
			bit = hkContentType
			var s []byte
			s, i, ok = cborString(b, i, 3)
			ok = ok && utf8.Valid(s)
			box.h.ContentType = string(s)
		case "checksum":
			bit = hkChecksum
			var s []byte
			s, i, ok = cborString(b, i, 2)
			ok = ok && len(s) == len(box.sum)
			copy(box.sum[:], s)
			box.h.Checksum = box.sum[:]
		case "metadata":
			bit = hkMetadata
			box.h.Metadata, i, ok = decodeCBORMetadata(b, i)
		default:
			return nil, false // unknown, chunk-info, completion-policy
		}
		if !ok || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
	}
	const required = hkEntityID | hkLayer | hkPayloadLength
	if i != len(b) || seen&required != required {
		return nil, false
	}
	return &box.h, true
}

// decodeCBORMetadata decodes a definite map of valid UTF-8 text strings
// with distinct keys, at most cborMaxMapPairs pairs.
func decodeCBORMetadata(b []byte, i int) (map[string]string, int, bool) {
	m, n, i, ok := cborHead(b, i)
	if !ok || m != 5 || n > cborMaxMapPairs || n > uint64(len(b)-i) {
		return nil, 0, false
	}
	md := make(map[string]string, min(n, 8))
	for range n {
		var k, v []byte
		if k, i, ok = cborString(b, i, 3); !ok || !utf8.Valid(k) {
			return nil, 0, false
		}
		if v, i, ok = cborString(b, i, 3); !ok || !utf8.Valid(v) {
			return nil, 0, false
		}
		if _, dup := md[string(k)]; dup {
			return nil, 0, false
		}
		md[string(k)] = string(v)
	}
	return md, i, true
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
	if len(h.Metadata) > 0 || h.ChunkInfo != nil || h.CompletionPolicy != nil || !utf8.ValidString(h.ContentType) {
		return b, false
	}
	n := uint64(3) // layer, entity-id, payload-length
	if len(h.Checksum) > 0 {
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
	// Keys sorted length-first, then bytewise (RFC 8949 4.2.3).
	b = appendCBORHead(b, 5, n)
	b = appendCBORHead(appendCBORText(b, "layer"), 0, uint64(h.Layer))
	if len(h.Checksum) > 0 {
		b = append(appendCBORHead(appendCBORText(b, "checksum"), 2, uint64(len(h.Checksum))), h.Checksum...)
	}
	if h.ScopeID != nil {
		b = appendCBORHead(appendCBORText(b, "scope-id"), 0, uint64(*h.ScopeID))
	}
	b = appendCBORHead(appendCBORText(b, "entity-id"), 0, uint64(h.EntityID))
	if h.ParentID != nil {
		b = appendCBORHead(appendCBORText(b, "parent-id"), 0, uint64(*h.ParentID))
	}
	if h.ContentType != "" {
		b = appendCBORText(appendCBORText(b, "content-type"), h.ContentType)
	}
	b = appendCBORHead(appendCBORText(b, "payload-length"), 0, h.PayloadLength)
	return b, true
}
