package bridge

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// readUpTo reads to EOF below the limit, stops at the limit, grows past a
// wrong hint, and passes a reader's error (a failed verification) through.
func TestReadUpTo(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000) // 10,000 octets
	for _, tc := range []struct {
		name         string
		n, limit, hn int
		want         int
	}{
		{"exact hint", 4096, 65537, 4096, 4096},
		{"hint too small", 10000, 65537, 10, 10000},
		{"hint too large", 100, 65537, 65536, 100},
		{"at the limit", 10000, 5001, 4096, 5001},
		{"empty", 0, 65537, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{bytes.NewReader(data[:tc.n]), iotest.OneByteReader(bytes.NewReader(data[:tc.n])), iotest.DataErrReader(bytes.NewReader(data[:tc.n]))} {
				got, err := readUpTo(r, tc.limit, tc.hn)
				if err != nil || !bytes.Equal(got, data[:tc.want]) {
					t.Fatalf("readUpTo(%T) = %d octets, %v; want the first %d", r, len(got), err, tc.want)
				}
			}
		})
	}
	bad := errors.New("checksum mismatch")
	if _, err := readUpTo(io.MultiReader(bytes.NewReader(data[:10]), iotest.ErrReader(bad)), 100, 10); !errors.Is(err, bad) {
		t.Fatalf("reader error: %v, want %v", err, bad)
	}
}

func TestReadUpToOneAllocation(t *testing.T) {
	data := make([]byte, 4096)
	r := bytes.NewReader(data)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(data)
		if b, err := readUpTo(r, 65537, 4096); err != nil || len(b) != 4096 {
			t.Fatalf("readUpTo: %d, %v", len(b), err)
		}
	})
	if allocs > 1 {
		t.Fatalf("readUpTo with a right hint: %v allocations, want 1", allocs)
	}
}
