package wire

import "encoding/binary"

const barrierFlagS = 0x80

// ParseBarrier decodes a 12-octet BARRIER frame (Section 6.4) from the start
// of b, type octet included. The 23 reserved bits are ignored. It returns
// ErrShort for a proper prefix.
func ParseBarrier(b []byte) (BarrierFrame, int, error) {
	var f BarrierFrame
	if len(b) > 0 && FrameType(b[0]) != FrameBarrier {
		return f, 0, Errorf(CodeEntityInvalid, "BARRIER: frame type is 0x%02X, want 0x55", b[0])
	}
	if len(b) < BarrierFrameLen {
		return f, 0, ErrShort
	}
	f.Released = b[1]&barrierFlagS != 0
	f.ScopeID = binary.BigEndian.Uint32(b[4:8])
	f.ParentEntityID = binary.BigEndian.Uint32(b[8:12])
	return f, BarrierFrameLen, nil
}

// Length returns 12 (Section 6.1.2).
func (f *BarrierFrame) Length() int { return BarrierFrameLen }

// Append appends the BARRIER encoding of f to b with zero reserved bits.
func (f *BarrierFrame) Append(b []byte) []byte {
	var s byte
	if f.Released {
		s = barrierFlagS
	}
	b = append(b, byte(FrameBarrier), s, 0, 0)
	b = binary.BigEndian.AppendUint32(b, f.ScopeID)
	return binary.BigEndian.AppendUint32(b, f.ParentEntityID)
}
