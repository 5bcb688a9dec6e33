package assembly_test

import (
	"math/rand/v2"
	"testing"

	"github.com/pipestream/gateway/quicpeer/assembly"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestTrackerManyParentsOutOfOrder: with many parents whose children
// resolve in a random interleaved order (final statuses via Settle, some
// parents sealed only after their children resolved), PopReady yields a
// parent exactly when its last child resolves (or when it is sealed with
// every child resolved), never earlier, and each parent once (Section 9.6).
func TestTrackerManyParentsOutOfOrder(t *testing.T) {
	const parents, children = 200, 7
	rng := rand.New(rand.NewPCG(1, 2))
	tr := assembly.NewTracker()
	type ev struct {
		parent, child uint32 // child 0: Seal
	}
	var events []ev
	left := map[uint32]int{}
	sealed := map[uint32]bool{}
	for p := uint32(1); p <= parents; p++ {
		if err := tr.Add(assembly.NewManifest(p*100, 0, nil, uint64(p))); err != nil {
			t.Fatal(err)
		}
		for c := uint32(1); c <= children; c++ {
			if err := tr.AddChild(assembly.Key{Parent: p * 100}, p*100+c); err != nil {
				t.Fatal(err)
			}
			events = append(events, ev{p, c})
		}
		events = append(events, ev{p, 0})
		left[p] = children
	}
	rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
	finals := []wire.Status{wire.StatusComplete, wire.StatusFailed, wire.StatusSkipped, wire.StatusAbandoned}
	popped := 0
	for _, e := range events {
		k := assembly.Key{Parent: e.parent * 100}
		if e.child == 0 {
			if err := tr.Seal(k); err != nil {
				t.Fatal(err)
			}
			sealed[e.parent] = true
		} else {
			if err := tr.Settle(k, e.parent*100+e.child, finals[rng.IntN(len(finals))]); err != nil {
				t.Fatal(err)
			}
			left[e.parent]--
		}
		wantReady := sealed[e.parent] && left[e.parent] == 0
		m, ok := tr.PopReady()
		if ok != wantReady {
			t.Fatalf("after %+v: PopReady ok=%v, want %v (children left %d, sealed %v)", e, ok, wantReady, left[e.parent], sealed[e.parent])
		}
		if ok {
			popped++
			if m.ParentID != e.parent*100 {
				t.Fatalf("after %+v: PopReady returned parent %d", e, m.ParentID)
			}
			if _, err := m.Evaluate(); err != nil {
				t.Fatalf("ready manifest does not evaluate: %v", err)
			}
			if _, again := tr.PopReady(); again {
				t.Fatal("two manifests ready after one event")
			}
		}
	}
	if popped != parents || tr.Len() != 0 {
		t.Fatalf("popped %d of %d, %d left", popped, parents, tr.Len())
	}
}

func TestSettle(t *testing.T) {
	p := &wire.CompletionPolicy{OnFailure: ptr(wire.ActionRetry), MaxRetries: ptr(uint32(3))}
	m := assembly.NewManifest(1, 0, p, 0)
	_ = m.AddChild(2)
	_ = m.AddChild(3)
	m.Seal()
	// FAILED settled by the owner is final even with retries in the policy.
	if r, err := m.Settle(2, wire.StatusFailed); !r || err != nil || !m.Resolved(2) {
		t.Fatalf("Settle FAILED: %v %v", r, err)
	}
	if _, err := m.Settle(2, wire.StatusComplete); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal("second Settle accepted")
	}
	if _, err := m.Settle(3, wire.StatusProcessing); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal("non-final Settle accepted")
	}
	if _, err := m.Settle(9, wire.StatusComplete); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal("unknown child settled")
	}
	if m.Ready() {
		t.Fatal("ready with child 3 unresolved")
	}
	if r, err := m.Settle(3, wire.StatusSkipped); !r || err != nil || !m.Ready() {
		t.Fatalf("Settle SKIPPED: %v %v ready %v", r, err, m.Ready())
	}
	if st, ok := m.Status(3); !ok || st != wire.StatusSkipped {
		t.Fatalf("Status(3) = %v %v", st, ok)
	}
	o, err := m.Evaluate()
	if err != nil || o.ParentStatus != wire.StatusFailed || o.Total != 2 || o.Succeeded != 0 {
		t.Fatalf("Evaluate = %+v, %v; want FAILED (strict, one FAILED)", o, err)
	}
}

// BenchmarkTrackerDocument is one document's life in the peer's tracker:
// a manifest with 16 children, sealed, every child settled (a
// decrease-key each), popped when ready. Allocations are per document
// (manifest, its index map, heap node), none per settled child.
func BenchmarkTrackerDocument(b *testing.B) {
	b.ReportAllocs()
	tr := assembly.NewTracker()
	// Other documents in flight, so the heap is not trivially small.
	for p := uint32(1); p <= 1000; p++ {
		_ = tr.Add(assembly.NewManifest(1_000_000+p, 0, nil, 0))
	}
	id := uint32(0)
	for b.Loop() {
		id++
		k := assembly.Key{Parent: id}
		_ = tr.Add(assembly.NewManifest(id, 0, nil, 0))
		for c := uint32(1); c <= 16; c++ {
			_ = tr.AddChild(k, c)
		}
		_ = tr.Seal(k)
		for c := uint32(16); c >= 1; c-- {
			if err := tr.Settle(k, c, wire.StatusComplete); err != nil {
				b.Fatal(err)
			}
		}
		if m, ok := tr.PopReady(); !ok || m.ParentID != id {
			b.Fatal("document not ready after its last child")
		}
	}
}
