package wire

import (
	"encoding/binary"
	"fmt"
)

// Framing is the layout of fixed control frames on stream 0. ALPN and the
// STATUS Ver stay pipestream/1 and 1 in both, so a connection chooses its
// framing by configuration or detects it from the first STATUS received
// (docs/profile.md 1.2).
type Framing uint8

const (
	// FramingDraft02 is draft-krickert-pipestream-02: a fixed frame has
	// no length octets (STATUS 16 octets, GOAWAY 8, BARRIER 12,
	// SCOPE_DIGEST 72, Section 6.1.2).
	FramingDraft02 Framing = iota
	// FramingDraft04 is the reference suite's draft-04: every control
	// frame is Type + 4-octet Length + payload. A draft-02 fixed frame F
	// is the payload F[1] F[2] F[3] 0x00 F[4:] (STATUS: 16 octets, 20
	// with C=1; GOAWAY 8; BARRIER 12; SCOPE_DIGEST 72). Variable frames
	// are laid out as in draft-02.
	FramingDraft04
)

func (f Framing) String() string {
	if f == FramingDraft04 {
		return "draft-04"
	}
	return "draft-02"
}

// ParseFraming parses "draft-02" or "draft-04".
func ParseFraming(s string) (Framing, error) {
	switch s {
	case "draft-02":
		return FramingDraft02, nil
	case "draft-04":
		return FramingDraft04, nil
	}
	return 0, fmt.Errorf("unknown framing %q: use draft-02 or draft-04", s)
}

// draft04Insert is the offset of the octet draft-04 inserts into a fixed
// frame's payload (after the three octets that follow the type).
const draft04Insert = 4

// AppendDraft04 appends the draft-04 form of frame, one complete draft-02
// frame (type octet first), to b. Variable frames are appended unchanged.
func AppendDraft04(b, frame []byte) []byte {
	if len(frame) < draft04Insert || !FrameType(frame[0]).IsFixed() {
		return append(b, frame...)
	}
	b = append(b, frame[0])
	b = binary.BigEndian.AppendUint32(b, uint32(len(frame)))
	b = append(b, frame[1:draft04Insert]...)
	b = append(b, 0)
	return append(b, frame[draft04Insert:]...)
}

// fromDraft04 rebuilds the draft-02 frame of type t from a draft-04
// payload p into dst. A payload shorter than the four octets every fixed
// frame has is PIPESTREAM_FRAME_ERROR.
func fromDraft04(dst []byte, t FrameType, p []byte) ([]byte, error) {
	if len(p) < draft04Insert {
		return dst, Errorf(CodeFrameError, "frame 0x%02X: Length %d is shorter than any fixed frame", byte(t), len(p))
	}
	dst = append(dst[:0], byte(t))
	dst = append(dst, p[:draft04Insert-1]...)
	return append(dst, p[draft04Insert:]...), nil
}

// ParseDraft04Fixed decodes one complete draft-04 fixed frame (type, Length,
// payload) from the start of b into a Frame, with the same checks as the
// draft-02 parsers plus draft-04's: a Length that disagrees with the
// frame's layout is PIPESTREAM_FRAME_ERROR (0x0D). It returns ErrShort for
// a proper prefix. Status.Ext aliases scratch (returned, for reuse).
func ParseDraft04Fixed(b, scratch []byte) (Frame, int, []byte, error) {
	var f Frame
	if len(b) < VarHeaderLen {
		return f, 0, scratch, ErrShort
	}
	f.Type = FrameType(b[0])
	l := binary.BigEndian.Uint32(b[1:])
	if l > MaxVariableLength {
		return f, 0, scratch, Errorf(CodeEntityTooLarge, "frame 0x%02X: Length %d exceeds %d", b[0], l, MaxVariableLength)
	}
	if uint64(len(b)) < VarHeaderLen+uint64(l) {
		return f, 0, scratch, ErrShort
	}
	n := VarHeaderLen + int(l)
	var err error
	scratch, err = fromDraft04(scratch, f.Type, b[VarHeaderLen:n])
	if err != nil {
		return f, 0, scratch, err
	}
	err = parseFixedExact(&f, scratch)
	return f, n, scratch, err
}

// parseFixedExact parses the draft-02 frame in b, which must be exactly
// one frame long.
func parseFixedExact(f *Frame, b []byte) error {
	var n int
	var err error
	switch f.Type {
	case FrameStatus:
		f.Status, n, err = ParseStatus(b)
	case FrameScopeDigest:
		f.ScopeDigest, n, err = ParseScopeDigest(b)
	case FrameBarrier:
		f.Barrier, n, err = ParseBarrier(b)
	case FrameGoAway:
		f.GoAway, n, err = ParseGoAway(b)
	default:
		return errUnknownFixed(f.Type)
	}
	if err == ErrShort || (err == nil && n != len(b)) {
		return Errorf(CodeFrameError, "frame 0x%02X: Length %d disagrees with the frame layout", byte(f.Type), len(b))
	}
	return err
}

// errUnknownFixed is returned for a fixed type without a defined layout;
// under draft-04 its Length is known, so the ControlReader skips it.
func errUnknownFixed(t FrameType) error {
	return Errorf(CodeEntityInvalid, "control stream: frame type 0x%02X has no defined size", byte(t))
}
