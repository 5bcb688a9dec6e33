package assembly_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pipestream/gateway/quicpeer/assembly"
)

// TestHeapRandom runs random Insert / ExtractMin / DecreaseKey / Update /
// Delete against a reference multiset and checks every extraction returns
// the reference minimum.
func TestHeapRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	var h assembly.Heap[int]
	live := map[int]*assembly.Node[int]{} // value -> handle
	ref := map[int]uint64{}               // value -> key
	next := 0
	refMin := func() uint64 {
		keys := make([]uint64, 0, len(ref))
		for _, k := range ref {
			keys = append(keys, k)
		}
		return slices.Min(keys)
	}
	pick := func() int {
		i := r.IntN(len(live))
		for v := range live {
			if i == 0 {
				return v
			}
			i--
		}
		panic("unreachable")
	}
	for step := range 6000 {
		switch op := r.IntN(10); {
		case op < 4:
			k := r.Uint64N(1000)
			live[next] = h.Insert(k, next)
			ref[next] = k
			next++
		case op < 6 && len(live) > 0:
			n, ok := h.ExtractMin()
			if !ok {
				t.Fatal("empty")
			}
			if want := refMin(); n.Key() != want || ref[n.Value] != want {
				t.Fatalf("step %d: extracted key %d, reference min %d", step, n.Key(), want)
			}
			delete(live, n.Value)
			delete(ref, n.Value)
		case op < 8 && len(live) > 0:
			v := pick()
			k := r.Uint64N(ref[v] + 1)
			if err := h.DecreaseKey(live[v], k); err != nil {
				t.Fatal(err)
			}
			ref[v] = k
		case op < 9 && len(live) > 0:
			v := pick()
			k := r.Uint64N(2000)
			if err := h.Update(live[v], k); err != nil {
				t.Fatal(err)
			}
			ref[v] = k
		case len(live) > 0:
			v := pick()
			if err := h.Delete(live[v]); err != nil {
				t.Fatal(err)
			}
			delete(live, v)
			delete(ref, v)
		}
		if h.Len() != len(ref) {
			t.Fatalf("step %d: Len %d, reference %d", step, h.Len(), len(ref))
		}
		if m, ok := h.Min(); ok && m.Key() != refMin() {
			t.Fatalf("step %d: Min %d, reference %d", step, m.Key(), refMin())
		}
	}
	// Drain: sorted order.
	var got []uint64
	for h.Len() > 0 {
		n, _ := h.ExtractMin()
		got = append(got, n.Key())
	}
	if !slices.IsSorted(got) {
		t.Fatal("drain not sorted")
	}
}

func TestHeapErrors(t *testing.T) {
	var a, b assembly.Heap[string]
	n := a.Insert(5, "x")
	if err := a.DecreaseKey(n, 6); err != assembly.ErrKeyIncrease {
		t.Fatal(err)
	}
	if err := b.DecreaseKey(n, 1); err != assembly.ErrNotInHeap {
		t.Fatal(err)
	}
	a.ExtractMin()
	if err := a.Delete(n); err != assembly.ErrNotInHeap {
		t.Fatal("extracted handle still accepted")
	}
	if _, ok := a.ExtractMin(); ok {
		t.Fatal("empty heap returned a node")
	}
}

func BenchmarkHeapInsertExtract(b *testing.B) {
	var h assembly.Heap[int]
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 1024 {
		h.Insert(r.Uint64(), i)
	}
	b.ReportAllocs()
	for b.Loop() {
		h.Insert(r.Uint64(), 0)
		h.ExtractMin()
	}
}

func BenchmarkHeapDecreaseKey(b *testing.B) {
	var h assembly.Heap[int]
	nodes := make([]*assembly.Node[int], 1024)
	for i := range nodes {
		nodes[i] = h.Insert(1<<62, i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		n := nodes[i%len(nodes)]
		if n.Key() == 0 {
			_ = h.Update(n, 1<<62)
		} else {
			_ = h.DecreaseKey(n, n.Key()/2)
		}
		i++
	}
}
