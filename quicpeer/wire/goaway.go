package wire

import "encoding/binary"

// ParseGoAway decodes an 8-octet GOAWAY frame (Section 6.5) from the start
// of b, type octet included. The 24 reserved bits are ignored. It returns
// ErrShort for a proper prefix. Whether Last Entity ID increased across
// frames (forbidden by Section 6.5.1) is the session's check.
func ParseGoAway(b []byte) (GoAwayFrame, int, error) {
	var f GoAwayFrame
	if len(b) > 0 && FrameType(b[0]) != FrameGoAway {
		return f, 0, Errorf(CodeEntityInvalid, "GOAWAY: frame type is 0x%02X, want 0x56", b[0])
	}
	if len(b) < GoAwayFrameLen {
		return f, 0, ErrShort
	}
	f.LastEntityID = binary.BigEndian.Uint32(b[4:8])
	return f, GoAwayFrameLen, nil
}

// Length returns 8 (Section 6.1.2).
func (f *GoAwayFrame) Length() int { return GoAwayFrameLen }

// Append appends the GOAWAY encoding of f to b with zero reserved bits.
func (f *GoAwayFrame) Append(b []byte) []byte {
	b = append(b, byte(FrameGoAway), 0, 0, 0)
	return binary.BigEndian.AppendUint32(b, f.LastEntityID)
}
