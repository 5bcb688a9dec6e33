package wire_test

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// sampleStatuses covers every STATUS shape: base, cursor, Yield, Claim
// Check, opaque extension, cursor+extension, depth.
func sampleStatuses() []wire.StatusFrame {
	return []wire.StatusFrame{
		{Status: wire.StatusProcessing, EntityID: 7},
		{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity, HasCursor: true, Cursor: 0xFFFFFFFC},
		{Status: wire.StatusComplete, Depth: 7, EntityID: 1, ScopeID: 0xFFFFFFFF},
		{Status: wire.StatusYielded, EntityID: 9, ScopeID: 3, Depth: 2, HasExt: true,
			Ext: wire.AppendYieldExt(nil, wire.YieldExtension{Reason: 2, Token: []byte("tok")})},
		{Status: wire.StatusYielded, EntityID: 9, HasExt: true, Ext: wire.AppendYieldExt(nil, wire.YieldExtension{Reason: 1})},
		{Status: wire.StatusDeferred, EntityID: 10, HasExt: true, HasCursor: true, Cursor: 4,
			Ext: wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: 1 << 63, ExpiryMicros: 1_700_000_000_000_000})},
		{Status: wire.StatusCheckpoint, EntityID: 11, HasExt: true, Ext: []byte{1, 2, 3}},
	}
}

type fixedCase struct {
	name   string
	enc    []byte
	length int
	parse  func([]byte) (any, int, error)
}

func fixedCases() []fixedCase {
	var cs []fixedCase
	for _, f := range sampleStatuses() {
		cs = append(cs, fixedCase{"status-" + f.Status.String(), f.Append(nil), f.Length(),
			func(b []byte) (any, int, error) { return wrap3(wire.ParseStatus(b)) }})
	}
	sd := wire.ScopeDigestFrame{ScopeID: 5, Processed: 1 << 40, Succeeded: 2, Failed: 3, Deferred: 4, MerkleRoot: [32]byte{1, 31: 9}}
	cs = append(cs, fixedCase{"scope-digest", sd.Append(nil), sd.Length(),
		func(b []byte) (any, int, error) { return wrap3(wire.ParseScopeDigest(b)) }})
	br := wire.BarrierFrame{Released: true, ScopeID: 6, ParentEntityID: 77}
	cs = append(cs, fixedCase{"barrier", br.Append(nil), br.Length(),
		func(b []byte) (any, int, error) { return wrap3(wire.ParseBarrier(b)) }})
	ga := wire.GoAwayFrame{LastEntityID: 0xFFFFFFFC}
	cs = append(cs, fixedCase{"goaway", ga.Append(nil), ga.Length(),
		func(b []byte) (any, int, error) { return wrap3(wire.ParseGoAway(b)) }})
	return cs
}

func wrap3[T any](f T, n int, err error) (any, int, error) { return f, n, err }

func TestFixedAppendLengthAgree(t *testing.T) {
	for _, c := range fixedCases() {
		if len(c.enc) != c.length {
			t.Errorf("%s: Append wrote %d octets, Length says %d", c.name, len(c.enc), c.length)
		}
		// Append appends: a prefix survives.
		if c.enc[0] == 0 {
			t.Errorf("%s: type octet 0", c.name)
		}
	}
	f := sampleStatuses()[3]
	b := f.Append([]byte("xy"))
	if string(b[:2]) != "xy" || len(b) != 2+f.Length() {
		t.Fatalf("Append clobbered its prefix: %x", b)
	}
}

func TestFixedRoundTrip(t *testing.T) {
	for _, f := range sampleStatuses() {
		b := f.Append(nil)
		g, n, err := wire.ParseStatus(append(b, 0xEE)) // trailing octet is not consumed
		if err != nil || n != len(b) {
			t.Fatalf("%v: n=%d err=%v", f.Status, n, err)
		}
		if !bytes.Equal(g.Append(nil), b) || g.Status != f.Status || g.EntityID != f.EntityID || g.ScopeID != f.ScopeID ||
			g.Depth != f.Depth || g.HasCursor != f.HasCursor || g.Cursor != f.Cursor || g.HasExt != f.HasExt || !bytes.Equal(g.Ext, f.Ext) {
			t.Fatalf("round trip %+v -> %+v", f, g)
		}
	}
	for _, c := range fixedCases() {
		v, n, err := c.parse(c.enc)
		if err != nil || n != len(c.enc) {
			t.Fatalf("%s: n=%d err=%v", c.name, n, err)
		}
		var re []byte
		switch f := v.(type) {
		case wire.StatusFrame:
			re = f.Append(nil)
		case wire.ScopeDigestFrame:
			re = f.Append(nil)
		case wire.BarrierFrame:
			re = f.Append(nil)
		case wire.GoAwayFrame:
			re = f.Append(nil)
		}
		if !bytes.Equal(re, c.enc) {
			t.Fatalf("%s: %x -> %x", c.name, c.enc, re)
		}
	}
}

// TestFixedTruncation: every proper prefix is ErrShort, never a frame.
func TestFixedTruncation(t *testing.T) {
	for _, c := range fixedCases() {
		for i := range len(c.enc) {
			_, n, err := c.parse(c.enc[:i])
			if !errors.Is(err, wire.ErrShort) || n != 0 {
				t.Fatalf("%s prefix %d: n=%d err=%v", c.name, i, n, err)
			}
		}
	}
}

// TestReservedBitsIgnored: Section 6: non-zero reserved bits MUST NOT be an
// error; they are ignored and sent as zero.
func TestReservedBitsIgnored(t *testing.T) {
	f := wire.StatusFrame{Status: wire.StatusComplete, Depth: 3, EntityID: 7, ScopeID: 2, HasCursor: true, Cursor: 9}
	b := f.Append(nil)
	b[2] |= 0x07 // Flags high bits
	b[3] = 0xFF  // Flags low bits
	copy(b[12:16], []byte{0xDE, 0xAD, 0xBE, 0xEF})
	g, _, err := wire.ParseStatus(b)
	if err != nil || !bytes.Equal(g.Append(nil), f.Append(nil)) || g.Depth != 3 || g.Cursor != 9 {
		t.Fatalf("%+v %v", g, err)
	}
	if out := g.Append(nil); out[3] != 0 || out[2]&0x07 != 0 || !bytes.Equal(out[12:16], []byte{0, 0, 0, 0}) {
		t.Fatalf("reserved bits not zero on send: %x", out)
	}
	sd := (&wire.ScopeDigestFrame{ScopeID: 1}).Append(nil)
	sd[1], sd[2], sd[3] = 0xFF, 0xFF, 0xFF
	if g, _, err := wire.ParseScopeDigest(sd); err != nil || g.ScopeID != 1 {
		t.Fatal(g, err)
	}
	br := (&wire.BarrierFrame{ScopeID: 1}).Append(nil)
	br[1], br[2], br[3] = 0x7F, 0xFF, 0xFF
	if g, _, err := wire.ParseBarrier(br); err != nil || g.Released || g.ScopeID != 1 {
		t.Fatal(g, err)
	}
	ga := (&wire.GoAwayFrame{LastEntityID: 3}).Append(nil)
	ga[1], ga[2], ga[3] = 1, 2, 3
	if g, _, err := wire.ParseGoAway(ga); err != nil || g.LastEntityID != 3 {
		t.Fatal(g, err)
	}
}

func TestStatusMalformed(t *testing.T) {
	base := (&wire.StatusFrame{Status: wire.StatusProcessing, EntityID: 1}).Append(nil)
	for v := range 16 {
		b := bytes.Clone(base)
		b[1] = byte(v)<<4 | 2
		_, _, err := wire.ParseStatus(b)
		if v == 1 {
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		wantCode(t, err, wire.CodeLayerUnsupported) // Ver != 1
	}
	ext := func(s wire.Status, data []byte, extLen uint32) []byte {
		b := (&wire.StatusFrame{Status: s, EntityID: 1}).Append(nil)
		b[2] |= 0x80
		b = append(b, byte(extLen>>24), byte(extLen>>16), byte(extLen>>8), byte(extLen))
		return append(b, data...)
	}
	// E=1 with Extension Length 0 is malformed for every status.
	for s := range wire.Status(16) {
		_, _, err := wire.ParseStatus(ext(s, nil, 0))
		wantCode(t, err, wire.CodeEntityInvalid)
	}
	// Too large an extension: rejected before its bytes arrive.
	_, _, err := wire.ParseStatus(ext(wire.StatusCheckpoint, nil, wire.MaxExtensionLength+1))
	wantCode(t, err, wire.CodeEntityTooLarge)
	// Yield: token length must fill the extension.
	_, _, err = wire.ParseStatus(ext(wire.StatusYielded, []byte{1, 0, 0, 5, 'a'}, 5))
	wantCode(t, err, wire.CodeEntityInvalid)
	_, _, err = wire.ParseStatus(ext(wire.StatusYielded, []byte{1, 0, 0}, 3))
	wantCode(t, err, wire.CodeEntityInvalid)
	// Claim check: exactly 16 octets.
	_, _, err = wire.ParseStatus(ext(wire.StatusDeferred, make([]byte, 15), 15))
	wantCode(t, err, wire.CodeEntityInvalid)
	// Other status with E=1: skipped by length.
	f, n, err := wire.ParseStatus(append(ext(wire.StatusFailed, []byte{9, 9}, 2), 0x50))
	if err != nil || n != 22 || !bytes.Equal(f.Ext, []byte{9, 9}) {
		t.Fatal(f, n, err)
	}
	if _, err := f.Yield(); err == nil {
		t.Fatal("Yield on FAILED")
	}
	if _, err := f.ClaimCheck(); err == nil {
		t.Fatal("ClaimCheck on FAILED")
	}
	// Wrong type octet.
	for _, p := range []func([]byte) (any, int, error){
		func(b []byte) (any, int, error) { return wrap3(wire.ParseStatus(b)) },
		func(b []byte) (any, int, error) { return wrap3(wire.ParseScopeDigest(b)) },
		func(b []byte) (any, int, error) { return wrap3(wire.ParseBarrier(b)) },
		func(b []byte) (any, int, error) { return wrap3(wire.ParseGoAway(b)) },
	} {
		_, _, err := p(make([]byte, 80))
		wantCode(t, err, wire.CodeEntityInvalid)
	}
}

func TestStatusAppendAllocs(t *testing.T) {
	f := sampleStatuses()[5]
	buf := make([]byte, 0, 64)
	b := f.Append(buf[:0])
	if n := testing.AllocsPerRun(100, func() { buf = f.Append(buf[:0]) }); n != 0 {
		t.Fatalf("Append allocates %v", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = wire.ParseStatus(b) }); n != 0 {
		t.Fatalf("ParseStatus allocates %v", n)
	}
}

// controlStream is every kind of frame, with an unknown variable frame in
// the middle. It returns the stream, the number of frames Next returns and
// the frame boundaries (offsets where a clean EOF may occur).
func controlStream(t testing.TB) ([]byte, int, map[int]bool) {
	t.Helper()
	var b []byte
	bounds := map[int]bool{0: true}
	n := 0
	add := func(nb []byte, counted bool) {
		b = nb
		bounds[len(b)] = true
		if counted {
			n++
		}
	}
	for _, f := range sampleStatuses() {
		add(f.Append(b), true)
	}
	add((&wire.ScopeDigestFrame{ScopeID: 2, Processed: 3}).Append(b), true)
	add(wire.AppendVariable(b, 0xC3, bytes.Repeat([]byte{0xAB}, 5000)), false) // unknown: skipped
	add((&wire.BarrierFrame{ScopeID: 2, ParentEntityID: 5}).Append(b), true)
	caps, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(defaultCaps())
	if err != nil {
		t.Fatal(err)
	}
	add(wire.AppendVariable(b, wire.FrameCapabilities, caps), true)
	add(wire.AppendVariable(b, wire.FrameCheckpoint, bytes.Repeat([]byte{0x01}, 3000)), true)
	add((&wire.GoAwayFrame{LastEntityID: 3}).Append(b), true)
	return b, n, bounds
}

func TestControlReaderStream(t *testing.T) {
	b, want, _ := controlStream(t)
	readers := map[string]func() io.Reader{
		"whole":   func() io.Reader { return bytes.NewReader(b) },
		"onebyte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
		"half":    func() io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
		"dataerr": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
	}
	for name, mk := range readers {
		t.Run(name, func(t *testing.T) {
			cr := wire.NewControlReader(mk(), 0)
			var types []wire.FrameType
			statuses := sampleStatuses()
			for {
				f, err := cr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("after %d frames: %v", len(types), err)
				}
				if f.Type == wire.FrameStatus {
					s := statuses[len(types)]
					if !bytes.Equal(f.Status.Append(nil), s.Append(nil)) {
						t.Fatalf("status %d: %+v want %+v", len(types), f.Status, s)
					}
				}
				if f.Type == wire.FrameCapabilities {
					if _, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCapabilities(f.Body); err != nil {
						t.Fatal(err)
					}
				}
				if f.Type == wire.FrameCheckpoint && len(f.Body) != 3000 {
					t.Fatalf("checkpoint body %d", len(f.Body))
				}
				if f.Type == wire.FrameGoAway && f.GoAway.LastEntityID != 3 {
					t.Fatal(f.GoAway)
				}
				types = append(types, f.Type)
			}
			if len(types) != want {
				t.Fatalf("got %d frames %v, want %d", len(types), types, want)
			}
		})
	}
}

// TestControlReaderTruncated: a stream that ends inside any frame is
// *Error 0x05; one that ends between frames is io.EOF.
func TestControlReaderTruncated(t *testing.T) {
	b, _, bounds := controlStream(t)
	for i := range len(b) {
		cr := wire.NewControlReader(bytes.NewReader(b[:i]), 0)
		var err error
		for err == nil {
			_, err = cr.Next()
		}
		if bounds[i] {
			if err != io.EOF {
				t.Fatalf("prefix %d (frame boundary): %v", i, err)
			}
		} else {
			wantCode(t, err, wire.CodeEntityInvalid)
		}
	}
}

func TestControlReaderErrors(t *testing.T) {
	next := func(b []byte, maxVar int) error {
		_, err := wire.NewControlReader(bytes.NewReader(b), maxVar).Next()
		return err
	}
	// Unknown fixed type (0x57-0x7F) -> 0x05; types below 0x50 too.
	for _, ty := range []byte{0x00, 0x4F, 0x51, 0x57, 0x7F} {
		wantCode(t, next([]byte{ty, 0, 0, 0, 0, 0, 0, 0}, 0), wire.CodeEntityInvalid)
	}
	// Length > 16,777,215 -> 0x06 before the body is read (no body here).
	for _, ty := range []byte{0x80, 0x81, 0x90, 0xFF} {
		wantCode(t, next([]byte{ty, 0x01, 0x00, 0x00, 0x00}, 0), wire.CodeEntityTooLarge)
	}
	// Local limit.
	wantCode(t, next(wire.AppendVariable(nil, wire.FrameCheckpoint, make([]byte, 100)), 99), wire.CodeEntityTooLarge)
	// STATUS extension over the local limit.
	f := wire.StatusFrame{Status: wire.StatusCheckpoint, EntityID: 1, HasExt: true, Ext: make([]byte, 100)}
	wantCode(t, next(f.Append(nil), 99), wire.CodeEntityTooLarge)
	// Underlying error is passed through.
	boom := errors.New("stream reset")
	_, err := wire.NewControlReader(iotest.ErrReader(boom), 0).Next()
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	// Skip of an unknown frame that is cut short.
	wantCode(t, next([]byte{0x90, 0, 0, 0, 10, 1, 2}, 0), wire.CodeEntityInvalid)
}

// TestControlReaderBoundedMemory: a frame that declares 16 MiB but sends 10
// octets must not make the reader allocate anywhere near 16 MiB.
func TestControlReaderBoundedMemory(t *testing.T) {
	b := []byte{0x80, 0x00, 0xFF, 0xFF, 0xFF, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	per := allocBytes(func() {
		_, err := wire.NewControlReader(bytes.NewReader(b), 0).Next()
		wantCode(t, err, wire.CodeEntityInvalid)
	})
	if per > 4096 {
		t.Fatalf("allocated %d bytes per truncated 16 MiB frame", per)
	}
	// Skipping a large unknown frame does not buffer it either.
	big := wire.AppendVariable(nil, 0xA0, make([]byte, 1<<20))
	big = (&wire.GoAwayFrame{LastEntityID: 1}).Append(big)
	per = allocBytes(func() {
		f, err := wire.NewControlReader(bytes.NewReader(big), 0).Next()
		if err != nil || f.Type != wire.FrameGoAway {
			t.Fatal(f, err)
		}
	})
	if per > 4096 {
		t.Fatalf("allocated %d bytes skipping 1 MiB", per)
	}
}

// allocBytes returns the heap bytes f allocates per call (average of 20).
func allocBytes(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for range 20 {
		f()
	}
	runtime.ReadMemStats(&m1)
	return (m1.TotalAlloc - m0.TotalAlloc) / 20
}

func TestControlReaderStatusNoAlloc(t *testing.T) {
	one := (&wire.StatusFrame{Status: wire.StatusComplete, EntityID: 7, HasCursor: true, Cursor: 3}).Append(nil)
	stream := bytes.Repeat(one, 1000)
	r := bytes.NewReader(stream)
	cr := wire.NewControlReader(r, 0)
	if _, err := cr.Next(); err != nil { // warm up
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(500, func() {
		if _, err := cr.Next(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Next allocates %v per STATUS", n)
	}
}
