package wire

import (
	"encoding/binary"
	"errors"
	"io"
)

// VarHeaderLen is the type octet plus the 4-octet Length of a variable
// frame (Section 6.1.1).
const VarHeaderLen = 5

// AppendVariable appends a variable frame (Section 6.1.1: type, 4-octet
// big-endian length, body) to b. The caller keeps body within
// MaxVariableLength; receivers reject longer frames with 0x06.
func AppendVariable(b []byte, t FrameType, body []byte) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// Frame is one frame read from the control stream: a tagged union on Type.
// Exactly one of Status, ScopeDigest, Barrier, GoAway or Body is set.
//
// Status.Ext and Body alias the ControlReader's buffer and are valid only
// until the next call to Next; copy them to keep them.
type Frame struct {
	Type        FrameType
	Status      StatusFrame
	ScopeDigest ScopeDigestFrame
	Barrier     BarrierFrame
	GoAway      GoAwayFrame
	// Body is the serialized message of a variable frame (CAPABILITIES,
	// CHECKPOINT), decoded with a Codec by the caller.
	Body []byte
}

// ControlReader reads UCF frames (Section 6.1) from the control stream.
//
// Its buffer starts small and grows only as octets actually arrive (at most
// doubling, so memory stays within twice the largest frame received);
// a declared length is checked against the limits before any byte of the
// body is read and never sizes an allocation (Section 10.3). Unknown
// variable types are read and discarded in chunks (Section 11.2.1); unknown
// fixed types end the stream with *Error 0x05. Reading a STATUS frame does
// not allocate once the buffer has its working size.
//
// A ControlReader is not safe for concurrent use.
type ControlReader struct {
	r      io.Reader
	maxVar int
	buf    []byte // len(buf) == cap(buf); data in buf[start:end]
	start  int
	end    int
	err    error // sticky read error

	// framing of fixed frames; with detect, the first STATUS decides it
	// (a draft-04 STATUS starts 0x50 0x00, a draft-02 one 0x50 0x1s).
	framing Framing
	detect  bool
	scratch []byte // a draft-04 fixed frame rebuilt in draft-02 layout

	// completeExt is the most extension octets of a COMPLETE status kept
	// (SetCompleteExtLimit); < 0: no limit of its own (maxVar).
	completeExt int
}

// SetCompleteExtLimit sets the most extension octets of a COMPLETE
// status (draft-02 framing) the reader buffers. A longer extension is
// skipped as it arrives, never buffered (Section 6.6.1: a receiver skips
// an extension it does not take), and the frame is delivered with HasExt,
// Ext nil and ExtSkipped its Extension Length. 0 skips every COMPLETE
// extension; n < 0 (the default) keeps them up to the reader's maxVar.
// The inline result of docs/profile.md 4.3.2 is the one COMPLETE
// extension this project defines; a receiver sets its offer here.
func (c *ControlReader) SetCompleteExtLimit(n int) { c.completeExt = n }

// SetFraming sets the framing of fixed frames. With detect, the first
// STATUS received decides it instead (f is used until then).
func (c *ControlReader) SetFraming(f Framing, detect bool) {
	c.framing, c.detect = f, detect
}

// Framing returns the framing in use and whether it is decided (set
// without detection, or detected from a STATUS).
func (c *ControlReader) Framing() (Framing, bool) { return c.framing, !c.detect }

// NewControlReader returns a reader of the frames in r. maxVar caps variable
// frame bodies and STATUS extensions (octets); values <= 0 or above
// MaxVariableLength mean MaxVariableLength. Longer declared lengths are
// *Error 0x06.
func NewControlReader(r io.Reader, maxVar int) *ControlReader {
	if maxVar <= 0 || maxVar > MaxVariableLength {
		maxVar = MaxVariableLength
	}
	return &ControlReader{r: r, maxVar: maxVar, buf: make([]byte, controlReaderInitialBuf), completeExt: -1}
}

// Next reads the next frame. At a clean end of stream (between frames) it
// returns io.EOF. A stream that ends inside a frame returns *Error 0x05.
// Other read errors of the underlying reader are returned unchanged (a
// reset stream 0 is the session's 0x03). Protocol violations return *Error
// with the draft's code; after any error the reader must not be used again.
func (c *ControlReader) Next() (Frame, error) {
	for {
		f, skip, err := c.next()
		if err != nil || !skip {
			return f, err
		}
	}
}

func (c *ControlReader) next() (f Frame, skip bool, err error) {
	if err := c.fill(1, true); err != nil {
		return f, false, err
	}
	t := FrameType(c.buf[c.start])
	f.Type = t
	if t.IsFixed() && c.detect && t == FrameStatus {
		if err := c.fill(2, false); err != nil {
			return f, false, err
		}
		c.framing, c.detect = FramingDraft02, false
		if c.buf[c.start+1] == 0 {
			c.framing = FramingDraft04
		}
	}
	if t.IsFixed() && c.framing == FramingDraft04 {
		return c.readFixed04(f)
	}
	switch {
	case t == FrameStatus:
		return c.readStatus(f)
	case t == FrameScopeDigest:
		if err := c.fill(ScopeDigestFrameLen, false); err != nil {
			return f, false, err
		}
		f.ScopeDigest, _, err = ParseScopeDigest(c.buf[c.start:c.end])
		c.start += ScopeDigestFrameLen
		return f, false, err
	case t == FrameBarrier:
		if err := c.fill(BarrierFrameLen, false); err != nil {
			return f, false, err
		}
		f.Barrier, _, err = ParseBarrier(c.buf[c.start:c.end])
		c.start += BarrierFrameLen
		return f, false, err
	case t == FrameGoAway:
		if err := c.fill(GoAwayFrameLen, false); err != nil {
			return f, false, err
		}
		f.GoAway, _, err = ParseGoAway(c.buf[c.start:c.end])
		c.start += GoAwayFrameLen
		return f, false, err
	case t.IsVariable():
		return c.readVariable(f)
	default:
		return f, false, Errorf(CodeEntityInvalid, "control stream: frame type 0x%02X has no defined size", byte(t))
	}
}

func (c *ControlReader) readStatus(f Frame) (Frame, bool, error) {
	if err := c.fill(StatusFrameLen, false); err != nil {
		return f, false, err
	}
	hdr := c.buf[c.start:]
	need := StatusFrameLen
	if hdr[2]&statusFlagC != 0 {
		need += CursorLen
	}
	if hdr[2]&statusFlagE != 0 {
		need += ExtensionHeaderLen
		if err := c.fill(need, false); err != nil {
			return f, false, err
		}
		el := binary.BigEndian.Uint32(c.buf[c.start+need-ExtensionHeaderLen:])
		if el > uint32(c.maxVar) {
			return f, false, Errorf(CodeEntityTooLarge, "STATUS: Extension Length %d exceeds the limit %d", el, c.maxVar)
		}
		if c.completeExt >= 0 && el > uint32(c.completeExt) && Status(c.buf[c.start+1]&0x0F) == StatusComplete {
			return c.skipStatusExt(f, need, el)
		}
		need += int(el)
	}
	if err := c.fill(need, false); err != nil {
		return f, false, err
	}
	sf, n, err := ParseStatus(c.buf[c.start:c.end])
	if err != nil {
		return f, false, err
	}
	c.start += n
	f.Status = sf
	return f, false, nil
}

// skipStatusExt delivers the STATUS whose first n octets (through the
// Extension Length el) are buffered, and discards its el octets of
// extension data without buffering them (SetCompleteExtLimit).
func (c *ControlReader) skipStatusExt(f Frame, n int, el uint32) (Frame, bool, error) {
	var base [StatusFrameLen + CursorLen]byte
	k := copy(base[:], c.buf[c.start:c.start+n-ExtensionHeaderLen])
	base[2] &^= statusFlagE // parse the base frame (and cursor) alone
	sf, _, err := ParseStatus(base[:k])
	if err != nil {
		return f, false, err
	}
	sf.HasExt, sf.ExtSkipped = true, el
	c.start += n
	if err := c.discard(int(el)); err != nil {
		return f, false, err
	}
	f.Status = sf
	return f, false, nil
}

// readFixed04 reads a draft-04 fixed frame: its Length is checked against
// the limit before the payload is read; a type without a defined layout is
// skipped (its Length says how far).
func (c *ControlReader) readFixed04(f Frame) (Frame, bool, error) {
	if err := c.fill(VarHeaderLen, false); err != nil {
		return f, false, err
	}
	l := binary.BigEndian.Uint32(c.buf[c.start+1:])
	if l > uint32(c.maxVar)+StatusFrameLen+CursorLen+ExtensionHeaderLen {
		return f, false, Errorf(CodeEntityTooLarge, "frame 0x%02X: Length %d exceeds the limit %d", byte(f.Type), l, c.maxVar)
	}
	if !knownFixed(f.Type) {
		c.start += VarHeaderLen
		return f, true, c.discard(int(l))
	}
	if err := c.fill(VarHeaderLen+int(l), false); err != nil {
		return f, false, err
	}
	pf, n, scratch, err := ParseDraft04Fixed(c.buf[c.start:c.end], c.scratch)
	c.scratch = scratch
	if err != nil {
		return f, false, err
	}
	c.start += n
	return pf, false, nil
}

func knownFixed(t FrameType) bool {
	return t == FrameStatus || t == FrameScopeDigest || t == FrameBarrier || t == FrameGoAway
}

func (c *ControlReader) readVariable(f Frame) (Frame, bool, error) {
	if err := c.fill(VarHeaderLen, false); err != nil {
		return f, false, err
	}
	l := binary.BigEndian.Uint32(c.buf[c.start+1:])
	if l > MaxVariableLength {
		return f, false, Errorf(CodeEntityTooLarge, "frame 0x%02X: length %d exceeds %d", byte(f.Type), l, MaxVariableLength)
	}
	if f.Type != FrameCapabilities && f.Type != FrameCheckpoint {
		c.start += VarHeaderLen
		return f, true, c.discard(int(l))
	}
	if int(l) > c.maxVar {
		return f, false, Errorf(CodeEntityTooLarge, "frame 0x%02X: length %d exceeds the limit %d", byte(f.Type), l, c.maxVar)
	}
	if err := c.fill(VarHeaderLen+int(l), false); err != nil {
		return f, false, err
	}
	b := c.start + VarHeaderLen
	f.Body = c.buf[b : b+int(l) : b+int(l)]
	c.start = b + int(l)
	return f, false, nil
}

// discard drops n octets of an unknown frame without buffering them.
func (c *ControlReader) discard(n int) error {
	for n > 0 {
		if c.end == c.start {
			c.start, c.end = 0, 0
			if err := c.readMore(); err != nil {
				return c.midFrame(err)
			}
		}
		k := min(n, c.end-c.start)
		c.start += k
		n -= k
	}
	return nil
}

// fill makes at least n octets available at buf[start:]. atBoundary says no
// octet of the current frame has been consumed yet, so io.EOF is clean.
func (c *ControlReader) fill(n int, atBoundary bool) error {
	for c.end-c.start < n {
		if c.end == len(c.buf) {
			c.makeRoom()
		}
		if err := c.readMore(); err != nil {
			if atBoundary && c.end == c.start && errors.Is(err, io.EOF) {
				return io.EOF
			}
			return c.midFrame(err)
		}
	}
	return nil
}

// makeRoom compacts the buffer, or doubles it when it is full of data of
// the current frame (data that has arrived, so growth is bounded by it).
func (c *ControlReader) makeRoom() {
	if c.start > 0 {
		c.end = copy(c.buf, c.buf[c.start:c.end])
		c.start = 0
		return
	}
	nb := make([]byte, 2*len(c.buf))
	copy(nb, c.buf[:c.end])
	c.buf = nb
}

func (c *ControlReader) readMore() error {
	if c.err != nil {
		return c.err
	}
	for range 100 {
		hi := min(len(c.buf), c.end+controlReaderReadChunk)
		n, err := c.r.Read(c.buf[c.end:hi])
		c.end += n
		if err != nil {
			c.err = err
			if n > 0 {
				return nil
			}
			return err
		}
		if n > 0 {
			return nil
		}
	}
	c.err = io.ErrNoProgress
	return c.err
}

func (c *ControlReader) midFrame(err error) error {
	if errors.Is(err, io.EOF) {
		return Errorf(CodeEntityInvalid, "control stream ended inside a frame (%d octets of it received)", c.end-c.start)
	}
	return err
}
