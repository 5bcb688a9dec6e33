package wire

import "encoding/binary"

// ParseScopeDigest decodes a 72-octet SCOPE_DIGEST frame (Section 6.3) from
// the start of b, type octet included. Flags and Reserved are ignored. It
// returns ErrShort for a proper prefix. Scope ID 0 is not rejected here (the
// session answers it with 0x09, Section 9.4).
func ParseScopeDigest(b []byte) (ScopeDigestFrame, int, error) {
	var f ScopeDigestFrame
	if len(b) > 0 && FrameType(b[0]) != FrameScopeDigest {
		return f, 0, Errorf(CodeEntityInvalid, "SCOPE_DIGEST: frame type is 0x%02X, want 0x54", b[0])
	}
	if len(b) < ScopeDigestFrameLen {
		return f, 0, ErrShort
	}
	f.ScopeID = binary.BigEndian.Uint32(b[4:8])
	f.Processed = binary.BigEndian.Uint64(b[8:16])
	f.Succeeded = binary.BigEndian.Uint64(b[16:24])
	f.Failed = binary.BigEndian.Uint64(b[24:32])
	f.Deferred = binary.BigEndian.Uint64(b[32:40])
	copy(f.MerkleRoot[:], b[40:72])
	return f, ScopeDigestFrameLen, nil
}

// Length returns 72 (Section 6.1.2).
func (f *ScopeDigestFrame) Length() int { return ScopeDigestFrameLen }

// Append appends the SCOPE_DIGEST encoding of f to b with zero Flags and
// Reserved.
func (f *ScopeDigestFrame) Append(b []byte) []byte {
	b = append(b, byte(FrameScopeDigest), 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, f.ScopeID)
	b = binary.BigEndian.AppendUint64(b, f.Processed)
	b = binary.BigEndian.AppendUint64(b, f.Succeeded)
	b = binary.BigEndian.AppendUint64(b, f.Failed)
	b = binary.BigEndian.AppendUint64(b, f.Deferred)
	return append(b, f.MerkleRoot[:]...)
}
