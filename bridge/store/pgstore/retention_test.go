package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// openLog opens an event log over s (pruner off: the test runs the passes)
// on a clock two hours after the events' time (past the 1 h minimum age).
func openLog(t *testing.T, s *pgstore.Store, share time.Duration) *eventlog.Log {
	t.Helper()
	now := t0.Add(2 * time.Hour)
	l, err := eventlog.New(context.Background(), s, eventlog.Options{DisablePruner: true, PositionShareInterval: share,
		Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func appendEvents(t *testing.T, l *eventlog.Log, n int) {
	t.Helper()
	for range n {
		if _, err := l.Append(context.Background(), &store.Batch{Events: []store.EventAppend{event("d", eventlog.KindStatus)}}); err != nil {
			t.Fatal(err)
		}
	}
}

// readTo follows l from cursor 1 as client key until it received seq
// last (the latest), then disconnects: the client's position on l is last.
func readTo(t *testing.T, l *eventlog.Log, key string, last uint64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// l learns of another replica's appends from the database (NOTIFY):
	// subscribing before it knows seq 1 would be a FutureCursor.
	waitLatest(t, l, last)
	one := uint64(1)
	done := make(chan error, 1)
	reached := make(chan struct{})
	go func() {
		done <- l.Subscribe(ctx, "acme", key, &one, eventlog.Filter{}, func(ev *gatewayv1.Event) error {
			if ev.GetSeq() == last {
				close(reached)
			}
			return nil
		})
	}()
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("subscription ended before seq %d: %v", last, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("seq %d not delivered within 10 s", last)
	}
	cancel()
	<-done
}

// waitLatest waits until l knows the seqs up to last: a replica learns of
// another's appends from the database (NOTIFY), a moment later.
func waitLatest(t *testing.T, l *eventlog.Log, last uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); l.Latest() < last; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the log knows seqs up to %d, not %d, after 10 s", l.Latest(), last)
		}
	}
}

func prune(t *testing.T, l *eventlog.Log) eventlog.PruneReport {
	t.Helper()
	rep, err := l.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestRetentionPositionsAcrossReplicas: two stores (replicas A and B) and
// their event logs on one database. A client of B read up to seq 30; A,
// which has no client, prunes the shared log only down to 30 - 5 (the
// draft's min_serial with the safety margin), not to latest - 5 as it
// would by its own clients alone. Once B stops refreshing its row (a dead
// replica) the row expires and A prunes by its own positions. A client of
// A holds back a third replica C likewise, until A's Close withdraws A's
// row.
func TestRetentionPositionsAcrossReplicas(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	sA, sB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	const share = time.Second // rows live 5 s
	lA, lB := openLog(t, sA, share), openLog(t, sB, share)
	big := doc("d", "")
	big.Doc.Error = strings.Repeat("x", 1<<16) // the snapshot cap stays above the log
	if _, err := lA.Append(ctx, &store.Batch{Create: big}); err != nil {
		t.Fatal(err)
	}
	appendEvents(t, lA, 30)
	readTo(t, lB, "client-of-B", 30)
	appendEvents(t, lA, 70) // latest 100
	if rep := prune(t, lB); rep.KeepFrom != 25 || rep.Clients != 1 {
		t.Fatalf("B's own pass: %+v, want keep from 25 for its client", rep)
	}
	published := time.Now()
	rep := prune(t, lA)
	if rep.KeepFrom != 25 || rep.MinPosition != 30 || rep.Clients != 1 || rep.Reason != "min_position" {
		t.Fatalf("A's pass with B's client at 30: %+v, want keep from 25 (min position 30, 1 client)", rep)
	}
	if st, err := sA.EventStats(ctx); err != nil || st.OldestSeq != 25 {
		t.Fatalf("oldest retained seq after A's pass: %+v %v, want 25", st, err)
	}
	// B dies: it stops publishing, its row expires after 5 intervals.
	for {
		rep = prune(t, lA)
		if rep.KeepFrom == 95 {
			break
		}
		if rep.KeepFrom != 25 {
			t.Fatalf("A's pass while B's row may be live: %+v", rep)
		}
		if time.Since(published) > 5*share+5*time.Second {
			t.Fatalf("B's row did not expire within its TTL + 5 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if took := time.Since(published); took < 5*share-time.Second {
		t.Fatalf("B's position stopped counting %v after it was published, before its 5 s TTL", took)
	}
	if rep.Clients != 0 || rep.Removed != 70 {
		t.Fatalf("A's pass after B's row expired: %+v, want no client and 70 events removed", rep)
	}
	// A client of A holds back a third replica's passes the same way; A's
	// Close withdraws A's row at once. (B, "dead", publishes nothing.)
	sC := openLease(t, dsn, "C")
	lC := openLog(t, sC, share)
	appendEvents(t, lA, 20)
	readTo(t, lA, "client-of-A", 120) // the latest: the client stops there
	appendEvents(t, lA, 30)           // latest 150
	prune(t, lA)                      // publishes A's client at 120 (keep from 115)
	waitLatest(t, lC, 150)            // C counts positions up to the latest it knows (NOTIFY)
	if rep := prune(t, lC); rep.KeepFrom != 115 || rep.Clients != 1 {
		t.Fatalf("C's pass with A's client at 120: %+v, want keep from 115", rep)
	}
	lA.Close()
	if err := sA.Close(); err != nil {
		t.Fatal(err)
	}
	waitLatest(t, lC, 150) // C prunes by its own latest seq
	if rep := prune(t, lC); rep.KeepFrom != 145 || rep.Clients != 0 {
		t.Fatalf("C's pass right after A's Close: %+v, want keep from 145 (A's row withdrawn)", rep)
	}
}

// TestRetentionPositionsRefreshedBetweenPasses: a log with its pruner on
// publishes its counting clients every PositionShareInterval between the
// retention passes (eventlog's shareLoop), so its row in
// retention_positions keeps moving its expiry while the replica lives; the
// store's Close withdraws it.
func TestRetentionPositionsRefreshedBetweenPasses(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	sA, sB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	lA := openLog(t, sA, time.Second)
	now := t0.Add(2 * time.Hour)
	lB, err := eventlog.New(ctx, sB, eventlog.Options{PruneInterval: time.Hour, PositionShareInterval: 200 * time.Millisecond,
		Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, lA, 30)
	readTo(t, lB, "client-of-B", 30)

	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	row := func() (minSeq int64, clients int, expires time.Time, found bool) {
		err := db.QueryRow(ctx, "SELECT min_seq, clients, expires FROM retention_positions WHERE replica = 'B'").Scan(&minSeq, &clients, &expires)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, 0, time.Time{}, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return minSeq, clients, expires, true
	}
	// Three refreshes of B's row showing B's client at 30, each a later
	// expiry, and no retention pass run by anyone meanwhile.
	var last time.Time
	deadline := time.Now().Add(20 * time.Second)
	for seen := 0; seen < 3; {
		minSeq, clients, expires, found := row()
		switch {
		case time.Now().After(deadline):
			t.Fatalf("B's row refreshed %d times in 20 s at a 200 ms interval (last %v, found %v)", seen, last, found)
		case found && expires.After(last) && minSeq == 30 && clients == 1:
			seen++
			last = expires
		case found && seen > 0 && (minSeq != 30 || clients != 1):
			// (Before the first, a row published before B's client read may
			// show no client.)
			t.Fatalf("B's row after it showed B's client: min_seq %d, clients %d; want 30 and 1", minSeq, clients)
		}
		time.Sleep(50 * time.Millisecond)
	}
	lB.Close()
	if err := sB.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, found := row(); found {
		t.Error("B's row is still there after its store's Close")
	}
}
