package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestOwnCommitsAreNotReadBack: a replica's own commits deliver their
// events themselves (deliverOwn), and their notifications, which often
// reach the listener before the commit has delivered, are not read back
// from the database. Before, the listener ran a catch-up query for every
// notification that beat its commit's delivery: 75 for 300 commits one
// after the other (the PostgreSQL gateway's CPU per small document,
// docs/performance.md).
//
// One writer: no read at all (the group runner still overlaps two
// groups: a member's Commit returns before its group has ended). Four
// writers: a group that finishes before an earlier-committed one still in
// flight reads that one's events (deliverOwn's catch-up of the seqs below
// its own), so a few reads remain; at most one in twenty commits.
func TestOwnCommitsAreNotReadBack(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	rec := newRecorder()
	s.SetEventHook(rec.hook)
	deferred := make(chan uint64, 1024)
	s.OnDeferredNotification(func(seq uint64) { deferred <- seq })
	ctx := context.Background()
	commit := func(i int) error {
		id := fmt.Sprintf("d%d", i)
		_, err := s.Commit(ctx, &store.Batch{Create: doc(id, ""), Events: []store.EventAppend{event(id, "created")}})
		return err
	}
	const half = 150
	before := s.TailReads()
	for i := range half {
		if err := commit(i); err != nil {
			t.Fatal(err)
		}
	}
	gapless(t, rec.waitFor(t, half), 1)
	if got := s.TailReads() - before; got != 0 {
		t.Fatalf("%d catch-up reads for %d own commits one after the other, want 0 (%d notifications deferred)", got, half, len(deferred))
	}
	before = s.TailReads()
	var wg sync.WaitGroup
	errs := make(chan error, half)
	for w := range 4 {
		wg.Go(func() {
			for i := half + w; i < 2*half; i += 4 {
				errs <- commit(i)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	gapless(t, rec.waitFor(t, 2*half), 1)
	if got := s.TailReads() - before; got > half/20 {
		t.Fatalf("%d catch-up reads for %d own commits of four writers, want at most %d", got, half, half/20)
	}
	t.Logf("%d of %d notifications arrived while an own commit was in flight", len(deferred), 2*half)
}

// TestNotificationLeftToAnOwnCommitIsDelivered: another replica's
// notification that arrives while one of ours is in flight is left to our
// commit; when it ends without having delivered those events (they came
// after ours, or it failed), it reads them. Nothing else would: no later
// notification or commit comes in this test.
func TestNotificationLeftToAnOwnCommitIsDelivered(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	ra := newRecorder()
	a.SetEventHook(ra.hook)
	deferred := make(chan uint64, 16)
	a.OnDeferredNotification(func(seq uint64) { deferred <- seq })
	release := a.HoldOwnCommit()
	if _, err := b.Commit(context.Background(), &store.Batch{Create: doc("x", ""), Events: []store.EventAppend{event("x", "created"), event("x", "pending")}}); err != nil {
		t.Fatal(err)
	}
	select {
	case seq := <-deferred:
		if seq != 2 {
			t.Fatalf("deferred notification of seq %d, want 2", seq)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the other replica's notification never reached the listener")
	}
	ra.mu.Lock()
	early := len(ra.seqs)
	ra.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d events delivered while the notification was left to the own commit, want 0", early)
	}
	release()
	gapless(t, ra.waitFor(t, 2), 1)
	if a.LastSeq() != 2 {
		t.Fatalf("LastSeq %d, want 2", a.LastSeq())
	}
}
