package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestOwnCommitsAreNotReadBack: a replica's own commits deliver their
// events themselves (deliverOwn), and their notifications, which often
// reach the listener before the commit has delivered, are not read back
// from the database. Before, the listener ran a catch-up query for every
// notification that beat its commit's delivery (the PostgreSQL gateway's
// CPU per small document, docs/performance.md).
func TestOwnCommitsAreNotReadBack(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	rec := newRecorder()
	s.SetEventHook(rec.hook)
	deferred := make(chan uint64, 1024)
	s.OnDeferredNotification(func(seq uint64) { deferred <- seq })
	before := s.TailReads()
	const commits = 300
	ctx := context.Background()
	for i := range commits {
		id := fmt.Sprintf("d%d", i)
		if _, err := s.Commit(ctx, &store.Batch{Create: doc(id, ""), Events: []store.EventAppend{event(id, "created")}}); err != nil {
			t.Fatal(err)
		}
	}
	gapless(t, rec.waitFor(t, commits), 1)
	// Every notification either reached the listener after its commit
	// delivered (skipped as before) or while one was in flight
	// (deferred); neither reads.
	if got := s.TailReads() - before; got != 0 {
		t.Fatalf("%d catch-up reads for %d own commits, want 0 (%d notifications deferred)", got, commits, len(deferred))
	}
	t.Logf("%d of %d notifications arrived while an own commit was in flight", len(deferred), commits)
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
