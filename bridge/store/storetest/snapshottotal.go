package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Raw is what SnapshotTotal needs of a backend besides its stores: access
// to the state underneath them.
type Raw struct {
	// Scan sums the stored bodies of every document and digest of state
	// (the scan SnapshotBytes replaced by a running total).
	Scan func(t *testing.T, state string) int64
	// Delete removes document id and its rows outside the store's API (as
	// an operator would; the store has no delete). Nil: no deletes.
	Delete func(t *testing.T, state, id string)
}

// seedEnv replays one seed of SnapshotTotal.
const seedEnv = "STORETEST_SEED"

// Seeds are the seeds of a seeded workload: $STORETEST_SEED alone when
// set (a replay), else two fixed ones and one new each run.
func Seeds(t *testing.T) []uint64 {
	if v := os.Getenv(seedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, v, err)
		}
		return []uint64{seed}
	}
	return []uint64{1, 2, uint64(time.Now().UnixNano())}
}

// SnapshotTotal runs a seeded random workload on fresh state of b: rounds
// of up to four concurrent commits (so that they share group commits)
// creating documents, updating them and their digests with bodies of
// random sizes, batches that fail and must leave nothing (a stale
// revision after a create and a digest), event pruning and, with
// raw.Delete, deletes outside the store. After every round
// SnapshotBytes must equal raw.Scan; then again after the store is
// closed and reopened, and after a commit on the reopened store. A
// failure names the seed; STORETEST_SEED=<seed> replays it.
func SnapshotTotal(t *testing.T, b Backend, raw Raw, seed uint64, rounds int) {
	state := b.NewState(t)
	s := b.Open(t, state)
	w := &totalWorkload{t: t, s: s, rng: rand.New(rand.NewPCG(seed, 25)), docs: map[string]uint64{}, seed: seed}
	check := func(when string) {
		t.Helper()
		got, err := w.s.SnapshotBytes(context.Background())
		if want := raw.Scan(t, state); err != nil || got != want {
			t.Fatalf("seed %d (replay: %s=%d): %s: SnapshotBytes = %d, %v; a scan of the rows sums %d",
				seed, seedEnv, seed, when, got, err, want)
		}
	}
	check("empty store")
	for r := range rounds {
		w.round()
		if raw.Delete != nil && len(w.docs) > 0 && w.rng.IntN(4) == 0 {
			id := w.pick()
			raw.Delete(t, state, id)
			delete(w.docs, id)
		}
		if w.rng.IntN(3) == 0 {
			w.prune()
		}
		check(fmt.Sprintf("after round %d", r))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	w.s = b.Open(t, state)
	defer w.s.Close()
	check("after reopening")
	w.round()
	check("after a round on the reopened store")
}

// totalWorkload is SnapshotTotal's model: the documents and their revs.
type totalWorkload struct {
	t    *testing.T
	s    Store
	rng  *rand.Rand
	seed uint64
	docs map[string]uint64 // id -> rev
	next int
}

// round runs up to four commits at once, on distinct documents.
func (w *totalWorkload) round() {
	n := 1 + w.rng.IntN(4)
	batches := make([]*store.Batch, n)
	fails := make([]bool, n)
	used := map[string]bool{}
	for i := range n {
		batches[i], fails[i] = w.batch(used)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, b := range batches {
		wg.Go(func() { _, errs[i] = w.s.Commit(context.Background(), b) })
	}
	wg.Wait()
	for i, err := range errs {
		switch {
		case fails[i] && !errors.Is(err, store.ErrStaleRev):
			w.t.Fatalf("seed %d: a batch with a stale rev: err %v, want ErrStaleRev", w.seed, err)
		case !fails[i] && err != nil:
			w.t.Fatalf("seed %d: commit: %v", w.seed, err)
		}
	}
}

// batch is one random batch: a create, an update of a document (with
// digests), or one that fails (a stale rev after a create and digests)
// and must leave nothing. An update touches a document no other batch of
// the round (used) touches or creates.
func (w *totalWorkload) batch(used map[string]bool) (b *store.Batch, fail bool) {
	k := w.rng.IntN(10)
	id := ""
	if k >= 4 && len(w.docs) > 0 {
		id = w.pick()
	}
	if id == "" || used[id] {
		b = w.create()
		used[b.Create.Doc.GetId()] = true // not updated in the round that creates it
		return b, false
	}
	used[id] = true
	if k < 9 {
		return w.update(id, w.docs[id]), false
	}
	b = w.update(id, w.docs[id]+7) // a stale rev: the batch fails
	c := w.create()
	delete(w.docs, c.Create.Doc.GetId()) // never stored
	b.Create, b.Digests = c.Create, append(c.Digests, b.Digests...)
	return b, true
}

func (w *totalWorkload) create() *store.Batch {
	w.next++
	id := fmt.Sprintf("d%04d", w.next)
	rec := newDoc("t", id, base)
	rec.Doc.ContentType = w.filler()
	w.docs[id] = 1
	return &store.Batch{Create: rec, Digests: w.digests(id),
		Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}}}
}

// update is an update of id expected at rev prev; the model's rev only
// moves on success, so a failing batch's is corrected by the caller.
func (w *totalWorkload) update(id string, prev uint64) *store.Batch {
	rec := newDoc("t", id, base)
	rec.Doc.Rev = prev + 1
	rec.Doc.State = gatewayv1.State_RUNNING
	rec.Doc.ContentType = w.filler()
	if prev == w.docs[id] {
		w.docs[id] = prev + 1
	}
	return &store.Batch{Updates: []store.DocumentUpdate{{Record: rec, PrevRev: prev}}, Digests: w.digests(id),
		Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#status", id, prev+1)}}}
}

// digests are 0 to 2 digests of id on scopes 0-2: new rows or upserts of
// existing ones, with bodies of random sizes.
func (w *totalWorkload) digests(id string) []store.DigestRecord {
	var out []store.DigestRecord
	for range w.rng.IntN(3) {
		out = append(out, store.DigestRecord{DocID: id, Attempt: uint32(w.rng.IntN(2)),
			Digest: &gatewayv1.ScopeDigest{ScopeId: uint32(w.rng.IntN(3)), MerkleRoot: w.filler()}})
	}
	return out
}

// filler is a string of 0 to 3000 bytes: body sizes grow and shrink.
func (w *totalWorkload) filler() string { return strings.Repeat("x", w.rng.IntN(3001)) }

// pick is a random document of the model (in id order, so a seed replays).
func (w *totalWorkload) pick() string {
	n := w.rng.IntN(len(w.docs))
	for i := 1; i <= w.next; i++ {
		id := fmt.Sprintf("d%04d", i)
		if _, ok := w.docs[id]; ok {
			if n == 0 {
				return id
			}
			n--
		}
	}
	panic("unreachable")
}

// prune deletes the events below a random seq: it must not move the total.
func (w *totalWorkload) prune() {
	last := w.s.LastSeq()
	if _, err := w.s.PruneEvents(context.Background(), w.rng.Uint64N(last+1)); err != nil {
		w.t.Fatalf("seed %d: prune: %v", w.seed, err)
	}
}
