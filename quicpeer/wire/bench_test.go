package wire_test

import (
	"bytes"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

func BenchmarkStatusAppend(b *testing.B) {
	f := wire.StatusFrame{Status: wire.StatusComplete, EntityID: 7, HasCursor: true, Cursor: 3}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = f.Append(buf[:0])
	}
}

func BenchmarkParseStatus(b *testing.B) {
	enc := (&wire.StatusFrame{Status: wire.StatusComplete, EntityID: 7, HasCursor: true, Cursor: 3}).Append(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := wire.ParseStatus(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkControlReaderStatus decodes a stream of 16-octet STATUS frames.
func BenchmarkControlReaderStatus(b *testing.B) {
	one := (&wire.StatusFrame{Status: wire.StatusProcessing, EntityID: 7}).Append(nil)
	stream := bytes.Repeat(one, 4096)
	r := bytes.NewReader(stream)
	cr := wire.NewControlReader(r, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(one)))
	n := 0
	for b.Loop() {
		if n == 4096 {
			r.Reset(stream)
			n = 0
		}
		if _, err := cr.Next(); err != nil {
			b.Fatal(err)
		}
		n++
	}
}

func BenchmarkMerkleRoot1k(b *testing.B) {
	leaves := make([]wire.Leaf, 1000)
	for i := range leaves {
		leaves[i] = wire.Leaf{EntityID: uint32(i + 1), Status: wire.StatusComplete}
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = wire.MerkleRoot(leaves)
	}
}

func BenchmarkEntityHeaderCBOR(b *testing.B) {
	c := wire.CodecFor(wire.FormatCBOR)
	enc, _ := c.MarshalEntityHeader(fullHeader())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.UnmarshalEntityHeader(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEntityHeaderCBORCommon decodes and encodes a header of the
// shape the gateway and peer send (ids, length, checksum, content type,
// metadata; no completion-policy): the reflection-free fast path.
func BenchmarkEntityHeaderCBORCommon(b *testing.B) {
	c := wire.CodecFor(wire.FormatCBOR)
	h := fullHeader()
	h.CompletionPolicy = nil
	enc, _ := c.MarshalEntityHeader(h)
	b.ReportAllocs()
	for b.Loop() {
		d, err := c.UnmarshalEntityHeader(enc)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.MarshalEntityHeader(d); err != nil {
			b.Fatal(err)
		}
	}
}
