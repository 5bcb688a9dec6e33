package wire_test

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

func TestValidTransitionTable(t *testing.T) {
	S := func(ss ...wire.Status) map[wire.Status]bool {
		m := map[wire.Status]bool{}
		for _, s := range ss {
			m[s] = true
		}
		return m
	}
	// Section 6.2.3, transcribed independently of the implementation.
	table := map[wire.Status]map[wire.Status]bool{
		wire.StatusPending:     S(wire.StatusProcessing, wire.StatusDehydrating, wire.StatusFailed, wire.StatusSkipped, wire.StatusAbandoned),
		wire.StatusProcessing:  S(wire.StatusComplete, wire.StatusFailed, wire.StatusDehydrating, wire.StatusCheckpoint, wire.StatusYielded, wire.StatusDeferred, wire.StatusAbandoned),
		wire.StatusDehydrating: S(wire.StatusRehydrating, wire.StatusFailed, wire.StatusAbandoned),
		wire.StatusRehydrating: S(wire.StatusComplete, wire.StatusFailed, wire.StatusAbandoned),
		wire.StatusCheckpoint:  S(wire.StatusProcessing),
		wire.StatusYielded:     S(wire.StatusProcessing, wire.StatusFailed, wire.StatusDeferred, wire.StatusAbandoned),
		wire.StatusDeferred:    S(wire.StatusProcessing, wire.StatusFailed, wire.StatusSkipped, wire.StatusAbandoned),
		wire.StatusFailed:      S(wire.StatusRetrying, wire.StatusAbandoned),
		wire.StatusRetrying:    S(wire.StatusProcessing, wire.StatusFailed, wire.StatusAbandoned),
	}
	for from := range wire.Status(16) {
		for to := range wire.Status(16) {
			if got, want := wire.ValidTransition(from, to), table[from][to]; got != want {
				t.Errorf("%v -> %v: %v, want %v", from, to, got, want)
			}
		}
	}
	for s := range wire.Status(16) {
		want := s == wire.StatusComplete || s == wire.StatusSkipped || s == wire.StatusAbandoned
		if s.IsTerminal() != want {
			t.Errorf("%v terminal = %v", s, !want)
		}
	}
	if !wire.IsResolved(wire.StatusFailed, false) || wire.IsResolved(wire.StatusFailed, true) || wire.IsResolved(wire.StatusProcessing, false) {
		t.Fatal("IsResolved: FAILED with retries left must not resolve")
	}
}

func TestCheckLayer(t *testing.T) {
	for s := range wire.Status(13) {
		err := wire.CheckLayer(s, false)
		if s >= wire.StatusYielded {
			wantCode(t, err, wire.CodeLayerUnsupported)
		} else if err != nil {
			t.Fatal(s, err)
		}
		if err := wire.CheckLayer(s, true); err != nil {
			t.Fatal(s, err)
		}
	}
	chk := func(f wire.StatusFrame, l1, l2 bool) error { return wire.CheckStatusFrame(&f, l1, l2) }
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusUnspecified, EntityID: 5}, true, true), wire.CodeEntityInvalid)
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusComplete, EntityID: wire.ConnectionEntity}, true, true), wire.CodeEntityInvalid)
	wantCode(t, chk(wire.StatusFrame{Status: 0xD, EntityID: 5}, true, true), wire.CodeEntityInvalid)
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusComplete, EntityID: 0}, true, true), wire.CodeEntityInvalid)
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusSkipped, EntityID: 5}, true, false), wire.CodeLayerUnsupported)
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusComplete, EntityID: 5, ScopeID: 1}, false, false), wire.CodeLayerUnsupported)
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusComplete, EntityID: 5, Depth: 1}, false, false), wire.CodeLayerUnsupported)
	wantCode(t, chk(wire.StatusFrame{Status: wire.StatusDeferred, EntityID: 5}, true, true), wire.CodeEntityInvalid)
	if err := chk(wire.StatusFrame{Status: wire.StatusComplete, EntityID: 5, ScopeID: 1, Depth: 1}, true, false); err != nil {
		t.Fatal(err)
	}
}

func TestIDArithmetic(t *testing.T) {
	const max = wire.IDModulus
	cases := []struct{ last, next uint32 }{{0, 1}, {1, 2}, {max - 2, max - 1}, {max - 1, 1}}
	for _, c := range cases {
		if got := wire.NextID(c.last); got != c.next {
			t.Errorf("NextID(%#x) = %#x, want %#x", c.last, got, c.next)
		}
	}
	if wire.WindowSize(max-2, 3) != 5 || wire.WindowSize(5, 5) != 0 || wire.WindowSize(1, 10) != 9 {
		t.Fatal("WindowSize")
	}
	// is_before per Section 9.3, including wrap-around.
	if !wire.IsBefore(max-2, 3) || wire.IsBefore(3, max-2) || !wire.IsBefore(1, 2) || wire.IsBefore(2, 1) || !wire.IsBefore(7, 7) {
		t.Fatal("IsBefore")
	}
	if wire.IsBefore(1, 1+max/2) || !wire.IsBefore(1, max/2) {
		t.Fatal("IsBefore half-space boundary")
	}
}

func TestIDSpaceBackpressureAndCursor(t *testing.T) {
	s := wire.NewIDSpace(4)
	var ids []uint32
	for {
		id, ok := s.Assign()
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	if len(ids) != 4 || ids[0] != 1 || ids[3] != 4 {
		t.Fatalf("assigned %v with window 4", ids)
	}
	// Resolving out of order does not move the cursor.
	if c, adv := s.Resolve(3); adv || c != 1 {
		t.Fatal(c, adv)
	}
	if _, ok := s.Assign(); ok {
		t.Fatal("window still full")
	}
	if c, adv := s.Resolve(1); !adv || c != 2 {
		t.Fatal(c, adv)
	}
	if c, adv := s.Resolve(2); !adv || c != 4 { // 2 and the earlier 3
		t.Fatal(c, adv)
	}
	if c, adv := s.Resolve(2); adv || c != 4 { // behind the cursor: ignored
		t.Fatal(c, adv)
	}
	if id, ok := s.Assign(); !ok || id != 5 {
		t.Fatal(id, ok)
	}
	if s.Resolve(99); s.Cursor() != 4 {
		t.Fatal("unassigned id moved the cursor")
	}
}

func TestIDSpaceWrap(t *testing.T) {
	s := wire.NewIDSpaceAfter(8, wire.IDModulus-3)
	var ids []uint32
	for range 4 {
		id, _ := s.Assign()
		ids = append(ids, id)
	}
	// 0xFFFFFFFB, 0xFFFFFFFC, then 0 is skipped: 1, 2.
	if ids[0] != wire.IDModulus-2 || ids[1] != wire.IDModulus-1 || ids[2] != 1 || ids[3] != 2 {
		t.Fatalf("%#x", ids)
	}
	s.Resolve(1)
	s.Resolve(2)
	if c, adv := s.Resolve(ids[1]); adv || c != ids[0] {
		t.Fatal(c, adv)
	}
	if c, adv := s.Resolve(ids[0]); !adv || c != 3 {
		t.Fatalf("cursor %#x after resolving across the wrap", c)
	}
}

// TestIDSpaceRandom checks IDSpace against a reference model with random
// out-of-order resolution and a window; it also wraps around MAX.
func TestIDSpaceRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := wire.NewIDSpaceAfter(64, wire.IDModulus-100_000) // wraps midway
	var inflight []uint32                                 // assigned, unresolved, in order
	resolved := map[uint32]bool{}
	for step := range 200_000 {
		if r.IntN(2) == 0 {
			id, ok := s.Assign()
			if ok {
				if wire.WindowSize(s.Cursor(), id) >= 64 {
					t.Fatalf("step %d: assigned %d beyond window (cursor %d)", step, id, s.Cursor())
				}
				inflight = append(inflight, id)
			} else if s.Outstanding() < 63 {
				t.Fatalf("step %d: refused with %d outstanding", step, s.Outstanding())
			}
		} else if len(inflight) > 0 {
			i := r.IntN(len(inflight))
			id := inflight[i]
			inflight = append(inflight[:i], inflight[i+1:]...)
			resolved[id] = true
			s.Resolve(id)
		}
		// Model cursor: oldest unresolved id, else next id.
		want := wire.NextID(s.LastAssigned())
		if len(inflight) > 0 {
			want = inflight[0]
			for _, id := range inflight {
				if wire.WindowSize(id, want) < wire.WindowSize(want, id) && id != want {
					want = id
				}
			}
		}
		if s.Cursor() != want {
			t.Fatalf("step %d: cursor %d, model %d", step, s.Cursor(), want)
		}
	}
}

func TestMerkleRoot(t *testing.T) {
	leaf := func(id uint32, s wire.Status) [32]byte {
		var b [5]byte
		binary.BigEndian.PutUint32(b[:], id)
		b[4] = byte(s)
		return sha256.Sum256(b[:])
	}
	node := func(a, b [32]byte) [32]byte { return sha256.Sum256(append(a[:], b[:]...)) }
	if wire.MerkleRoot(nil) != ([32]byte{}) {
		t.Fatal("empty root")
	}
	l1, l2, l3 := leaf(1, wire.StatusComplete), leaf(2, wire.StatusFailed), leaf(3, wire.StatusSkipped)
	if wire.MerkleRoot([]wire.Leaf{{1, wire.StatusComplete}}) != l1 {
		t.Fatal("single leaf")
	}
	// Three leaves: H(H(l1||l2) || l3), the odd one promoted unhashed.
	want := node(node(l1, l2), l3)
	in := []wire.Leaf{{3, wire.StatusSkipped}, {1, wire.StatusComplete}, {2, wire.StatusFailed}}
	if got := wire.MerkleRoot(in); got != want {
		t.Fatalf("root %x want %x", got, want)
	}
	if in[0].EntityID != 3 {
		t.Fatal("MerkleRoot modified its input")
	}
	// Five leaves: ((l1 l2)(l3 l4)) l5.
	l4, l5 := leaf(4, wire.StatusComplete), leaf(5, wire.StatusComplete)
	want = node(node(node(l1, l2), node(l3, l4)), l5)
	if got := wire.MerkleRoot([]wire.Leaf{{1, 3}, {2, 4}, {3, 0xB}, {4, 3}, {5, 3}}); got != want {
		t.Fatalf("5 leaves: %x want %x", got, want)
	}
}
