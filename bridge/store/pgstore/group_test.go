package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestGroupCommitGathers runs 64 plain Commits at once and checks that
// they were gathered into fewer transactions than batches, none rolled
// back, each with its own consecutive seqs.
func TestGroupCommitGathers(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 64
	batches := make([]*store.Batch, n)
	for i := range batches {
		id := fmt.Sprintf("d%02d", i)
		batches[i] = &store.Batch{Create: doc(id, "r-"+id), Events: []store.EventAppend{event(id, "created")}}
	}
	res, errs := commitAll(ctx, s, batches)
	var seqs []uint64
	for i := range batches {
		if errs[i] != nil || len(res[i].Seqs) != 1 {
			t.Fatalf("batch %d: %+v, %v; want one seq", i, res[i], errs[i])
		}
		seqs = append(seqs, res[i].Seqs[0])
	}
	sort.Slice(seqs, func(a, b int) bool { return seqs[a] < seqs[b] })
	gapless(t, seqs, 1)
	ws := s.WriterStats()
	if ws.Batches != n || ws.Retries != 0 || ws.Transactions >= n {
		t.Errorf("WriterStats %+v: want %d batches, no retry, fewer transactions (group commit)", ws, n)
	}
}

// commitAll runs s.Commit on every batch at once.
func commitAll(ctx context.Context, s *pgstore.Store, batches []*store.Batch) ([]store.CommitResult, []error) {
	res := make([]store.CommitResult, len(batches))
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res[i], errs[i] = s.Commit(ctx, batches[i])
		}()
	}
	close(start)
	wg.Wait()
	return res, errs
}

// TestGroupCommit runs many Commits at once (group commit, group.go) with
// a failing batch of every kind among plain ones, and checks that each
// failing batch got its exact outcome and applied nothing (no document, no
// seq), that no plain batch was taken down, and that the seqs of all
// batches are unique, gapless and delivered to the hook in order.
func TestGroupCommit(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	rec := newRecorder()
	s.SetEventHook(rec.hook)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("taken", "r-taken"), Events: []store.EventAppend{event("taken", "created")}}); err != nil {
		t.Fatal(err)
	}
	before := s.WriterStats()

	const n = 96
	batches := make([]*store.Batch, n)
	want := make([]error, n)
	for i := range batches {
		id := fmt.Sprintf("d%02d", i)
		b := &store.Batch{Create: doc(id, "r-"+id), Events: []store.EventAppend{event(id, "created"), event(id, "queued")},
			Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadContent, Body: []byte(id)}}}
		switch i % 8 {
		case 3: // the id is taken
			b.Create = doc("taken", "r-"+id)
			want[i] = store.ErrConflict
		case 5: // stale rev
			upd := doc("taken", "r-taken")
			upd.Doc.Rev = 9
			b = &store.Batch{Updates: []store.DocumentUpdate{{Record: upd, PrevRev: 8}}, Events: []store.EventAppend{event("taken", "x")}}
			want[i] = store.ErrStaleRev
		case 7: // an entity of a document that does not exist
			b.Entities = []store.EntityRecord{{DocID: "missing", Entity: &gatewayv1.Entity{EntityId: 1}}}
			want[i] = store.ErrNotFound
		}
		batches[i] = b
	}
	res, errs := commitAll(ctx, s, batches)

	var seqs []uint64
	ok := 0
	for i := range batches {
		switch {
		case want[i] == nil && errs[i] != nil:
			t.Errorf("batch %d: %v; want it committed", i, errs[i])
		case want[i] != nil && !errors.Is(errs[i], want[i]):
			t.Errorf("batch %d: %v; want %v", i, errs[i], want[i])
		case want[i] != nil && len(res[i].Seqs) != 0:
			t.Errorf("batch %d failed but got seqs %v", i, res[i].Seqs)
		case want[i] == nil:
			ok++
			if len(res[i].Seqs) != 2 || res[i].Seqs[1] != res[i].Seqs[0]+1 {
				t.Errorf("batch %d: seqs %v; want two consecutive", i, res[i].Seqs)
			}
			seqs = append(seqs, res[i].Seqs...)
		}
	}
	sort.Slice(seqs, func(a, b int) bool { return seqs[a] < seqs[b] })
	gapless(t, seqs, 2)
	gapless(t, rec.waitFor(t, 1+len(seqs)), 1)

	if ws := s.WriterStats(); ws.Batches-before.Batches != n {
		t.Errorf("WriterStats %+v (before %+v): want %d more batches", ws, before, n)
	}
	for i := range batches {
		id := fmt.Sprintf("d%02d", i)
		_, err := s.GetDocument(ctx, "acme", id, false)
		if exists := err == nil; exists != (want[i] == nil) {
			t.Errorf("document %s: GetDocument %v; want it to exist exactly when its batch committed", id, err)
		}
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.Count != uint64(1+ok*2) || st.LatestSeq != uint64(1+ok*2) {
		t.Errorf("EventStats %+v, %v; want %d events, latest seq %d", st, err, 1+ok*2, 1+ok*2)
	}
}

// TestGroupCommitEndedContext checks that a Commit whose ctx already ended
// returns its error and applies nothing (the group drops it), and that the
// Store still commits afterwards.
func TestGroupCommitEndedContext(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ended, stop := context.WithCancel(ctx)
	stop()
	_, err := s.Commit(ended, &store.Batch{Create: doc("x", "r-x"), Events: []store.EventAppend{event("x", "created")}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit with an ended ctx: %v; want context.Canceled", err)
	}
	if _, err := s.GetDocument(ctx, "acme", "x", false); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDocument after the dropped commit: %v; want ErrNotFound", err)
	}
	res, err := s.Commit(ctx, &store.Batch{Create: doc("y", "r-y"), Events: []store.EventAppend{event("y", "created")}})
	if err != nil || len(res.Seqs) != 1 || res.Seqs[0] != 1 {
		t.Errorf("next Commit: %+v, %v; want seq 1 (the dropped commit took none)", res, err)
	}
}
