package wire_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Draft-04 framing (docs/profile.md 1.2): the reference suite's frozen
// fixed frames decode, re-encode byte for byte, and its refusals keep
// their codes (0x0D where the Length disagrees with the layout).

func parse04(t *testing.T, b []byte) wire.Frame {
	t.Helper()
	f, n, _, err := wire.ParseDraft04Fixed(b, nil)
	if err != nil {
		t.Fatalf("ParseDraft04Fixed(%x): %v", b, err)
	}
	if n != len(b) {
		t.Fatalf("consumed %d of %d octets", n, len(b))
	}
	return f
}

// reencode04 appends f in draft-02 layout and re-frames it as draft-04.
func reencode04(f wire.Frame) []byte {
	var d02 []byte
	switch f.Type {
	case wire.FrameStatus:
		d02 = f.Status.Append(nil)
	case wire.FrameGoAway:
		d02 = f.GoAway.Append(nil)
	case wire.FrameBarrier:
		d02 = f.Barrier.Append(nil)
	case wire.FrameScopeDigest:
		d02 = f.ScopeDigest.Append(nil)
	}
	return wire.AppendDraft04(nil, d02)
}

func TestDraft04FixedVectorsValid(t *testing.T) {
	checks := map[string]func(*testing.T, wire.Frame){
		"valid-status-complete.bin": func(t *testing.T, f wire.Frame) {
			if s := f.Status; s.Status != wire.StatusComplete || s.EntityID != 7 || s.HasCursor || s.HasExt {
				t.Fatalf("%+v", s)
			}
		},
		"valid-status-pending.bin": func(t *testing.T, f wire.Frame) {
			if f.Status.Status != wire.StatusPending || f.Status.EntityID != 7 {
				t.Fatalf("%+v", f.Status)
			}
		},
		"valid-status-processing.bin": func(t *testing.T, f wire.Frame) {
			if f.Status.Status != wire.StatusProcessing || f.Status.EntityID != 7 {
				t.Fatalf("%+v", f.Status)
			}
		},
		"valid-status-heartbeat.bin": func(t *testing.T, f wire.Frame) {
			if s := f.Status; s.Status != wire.StatusUnspecified || s.EntityID != wire.ConnectionEntity || s.HasCursor {
				t.Fatalf("%+v", s)
			}
		},
		"valid-status-cursor.bin": func(t *testing.T, f wire.Frame) {
			if s := f.Status; s.EntityID != wire.ConnectionEntity || !s.HasCursor || s.Cursor != 8 {
				t.Fatalf("%+v", s)
			}
		},
		"valid-goaway.bin": func(t *testing.T, f wire.Frame) {
			if f.Type != wire.FrameGoAway || f.GoAway.LastEntityID != 7 {
				t.Fatalf("%+v", f)
			}
		},
		// Reserved octets are ignored on receipt (they re-encode as zero).
		"valid-goaway-reserved.bin": func(t *testing.T, f wire.Frame) {
			if f.GoAway.LastEntityID != 7 {
				t.Fatalf("%+v", f.GoAway)
			}
		},
	}
	for name, check := range checks {
		t.Run(name, func(t *testing.T) {
			b := readVec(t, "draft04-fixed-frames/"+name)
			f := parse04(t, b)
			check(t, f)
			if name == "valid-goaway-reserved.bin" {
				return
			}
			if got := reencode04(f); !bytes.Equal(got, b) {
				t.Fatalf("re-encoded\n %x\nwant\n %x", got, b)
			}
		})
	}
}

func TestDraft04FixedVectorsInvalid(t *testing.T) {
	for name, code := range map[string]wire.ErrorCode{
		"invalid-status-bad-version.bin":          wire.CodeLayerUnsupported,
		"invalid-status-cursor-flag-mismatch.bin": wire.CodeFrameError,
		"invalid-status-short.bin":                wire.CodeFrameError,
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, err := wire.ParseDraft04Fixed(readVec(t, "draft04-fixed-frames/"+name), nil)
			wantCode(t, err, code)
		})
	}
}

// The reference refuses a cursor on an entity STATUS (0x05); draft-02
// (Section 6.2.4) lets any STATUS carry one, so we accept it: liberal in
// what we accept (docs/conformance.md, draft-04 column).
func TestDraft04EntityCursorAccepted(t *testing.T) {
	f := parse04(t, readVec(t, "draft04-fixed-frames/invalid-status-entity-cursor.bin"))
	if s := f.Status; s.Status != wire.StatusProcessing || s.EntityID != 7 || !s.HasCursor || s.Cursor != 8 {
		t.Fatalf("%+v", s)
	}
}

// The scoped (Layer 1/2) rows of recursive/index.tsv use draft-04 framing
// for status, scope-digest and barrier; the valid ones decode and
// re-encode exactly. Their refusals are session-level (layer gating,
// scope 0), tested in quicpeer.
func TestDraft04RecursiveVectors(t *testing.T) {
	kinds := map[string]bool{"status": true, "scope-digest": true, "barrier": true}
	seen := 0
	for _, row := range tsvRows(t, "recursive/index.tsv") {
		if !kinds[row["kind"]] || row["expectation"] != "valid" {
			continue
		}
		seen++
		b := unhex(t, row["hex"])
		f := parse04(t, b)
		if got := reencode04(f); !bytes.Equal(got, b) {
			t.Errorf("%s: re-encoded %x, want %x", row["name"], got, b)
		}
	}
	if seen != 5 {
		t.Fatalf("%d draft-04 scoped rows, want 5", seen)
	}
}

// A draft-02 fixed frame F maps to the payload F[1] F[2] F[3] 00 F[4:].
func TestDraft04MappingOfDraft02(t *testing.T) {
	frames := []wire.StatusFrame{
		{Status: wire.StatusProcessing, EntityID: 1},
		{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity, HasCursor: true, Cursor: 99},
		{Status: wire.StatusYielded, EntityID: 5, ScopeID: 2, Depth: 3, HasExt: true, Ext: []byte{1, 0, 0, 2, 'a', 'b'}},
	}
	for _, s := range frames {
		d02 := s.Append(nil)
		d04 := wire.AppendDraft04(nil, d02)
		want := append([]byte{d02[0], 0, 0, 0, byte(len(d02))}, d02[1:4]...)
		want = append(want, 0)
		want = append(want, d02[4:]...)
		if !bytes.Equal(d04, want) {
			t.Fatalf("draft-04 %x, want %x", d04, want)
		}
		got := parse04(t, d04).Status
		if got.Status != s.Status || got.EntityID != s.EntityID || got.Cursor != s.Cursor || got.Depth != s.Depth || !bytes.Equal(got.Ext, s.Ext) {
			t.Fatalf("round trip %+v, want %+v", got, s)
		}
		for i := range len(d04) {
			if _, _, _, err := wire.ParseDraft04Fixed(d04[:i], nil); !errors.Is(err, wire.ErrShort) {
				t.Fatalf("prefix %d: err %v, want ErrShort", i, err)
			}
		}
	}
	if cbor := wire.AppendVariable(nil, wire.FrameCheckpoint, []byte{0xa0}); !bytes.Equal(wire.AppendDraft04(nil, cbor), cbor) {
		t.Fatal("variable frames must not be re-framed")
	}
}

func TestControlReaderDetectsFraming(t *testing.T) {
	hb04 := readVec(t, "draft04-fixed-frames/valid-status-heartbeat.bin")
	proc04 := readVec(t, "draft04-fixed-frames/valid-status-processing.bin")
	proc02 := (&wire.StatusFrame{Status: wire.StatusProcessing, EntityID: 7}).Append(nil)
	caps := readVec(t, "control-cbor/valid-capabilities-default.bin")
	for _, tc := range []struct {
		name   string
		stream []byte
		want   wire.Framing
	}{
		{"draft-04", concat(caps, hb04, proc04), wire.FramingDraft04},
		{"draft-02", concat(caps, proc02, proc02), wire.FramingDraft02},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cr := wire.NewControlReader(bytes.NewReader(tc.stream), 0)
			cr.SetFraming(wire.FramingDraft02, true)
			if _, decided := cr.Framing(); decided {
				t.Fatal("decided before any STATUS")
			}
			if f, err := cr.Next(); err != nil || f.Type != wire.FrameCapabilities {
				t.Fatalf("first frame %v %v", f.Type, err)
			}
			var last wire.Frame
			for {
				f, err := cr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				last = f
			}
			if fr, decided := cr.Framing(); !decided || fr != tc.want {
				t.Fatalf("framing %v decided %v, want %v", fr, decided, tc.want)
			}
			if last.Status.Status != wire.StatusProcessing || last.Status.EntityID != 7 {
				t.Fatalf("last frame %+v", last.Status)
			}
		})
	}
}

func TestControlReaderDraft04Errors(t *testing.T) {
	unknown := []byte{0x5F, 0, 0, 0, 3, 1, 2, 3}
	gw := readVec(t, "draft04-fixed-frames/valid-goaway.bin")
	cr := wire.NewControlReader(bytes.NewReader(concat(unknown, gw)), 0)
	cr.SetFraming(wire.FramingDraft04, false)
	f, err := cr.Next()
	if err != nil || f.Type != wire.FrameGoAway || f.GoAway.LastEntityID != 7 {
		t.Fatalf("an unknown fixed type with a Length is skipped: %+v %v", f, err)
	}
	bad := append([]byte{0x56, 0, 0, 0, 9}, make([]byte, 9)...) // GOAWAY is 8
	cr = wire.NewControlReader(bytes.NewReader(bad), 0)
	cr.SetFraming(wire.FramingDraft04, false)
	_, err = cr.Next()
	wantCode(t, err, wire.CodeFrameError)
	huge := []byte{0x50, 0x7F, 0xFF, 0xFF, 0xFF}
	cr = wire.NewControlReader(bytes.NewReader(huge), 1024)
	cr.SetFraming(wire.FramingDraft04, false)
	_, err = cr.Next()
	wantCode(t, err, wire.CodeEntityTooLarge)
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// Layer0Only encodes the reference's defaults exactly as its golden
// CAPABILITIES vector, whatever else the offer carried.
func TestLayer0OnlyMatchesReference(t *testing.T) {
	w, ka, depth := uint64(1024), uint64(30000), uint64(3)
	f := wire.FormatCBOR
	offer := wire.Capabilities{Layer0Core: true, MaxWindowSize: &w, KeepaliveTimeoutMs: &ka,
		SerializationFormat: &f, MaxScopeDepth: &depth}
	l0 := wire.Layer0Only(offer)
	body, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(&l0)
	if err != nil {
		t.Fatal(err)
	}
	want := readVec(t, "control-cbor/valid-capabilities-default.bin")
	if got := wire.AppendVariable(nil, wire.FrameCapabilities, body); !bytes.Equal(got, want) {
		t.Fatalf("CAPABILITIES\n %x\nwant\n %x", got, want)
	}
	if !wire.OnlyLayer0Members(&l0) || wire.OnlyLayer0Members(&offer) {
		t.Fatal("OnlyLayer0Members")
	}
}
