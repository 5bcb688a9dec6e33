package wire_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Fuzz targets: every decoder. Seeds come from testdata/fuzz/<Name>/ (Go's
// corpus format) plus the vectors added here. Invariants: no panic; either
// ErrShort / *Error, or a frame that re-encodes to the same parse.

func addVectors(f *testing.F, dir string, draft04 bool) {
	ents, _ := os.ReadDir(filepath.Join(vecDir, dir))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(vecDir, dir, e.Name()))
		if err != nil || len(b) == 0 {
			continue
		}
		if draft04 && len(b) >= 9 {
			b = append(append([]byte{b[0]}, b[5:8]...), b[9:]...)
		}
		f.Add(b)
	}
}

func checkErr(t *testing.T, err error) {
	t.Helper()
	var pe *wire.Error
	if !errors.Is(err, wire.ErrShort) && !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is neither ErrShort nor *wire.Error", err, err)
	}
}

func FuzzParseStatus(f *testing.F) {
	for _, s := range sampleStatuses() {
		f.Add(s.Append(nil))
	}
	addVectors(f, "draft04-fixed-frames", true)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, n, err := wire.ParseStatus(b)
		if err != nil {
			checkErr(t, err)
			return
		}
		if n > len(b) || n != s.Length() {
			t.Fatalf("n=%d len=%d Length=%d", n, len(b), s.Length())
		}
		re := s.Append(nil)
		s2, n2, err := wire.ParseStatus(re)
		if err != nil || n2 != n || !bytes.Equal(s2.Append(nil), re) {
			t.Fatalf("re-parse: %v", err)
		}
		if s.Status == wire.StatusYielded && s.HasExt {
			if _, err := s.Yield(); err != nil {
				t.Fatal(err)
			}
		}
		if s.Status == wire.StatusDeferred && s.HasExt {
			if _, err := s.ClaimCheck(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func FuzzParseScopeDigest(f *testing.F) {
	f.Add((&wire.ScopeDigestFrame{ScopeID: 1, Processed: 2, MerkleRoot: [32]byte{3}}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, n, err := wire.ParseScopeDigest(b)
		if err != nil {
			checkErr(t, err)
			return
		}
		re := s.Append(nil)
		if n != wire.ScopeDigestFrameLen || !bytes.Equal(re[4:], b[4:n]) {
			t.Fatalf("re-encode %x vs %x", re, b[:n])
		}
	})
}

func FuzzParseBarrier(f *testing.F) {
	f.Add((&wire.BarrierFrame{Released: true, ScopeID: 1, ParentEntityID: 2}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, n, err := wire.ParseBarrier(b)
		if err != nil {
			checkErr(t, err)
			return
		}
		re := s.Append(nil)
		if n != wire.BarrierFrameLen || !bytes.Equal(re[4:], b[4:n]) || re[1]&0x80 != b[1]&0x80 {
			t.Fatalf("re-encode %x vs %x", re, b[:n])
		}
	})
}

func FuzzParseGoAway(f *testing.F) {
	f.Add((&wire.GoAwayFrame{LastEntityID: 7}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, n, err := wire.ParseGoAway(b)
		if err != nil {
			checkErr(t, err)
			return
		}
		if re := s.Append(nil); n != wire.GoAwayFrameLen || !bytes.Equal(re[4:], b[4:n]) {
			t.Fatalf("re-encode %x vs %x", re, b[:n])
		}
	})
}

func FuzzControlReader(f *testing.F) {
	b, _, _ := controlStream(f)
	f.Add(b[:200])
	addVectors(f, "control-cbor", false)
	f.Fuzz(func(t *testing.T, b []byte) {
		cr := wire.NewControlReader(bytes.NewReader(b), 1<<16)
		for range 1000 {
			fr, err := cr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				var pe *wire.Error
				if !errors.As(err, &pe) {
					t.Fatalf("error %v (%T)", err, err)
				}
				return
			}
			if fr.Type.IsVariable() && len(fr.Body) > 1<<16 {
				t.Fatal("body over the limit")
			}
		}
	})
}

func fuzzCodec[T any](f *testing.F, seeds [][]byte, un func(wire.Codec, []byte) (*T, error), mar func(wire.Codec, *T) ([]byte, error)) {
	for _, s := range seeds {
		f.Add(byte(0), s)
		f.Add(byte(1), s)
	}
	f.Fuzz(func(t *testing.T, format byte, b []byte) {
		c := wire.CodecFor(wire.Format(format % 2))
		v, err := un(c, b)
		if err != nil {
			var pe *wire.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T)", err, err)
			}
			return
		}
		// A decoded value re-encodes and decodes to an equal encoding.
		re, err := mar(c, v)
		if err != nil {
			return // e.g. uint64 member that does not fit protobuf uint32
		}
		v2, err := un(c, re)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		re2, _ := mar(c, v2)
		if !bytes.Equal(re, re2) {
			t.Fatalf("unstable encoding %x vs %x", re, re2)
		}
	})
}

func cborSeeds(t *testing.F, tsvKinds ...string) [][]byte {
	var out [][]byte
	for _, file := range []string{"cddl-bodies.tsv", "optional-fields.tsv"} {
		for _, row := range tsvRowsF(t, file) {
			for _, k := range tsvKinds {
				if bytes.HasPrefix([]byte(row["name"]), []byte(k)) || row["kind"] == k {
					out = append(out, unhexF(t, row["hex"]))
				}
			}
		}
	}
	return out
}

func FuzzUnmarshalCapabilities(f *testing.F) {
	seeds := cborSeeds(f, "capabilities", "minimal", "recursive")
	pb, _ := wire.CodecFor(wire.FormatProtobuf).MarshalCapabilities(defaultCaps())
	fuzzCodec(f, append(seeds, pb), wire.Codec.UnmarshalCapabilities, wire.Codec.MarshalCapabilities)
}

func FuzzUnmarshalCheckpoint(f *testing.F) {
	seeds := cborSeeds(f, "checkpoint")
	pb, _ := wire.CodecFor(wire.FormatProtobuf).MarshalCheckpoint(&wire.CheckpointFrame{CheckpointID: "x", SequenceNumber: 1, CheckpointEntityID: 2, ScopeID: ptr(uint32(3))})
	fuzzCodec(f, append(seeds, pb), wire.Codec.UnmarshalCheckpoint, wire.Codec.MarshalCheckpoint)
}

func FuzzUnmarshalEntityHeader(f *testing.F) {
	seeds := cborSeeds(f, "entity")
	for _, fm := range formats {
		b, _ := wire.CodecFor(fm).MarshalEntityHeader(fullHeader())
		seeds = append(seeds, b)
	}
	fuzzCodec(f, seeds, wire.Codec.UnmarshalEntityHeader, wire.Codec.MarshalEntityHeader)
}

func FuzzUnmarshalPipeDoc(f *testing.F) {
	var seeds [][]byte
	for _, fm := range formats {
		b, _ := wire.CodecFor(fm).MarshalPipeDoc(&wire.PipeDoc{DocID: "d", EntityID: 1, Blob: []byte("x"),
			Ownership: &wire.OwnershipContext{OwnerID: "o", Scopes: []string{"s"}}})
		seeds = append(seeds, b)
	}
	fuzzCodec(f, seeds, wire.Codec.UnmarshalPipeDoc, wire.Codec.MarshalPipeDoc)
}

func FuzzReadEntityHeader(f *testing.F) {
	addVectors(f, "entity", false)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fm := range formats {
			c := wire.CodecFor(fm)
			r := bytes.NewReader(b)
			h, err := wire.ReadEntityHeader(r, c, 4096)
			if err != nil {
				var pe *wire.Error
				if !errors.As(err, &pe) {
					t.Fatalf("error %v (%T)", err, err)
				}
				continue
			}
			_, err = io.ReadAll(wire.NewPayloadReader(r, h))
			if err != nil {
				var pe *wire.Error
				if !errors.As(err, &pe) {
					t.Fatalf("payload error %v (%T)", err, err)
				}
			}
		}
	})
}

// FuzzDraft04Fixed: any input parses without panic; a frame that parses
// re-encodes to a frame that parses to the same fields.
func FuzzDraft04Fixed(f *testing.F) {
	addVectors(f, "draft04-fixed-frames", false)
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, _, _, err := wire.ParseDraft04Fixed(b, nil)
		if err != nil {
			return
		}
		again, _, _, err := wire.ParseDraft04Fixed(reencode04(fr), nil)
		if err != nil {
			t.Fatalf("re-encoded frame does not parse: %v", err)
		}
		if again.Type != fr.Type || again.Status.EntityID != fr.Status.EntityID || again.GoAway != fr.GoAway || again.Barrier != fr.Barrier {
			t.Fatalf("round trip %+v != %+v", again, fr)
		}
	})
}
