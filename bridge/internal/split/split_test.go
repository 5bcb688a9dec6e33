package split_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/pipestream/gateway/bridge/internal/split"
)

func cutAll(t *testing.T, in []byte, st split.Strategy, size int, r io.Reader) []split.Chunk {
	t.Helper()
	if r == nil {
		r = bytes.NewReader(in)
	}
	s, err := split.New(r, st, size)
	if err != nil {
		t.Fatal(err)
	}
	var out []split.Chunk
	var off uint64
	for {
		c, err := s.Next(nil)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Data) == 0 || len(c.Data) > size {
			t.Fatalf("chunk %d has %d bytes, want 1..%d", c.Index, len(c.Data), size)
		}
		if c.Index != uint64(len(out)) || c.Offset != off {
			t.Fatalf("chunk index/offset %d/%d, want %d/%d", c.Index, c.Offset, len(out), off)
		}
		if c.Sum != sha256.Sum256(c.Data) {
			t.Fatalf("chunk %d checksum mismatch", c.Index)
		}
		off += uint64(len(c.Data))
		out = append(out, c)
	}
	var joined []byte
	for _, c := range out {
		joined = append(joined, c.Data...)
	}
	if !bytes.Equal(joined, in) {
		t.Fatalf("reassembled %d bytes differ from input %d bytes", len(joined), len(in))
	}
	if s.Sum() != sha256.Sum256(in) || s.BytesRead() != uint64(len(in)) {
		t.Fatal("whole-stream sum or length wrong")
	}
	return out
}

func TestFixedBytes(t *testing.T) {
	in := bytes.Repeat([]byte("0123456789"), 100) // 1000 bytes
	cs := cutAll(t, in, split.FixedBytes, 300, nil)
	if len(cs) != 4 || len(cs[3].Data) != 100 {
		t.Fatalf("got %d chunks", len(cs))
	}
	// Exact multiple: no empty trailing chunk.
	cs = cutAll(t, in, split.FixedBytes, 250, iotest.OneByteReader(bytes.NewReader(in)))
	if len(cs) != 4 {
		t.Fatalf("got %d chunks, want 4", len(cs))
	}
	if cs := cutAll(t, nil, split.FixedBytes, 10, nil); len(cs) != 0 {
		t.Fatalf("empty stream gave %d chunks", len(cs))
	}
}

func TestLines(t *testing.T) {
	in := []byte("aaa\nbbbb\ncc\nd\n")
	cs := cutAll(t, in, split.Lines, 9, nil)
	want := []string{"aaa\nbbbb\n", "cc\nd\n"}
	if len(cs) != len(want) {
		t.Fatalf("got %d chunks, want %d", len(cs), len(want))
	}
	for i, c := range cs {
		if string(c.Data) != want[i] {
			t.Fatalf("chunk %d = %q, want %q", i, c.Data, want[i])
		}
	}
	// A line longer than the chunk size is hard-cut.
	in = []byte("xxxxxxxxxxxxxxx\nyy\n")
	cs = cutAll(t, in, split.Lines, 6, nil)
	if string(cs[0].Data) != "xxxxxx" || string(cs[2].Data) != "xxx\n" {
		t.Fatalf("hard cut wrong: %q %q", cs[0].Data, cs[2].Data)
	}
	// Every chunk but a hard cut ends at a line boundary.
	var sb strings.Builder
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		sb.WriteString(strings.Repeat("w", rng.IntN(40)))
		sb.WriteByte('\n')
	}
	in = []byte(sb.String())
	for _, c := range cutAll(t, in, split.Lines, 64, iotest.HalfReader(bytes.NewReader(in))) {
		if c.Data[len(c.Data)-1] != '\n' {
			t.Fatalf("chunk %d does not end at a line boundary: %q", c.Index, c.Data)
		}
	}
}

func TestParagraphs(t *testing.T) {
	in := []byte("p1 line1\np1 line2\n\np2\n\np3 is long\r\n\r\ntail")
	cs := cutAll(t, in, split.Paragraphs, 24, nil)
	want := []string{"p1 line1\np1 line2\n\np2\n\n", "p3 is long\r\n\r\ntail"}
	if len(cs) != len(want) {
		t.Fatalf("got %d chunks", len(cs))
	}
	for i, c := range cs {
		if string(c.Data) != want[i] {
			t.Fatalf("chunk %d = %q, want %q", i, c.Data, want[i])
		}
	}
	// No blank line within the window: fall back to the last line end.
	cs = cutAll(t, []byte("one\ntwo\nthree\nfour\n"), split.Paragraphs, 10, nil)
	if string(cs[0].Data) != "one\ntwo\n" {
		t.Fatalf("fallback cut %q", cs[0].Data)
	}
}

func TestReadError(t *testing.T) {
	boom := errors.New("boom")
	s, _ := split.New(iotest.ErrReader(boom), split.Lines, 8)
	if _, err := s.Next(nil); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if _, err := s.Next(nil); !errors.Is(err, boom) {
		t.Fatalf("second err = %v, want sticky boom", err)
	}
	if _, err := split.New(nil, split.Lines, 0); err == nil {
		t.Fatal("size 0 accepted")
	}
}

func TestReusesDst(t *testing.T) {
	in := bytes.Repeat([]byte{'a'}, 100)
	s, _ := split.New(bytes.NewReader(in), split.FixedBytes, 10)
	buf := make([]byte, 10)
	c, _ := s.Next(buf)
	if &c.Data[0] != &buf[0] {
		t.Fatal("Next did not reuse dst")
	}
}

func BenchmarkLines(b *testing.B) {
	line := []byte(strings.Repeat("x", 79) + "\n")
	in := bytes.Repeat(line, 1<<14) // 1.25 MiB
	dst := make([]byte, 64<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		s, _ := split.New(bytes.NewReader(in), split.Lines, 64<<10)
		for {
			if _, err := s.Next(dst); err != nil {
				break
			}
		}
	}
}
