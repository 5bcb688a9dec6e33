package wire

import "encoding/binary"

// STATUS octet 2 bit layout (Section 6.2.1): E|C|D(3)|Flags(3 high bits).
const (
	statusFlagE     = 0x80
	statusFlagC     = 0x40
	statusDepthMask = 0x07
	statusDepthPos  = 3
)

// ParseStatus decodes one STATUS frame (Section 6.2.1) from the start of b,
// type octet included, and returns it with the number of octets consumed.
//
// The base frame is 16 octets; C=1 adds the 4-octet cursor (Section 6.2.4);
// E=1 adds the 4-octet Extension Length and that many octets of extension
// data (Section 6.6.1). It returns ErrShort while b is a proper prefix of a
// frame, and a *Error for a malformed one:
//   - Ver != 1 -> 0x0C (Section 6.2.1);
//   - E=1 with Extension Length 0 -> 0x05 (Section 6.6.1);
//   - Extension Length > MaxExtensionLength -> 0x06;
//   - YIELDED with E=1 whose Token Length does not fill the extension
//     exactly, DEFERRED with E=1 whose extension is not 16 octets -> 0x05.
//
// Reserved bits (Flags, the Reserved word) are ignored (Section 6). The
// status code is not range-checked here; see CheckStatusFrame. f.Ext
// aliases b and is valid until b is reused. ParseStatus never allocates.
func ParseStatus(b []byte) (StatusFrame, int, error) {
	var f StatusFrame
	if len(b) < StatusFrameLen {
		if len(b) > 0 && FrameType(b[0]) != FrameStatus {
			return f, 0, Errorf(CodeEntityInvalid, "STATUS: frame type is 0x%02X, want 0x50", b[0])
		}
		return f, 0, ErrShort
	}
	if FrameType(b[0]) != FrameStatus {
		return f, 0, Errorf(CodeEntityInvalid, "STATUS: frame type is 0x%02X, want 0x50", b[0])
	}
	if v := b[1] >> 4; v != Version {
		return f, 0, Errorf(CodeLayerUnsupported, "STATUS: version %d is not supported, only %d", v, Version)
	}
	f.Status = Status(b[1] & 0x0F)
	f.HasExt = b[2]&statusFlagE != 0
	f.HasCursor = b[2]&statusFlagC != 0
	f.Depth = (b[2] >> statusDepthPos) & statusDepthMask
	f.EntityID = binary.BigEndian.Uint32(b[4:8])
	f.ScopeID = binary.BigEndian.Uint32(b[8:12])
	n := StatusFrameLen
	if f.HasCursor {
		if len(b) < n+CursorLen {
			return StatusFrame{}, 0, ErrShort
		}
		f.Cursor = binary.BigEndian.Uint32(b[n:])
		n += CursorLen
	}
	if f.HasExt {
		if len(b) < n+ExtensionHeaderLen {
			return StatusFrame{}, 0, ErrShort
		}
		el := binary.BigEndian.Uint32(b[n:])
		n += ExtensionHeaderLen
		if el == 0 {
			return StatusFrame{}, 0, Errorf(CodeEntityInvalid, "STATUS: E=1 with Extension Length 0")
		}
		if el > MaxExtensionLength {
			return StatusFrame{}, 0, Errorf(CodeEntityTooLarge, "STATUS: Extension Length %d exceeds %d", el, MaxExtensionLength)
		}
		if uint64(len(b)) < uint64(n)+uint64(el) {
			return StatusFrame{}, 0, ErrShort
		}
		f.Ext = b[n : n+int(el) : n+int(el)]
		n += int(el)
		if err := checkExtLayout(f.Status, f.Ext); err != nil {
			return StatusFrame{}, 0, err
		}
	}
	return f, n, nil
}

// checkExtLayout validates the Yield (Stat=0x8) and Claim Check (Stat=0x9)
// layouts of Section 6.6.2/6.6.3; other status codes' extensions are opaque.
func checkExtLayout(s Status, ext []byte) error {
	switch s {
	case StatusYielded:
		if len(ext) < 4 {
			return Errorf(CodeEntityInvalid, "STATUS YIELDED: extension is %d octets, the Yield layout needs at least 4", len(ext))
		}
		tl := int(ext[1])<<16 | int(ext[2])<<8 | int(ext[3])
		if 4+tl != len(ext) {
			return Errorf(CodeEntityInvalid, "STATUS YIELDED: Token Length %d does not match Extension Length %d (want %d)", tl, len(ext), 4+tl)
		}
	case StatusDeferred:
		if len(ext) != 16 {
			return Errorf(CodeEntityInvalid, "STATUS DEFERRED: Claim Check extension is %d octets, want 16", len(ext))
		}
	}
	return nil
}

// Length returns the encoded size of f: 16, +4 with a cursor, +4+len(Ext)
// with an extension. It agrees with Append.
func (f *StatusFrame) Length() int {
	n := StatusFrameLen
	if f.HasCursor {
		n += CursorLen
	}
	if f.HasExt {
		n += ExtensionHeaderLen + len(f.Ext)
	}
	return n
}

// Append appends the STATUS encoding of f to b (Section 6.2.1) and returns
// the extended slice; it does not allocate when cap(b) suffices. Ver is 1,
// reserved bits are zero, Depth is masked to 3 bits, Status to 4 bits. With
// HasExt the caller must supply a non-empty Ext (an empty one encodes a
// frame receivers reject with 0x05).
func (f *StatusFrame) Append(b []byte) []byte {
	var flags byte
	if f.HasExt {
		flags |= statusFlagE
	}
	if f.HasCursor {
		flags |= statusFlagC
	}
	flags |= (f.Depth & statusDepthMask) << statusDepthPos
	b = append(b, byte(FrameStatus), Version<<4|byte(f.Status)&0x0F, flags, 0)
	b = binary.BigEndian.AppendUint32(b, f.EntityID)
	b = binary.BigEndian.AppendUint32(b, f.ScopeID)
	b = append(b, 0, 0, 0, 0)
	if f.HasCursor {
		b = binary.BigEndian.AppendUint32(b, f.Cursor)
	}
	if f.HasExt {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f.Ext)))
		b = append(b, f.Ext...)
	}
	return b
}

// Yield decodes the Yield extension of a YIELDED status (Section 6.6.2).
// The Token aliases f.Ext. It returns a *Error 0x05 when f is not YIELDED
// with E=1 or the layout is malformed.
func (f *StatusFrame) Yield() (YieldExtension, error) {
	if f.Status != StatusYielded || !f.HasExt {
		return YieldExtension{}, Errorf(CodeEntityInvalid, "STATUS %s (E=%t) carries no Yield extension", f.Status, f.HasExt)
	}
	if err := checkExtLayout(StatusYielded, f.Ext); err != nil {
		return YieldExtension{}, err
	}
	return YieldExtension{Reason: f.Ext[0], Token: f.Ext[4:]}, nil
}

// ClaimCheck decodes the Claim Check extension of a DEFERRED status
// (Section 6.6.3). It returns a *Error 0x05 when f is not DEFERRED with E=1
// or the extension is not 16 octets.
func (f *StatusFrame) ClaimCheck() (ClaimCheckExtension, error) {
	if f.Status != StatusDeferred || !f.HasExt {
		return ClaimCheckExtension{}, Errorf(CodeEntityInvalid, "STATUS %s (E=%t) carries no Claim Check extension", f.Status, f.HasExt)
	}
	if err := checkExtLayout(StatusDeferred, f.Ext); err != nil {
		return ClaimCheckExtension{}, err
	}
	return ClaimCheckExtension{
		ClaimID:      binary.BigEndian.Uint64(f.Ext[0:8]),
		ExpiryMicros: binary.BigEndian.Uint64(f.Ext[8:16]),
	}, nil
}

// MaxYieldToken is the largest Yield Token (24-bit Token Length).
const MaxYieldToken = 0xFFFFFF

// AppendYieldExt appends the Yield extension data (Section 6.6.2: reason,
// 24-bit token length, token) to b, for use as StatusFrame.Ext. The token
// must be at most MaxYieldToken octets; a longer token is a programming
// error and panics.
func AppendYieldExt(b []byte, y YieldExtension) []byte {
	if len(y.Token) > MaxYieldToken {
		panic("wire: yield token longer than 16,777,215 octets")
	}
	tl := len(y.Token)
	b = append(b, y.Reason, byte(tl>>16), byte(tl>>8), byte(tl))
	return append(b, y.Token...)
}

// AppendClaimCheckExt appends the 16-octet Claim Check extension data
// (Section 6.6.3) to b, for use as StatusFrame.Ext.
func AppendClaimCheckExt(b []byte, c ClaimCheckExtension) []byte {
	b = binary.BigEndian.AppendUint64(b, c.ClaimID)
	return binary.BigEndian.AppendUint64(b, c.ExpiryMicros)
}
