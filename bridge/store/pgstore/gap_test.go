package pgstore_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/pgtest"
)

// follow subscribes to l (tenant acme) from cursor (nil: live) and returns
// the channel of what it receives; started is closed once the
// subscription is accepted.
func follow(t *testing.T, l *eventlog.Log, cursor *uint64) (<-chan *gatewayv1.Event, <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *gatewayv1.Event, 1024)
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Follow(ctx, eventlog.Subscription{Tenant: "acme", Cursor: cursor,
			OnStart: func(uint64) error { close(started); return nil }}, func(ev *gatewayv1.Event) error {
			out <- ev
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return out, started
}

// next receives one event within 30 s.
func next(t *testing.T, ch <-chan *gatewayv1.Event) *gatewayv1.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30 s")
		return nil
	}
}

func commitN(t *testing.T, s *pgstore.Store, n int) {
	t.Helper()
	for range n {
		if _, err := s.Commit(context.Background(), &store.Batch{Events: []store.EventAppend{event("d", eventlog.KindStatus)}}); err != nil {
			t.Fatal(err)
		}
	}
}

// wantGap fails unless ev is the #info OutdatedCursor event naming the
// missing seqs from..to.
func wantGap(t *testing.T, ev *gatewayv1.Event, from, to uint64) {
	t.Helper()
	if ev.GetKind() != eventlog.KindInfo || ev.GetName() != eventlog.InfoOutdatedCursor {
		t.Fatalf("got %s seq %d, want #info OutdatedCursor for the pruned seqs %d..%d (a silent gap)", ev.GetKind(), ev.GetSeq(), from, to)
	}
	if want := "events " + itoa(from) + " to " + itoa(to) + " "; !strings.Contains(ev.GetMessage(), want) &&
		!strings.Contains(ev.GetMessage(), "cursor "+itoa(from)+" ") {
		t.Fatalf("OutdatedCursor message %q does not name the missing range %d..%d", ev.GetMessage(), from, to)
	}
}

func itoa(u uint64) string { return strconv.FormatUint(u, 10) }

// TestPausedReplicaAnnouncesPrunedGap: replica A's tail is paused (as by
// SIGSTOP) while replica B commits and prunes past A's position. When A
// resumes, its live subscriber gets #info OutdatedCursor naming the pruned
// seqs before the next event, never a silent jump.
func TestPausedReplicaAnnouncesPrunedGap(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	la, err := eventlog.New(context.Background(), a, eventlog.Options{DisablePruner: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { la.Close() })
	evs, started := follow(t, la, nil)
	<-started
	commitN(t, b, 3)
	for want := uint64(1); want <= 3; want++ {
		if ev := next(t, evs); ev.GetSeq() != want {
			t.Fatalf("got seq %d, want %d", ev.GetSeq(), want)
		}
	}
	resume := a.PauseTail()
	commitN(t, b, 10) // 4..13
	if _, err := b.PruneEvents(context.Background(), 10); err != nil {
		resume()
		t.Fatal(err)
	}
	commitN(t, b, 2) // 14, 15
	resume()
	wantGap(t, next(t, evs), 4, 9)
	for want := uint64(10); want <= 15; want++ {
		if ev := next(t, evs); ev.GetSeq() != want {
			t.Fatalf("after the gap: got %s seq %d, want seq %d", ev.GetKind(), ev.GetSeq(), want)
		}
	}
	if a.TailGaps() == 0 {
		t.Fatal("A's tail did not record the gap it read past")
	}
}

// TestReplayAcrossAnotherReplicasPrune: B prunes events that A's own
// retention index still counts as retained. A subscriber of A whose cursor
// is in the pruned range, replayed from the store (A's tail is too small
// to hold it), gets #info OutdatedCursor before the first retained event.
func TestReplayAcrossAnotherReplicasPrune(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	la, err := eventlog.New(context.Background(), a, eventlog.Options{DisablePruner: true, TailEvents: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { la.Close() })
	commitN(t, b, 12)
	commitN(t, a, 1) // A's Commit returns once A delivered 1..13
	if la.Latest() != 13 {
		t.Fatalf("A's log is at %d after its own commit 13", la.Latest())
	}
	if _, err := b.PruneEvents(context.Background(), 8); err != nil {
		t.Fatal(err)
	}
	five := uint64(5)
	evs, _ := follow(t, la, &five)
	wantGap(t, next(t, evs), 5, 7)
	if ev := next(t, evs); ev.GetSeq() != 8 {
		t.Fatalf("after OutdatedCursor: got %s seq %d, want the oldest retained seq 8", ev.GetKind(), ev.GetSeq())
	}
}

// TestPausedCommitDoesNotStallTheCluster: replica A is paused in the middle
// of an event-writing commit, holding the counter row's lock. Replica B's
// event-writing commit does not wait for A forever: the server ends A's
// idle transaction (idle_in_transaction_session_timeout), which rolls
// back, and B's commit gets the next seq with no hole.
func TestPausedCommitDoesNotStallTheCluster(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	commitN(t, b, 1)
	ctx := context.Background()
	held, err := a.HoldCounter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx)
	done := make(chan error, 1)
	var seqs []uint64
	go func() {
		res, err := b.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", eventlog.KindStatus)}})
		seqs = res.Seqs
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("B's commit still waits for the counter lock of A's idle transaction after 30 s")
	}
	if len(seqs) != 1 || seqs[0] != 2 {
		t.Fatalf("B's commit got seqs %v, want [2] (A's transaction rolled back, no hole)", seqs)
	}
	if err := held.Commit(ctx); err == nil {
		t.Fatal("A's idle transaction committed after the server should have ended it")
	}
}
