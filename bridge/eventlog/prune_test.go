package eventlog_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestPruneHonorsClientPosition: a client that disconnected at seq 30 holds
// the window at 30 - 5 while it is active, and stops counting after 7 days.
func TestPruneHonorsClientPosition(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := open(t, t.TempDir(), eventlog.Options{Registerer: reg})
	e.createDoc("t", "d", 1<<16)
	e.appendN("t", 30, eventlog.KindStatus, "d")
	// The client reads up to 30 and leaves.
	s := subscribe(e, "t", ptr(1), eventlog.Filter{})
	s.seqs(t, 30)
	s.stop(t)
	e.appendN("t", 70, eventlog.KindStatus, "d") // latest 100
	e.clk.Advance(2 * time.Hour)
	rep, err := e.log.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.MinPosition != 30 || rep.KeepFrom != 25 || rep.Clients != 1 || rep.Removed != 24 || rep.Reason != "min_position" {
		t.Fatalf("got %+v, want min position 30, keep from 25", rep)
	}
	w, err := e.log.Window(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if w.GetOldestSeq() != 25 || w.GetLatestSeq() != 100 || w.GetRetainedEvents() != 76 ||
		w.GetActiveClients() != 1 || w.GetSnapshotBytes() < 1<<16 || w.GetRetainedBytes() == 0 {
		t.Fatalf("window %v", w)
	}
	// The client resumes with its cursor: no OutdatedCursor.
	s = subscribe(e, "t", ptr(30), eventlog.Filter{})
	if ev := s.next(t); ev.GetSeq() != 30 {
		t.Fatalf("resume got %v", ev)
	}
	s.stop(t)
	if got := outdated(reg); got != 0 {
		t.Fatalf("outdated fallbacks %v", got)
	}
	// Eight days later the client is inactive: min_serial is the latest.
	e.clk.Advance(8 * 24 * time.Hour)
	rep, err = e.log.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Clients != 0 || rep.KeepFrom != 95 {
		t.Fatalf("got %+v, want no clients, keep from 100-5", rep)
	}
	s = subscribe(e, "t", ptr(30), eventlog.Filter{})
	if ev := s.next(t); ev.GetName() != eventlog.InfoOutdatedCursor {
		t.Fatalf("got %v, want OutdatedCursor", ev)
	}
	s.stop(t)
	if got := outdated(reg); got != 1 {
		t.Fatalf("outdated fallbacks metric %v, want 1", got)
	}
}

// outdated reads pipestream_eventlog_outdated_cursor_total from reg.
func outdated(reg *prometheus.Registry) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "pipestream_eventlog_outdated_cursor_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// TestPruneSafeguardsAndCaps at the log level: min age and newest N hold
// the adaptive rule back; the snapshot size and hard caps always apply.
func TestPruneSafeguardsAndCaps(t *testing.T) {
	ctx := context.Background()
	t.Run("min age", func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{})
		e.createDoc("t", "d", 1<<16)
		e.appendN("t", 10, eventlog.KindStatus, "d") // at epoch
		e.clk.Advance(30 * time.Minute)
		e.appendN("t", 10, eventlog.KindStatus, "d") // 11..20 at +30m
		e.clk.Advance(45 * time.Minute)              // first ten are 75m old, the rest 45m
		if rep, _ := e.log.Prune(ctx); rep.KeepFrom != 11 || rep.Reason != "min_age" {
			t.Fatalf("got %+v, want keep from 11 (younger than an hour)", rep)
		}
	})
	t.Run("newest N", func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{KeepNewest: 8, NoSafetyMargin: true, MinAge: time.Nanosecond})
		e.createDoc("t", "d", 1<<16)
		e.appendN("t", 20, eventlog.KindStatus, "d")
		e.clk.Advance(time.Hour)
		if rep, _ := e.log.Prune(ctx); rep.KeepFrom != 13 || rep.Reason != "keep_newest" {
			t.Fatalf("got %+v, want keep from 13", rep)
		}
	})
	t.Run("snapshot size", func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{})
		e.createDoc("t", "d", 200)
		e.appendN("t", 50, eventlog.KindStatus, "d")
		// A client stuck at 1 would hold everything.
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- e.log.Subscribe(sctx, "t", "stuck", ptr(1), eventlog.Filter{}, func(*gatewayv1.Event) error {
				<-sctx.Done()
				return sctx.Err()
			})
		}()
		waitSubscribed(t, e, 1)
		e.clk.Advance(2 * time.Hour)
		rep, _ := e.log.Prune(ctx)
		cancel()
		<-done
		w, _ := e.log.Window(ctx)
		if rep.Reason != "snapshot_size" || w.GetRetainedBytes() > w.GetSnapshotBytes() || w.GetRetainedEvents() == 0 {
			t.Fatalf("got %+v, window %v: retained bytes must not exceed the snapshot", rep, w)
		}
	})
	t.Run("floor beats the snapshot size", func(t *testing.T) {
		// A small store (issue 24): 50 events outweigh the 200-byte
		// snapshot, but they are minutes old: the floor (--retain-min,
		// 1 h) keeps every one; two hours later they go (no client needs
		// them).
		e := open(t, t.TempDir(), eventlog.Options{})
		e.createDoc("t", "d", 200)
		e.appendN("t", 50, eventlog.KindStatus, "d")
		e.clk.Advance(2 * time.Minute)
		rep, _ := e.log.Prune(ctx)
		w, _ := e.log.Window(ctx)
		if rep.Removed != 0 || w.GetOldestSeq() != 1 || w.GetRetainedBytes() <= w.GetSnapshotBytes() {
			t.Fatalf("2 minutes later: %+v, window %v; want all 50 events kept above the snapshot size", rep, w)
		}
		e.clk.Advance(2 * time.Hour)
		if rep, _ := e.log.Prune(ctx); rep.Removed == 0 || rep.RetainedBytes > rep.SnapshotBytes {
			t.Fatalf("2 hours later: %+v, want events pruned to within the snapshot size", rep)
		}
	})
	t.Run("hard caps", func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{MaxAge: 10 * time.Minute, MaxBytes: 1 << 20})
		e.createDoc("t", "d", 1<<16)
		s := subscribe(e, "t", ptr(0), eventlog.Filter{}) // active at position 0
		waitSubscribed(t, e, 1)
		e.appendN("t", 10, eventlog.KindStatus, "d")
		e.clk.Advance(time.Hour)
		e.appendN("t", 3, eventlog.KindStatus, "d")
		s.seqs(t, 13)
		if rep, _ := e.log.Prune(ctx); rep.KeepFrom != 11 || rep.Reason != "max_age" {
			t.Fatalf("got %+v, want the max age cap at 11", rep)
		}
		s.stop(t)
		e2 := open(t, t.TempDir(), eventlog.Options{MaxBytes: 1})
		e2.createDoc("t", "d", 1<<16)
		e2.appendN("t", 5, eventlog.KindStatus, "d")
		if rep, _ := e2.log.Prune(ctx); rep.KeepFrom != 5 || rep.Reason != "max_bytes" {
			t.Fatalf("got %+v, want only the newest event kept", rep)
		}
	})
}

// TestSeqContinuesAfterReopen: seqs never repeat across a restart, and the
// reopened log serves the retained window from the store.
func TestSeqContinuesAfterReopen(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir, eventlog.Options{})
	e.createDoc("t", "d", 1<<16)
	e.appendN("t", 10, eventlog.KindStatus, "d")
	e.clk.Advance(2 * time.Hour)
	if _, err := e.log.Prune(context.Background()); err != nil { // window 5..10
		t.Fatal(err)
	}
	e.close()
	e = open(t, dir, eventlog.Options{})
	if l := e.log.Latest(); l != 10 {
		t.Fatalf("latest after reopen %d", l)
	}
	w, _ := e.log.Window(context.Background())
	if w.GetOldestSeq() != 5 || w.GetLatestSeq() != 10 || w.GetRetainedEvents() != 6 {
		t.Fatalf("window after reopen %v", w)
	}
	if err := e.log.Subscribe(context.Background(), "t", "", ptr(11), eventlog.Filter{}, func(*gatewayv1.Event) error { return nil }); !errors.Is(err, eventlog.ErrFutureCursor) {
		t.Fatalf("got %v", err)
	}
	s := subscribe(e, "t", ptr(0), eventlog.Filter{})
	if got := s.seqs(t, 6); !eq(got, seqRange(5, 10)) {
		t.Fatalf("got %v", got)
	}
	if got := e.appendN("t", 2, eventlog.KindStatus, "d"); !eq(got, []uint64{11, 12}) {
		t.Fatalf("seqs after reopen %v, want 11 12", got)
	}
	if got := s.seqs(t, 2); !eq(got, []uint64{11, 12}) {
		t.Fatalf("live after reopen %v", got)
	}
	s.stop(t)
	snap, err := e.log.Snapshot(context.Background(), "t")
	if err != nil || snap.GetSeq() != 12 || len(snap.GetDocuments()) != 1 {
		t.Fatalf("snapshot %v %v", snap, err)
	}
	if snap, _ := e.log.Snapshot(context.Background(), "other"); len(snap.GetDocuments()) != 0 {
		t.Fatal("another tenant's snapshot must be empty")
	}
}

// TestBackgroundPrunerAndClose: the pruner runs on its own, once per
// PruneInterval and not before, and Close ends subscriptions with
// ErrClosed. The pruner's ticker runs on synctest's fake clock (the store is
// a real SQLite file: no sockets in the bubble).
func TestBackgroundPrunerAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 5 * time.Millisecond
		e := open(t, t.TempDir(), eventlog.Options{PruneInterval: interval, MinAge: time.Nanosecond})
		e.createDoc("t", "d", 1<<16)
		e.appendN("t", 40, eventlog.KindStatus, "d")
		e.clk.Advance(time.Hour)
		oldest := func() uint64 {
			t.Helper()
			w, err := e.log.Window(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return w.GetOldestSeq()
		}
		time.Sleep(interval - time.Nanosecond)
		synctest.Wait()
		if got := oldest(); got != 1 {
			t.Fatalf("oldest seq %d before the first PruneInterval, want 1 (nothing pruned yet)", got)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait() // the pass of the first tick is done
		if got := oldest(); got != 35 {
			t.Fatalf("oldest seq %d one PruneInterval after start, want 35: the pruner did not run", got)
		}
		s := subscribe(e, "t", nil, eventlog.Filter{})
		synctest.Wait()
		if n := e.log.Subscribers(); n != 1 {
			t.Fatalf("%d subscribers, want 1", n)
		}
		e.log.Close()
		if err := <-s.done; !errors.Is(err, eventlog.ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
	})
}

// TestWindowSnapshotBytesFresh: the window's snapshot size follows every
// commit at once, without a retention pass (none runs here) and without
// waiting for any refresh: it is the store's running total, equal to a scan
// of the documents after each one.
func TestWindowSnapshotBytesFresh(t *testing.T) {
	e := open(t, t.TempDir(), eventlog.Options{})
	window := func() uint64 {
		t.Helper()
		w, err := e.log.Window(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return w.GetSnapshotBytes()
	}
	if got := window(); got != 0 {
		t.Fatalf("empty store: snapshotBytes %d", got)
	}
	prev := uint64(0)
	for i, size := range []int{4096, 8192, 10, 1 << 16} {
		e.createDoc("t", fmt.Sprintf("d%d", i), size)
		got := window()
		if got < prev+uint64(size) {
			t.Fatalf("right after creating document %d of %d bytes: snapshotBytes %d, want >= %d", i, size, got, prev+uint64(size))
		}
		if scan := scanDocuments(t, e.dir); got != scan {
			t.Fatalf("after document %d: snapshotBytes %d, a scan of the store sums %d", i, got, scan)
		}
		prev = got
	}
}

// scanDocuments sums the stored bodies of dir's documents and digests.
func scanDocuments(t *testing.T, dir string) uint64 {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "gateway.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n uint64
	if err := db.QueryRow(`SELECT coalesce((SELECT sum(length(body)) FROM documents), 0) +
		coalesce((SELECT sum(length(body)) FROM digests), 0)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReopenLargeLogLoadsRanges: a log with more retained events than half
// the index's buckets is loaded at start in seq ranges (EachEventRange);
// the window is exact, the index stays within its buckets, and pruning
// after the reopen still works (to the ranges' boundaries).
func TestReopenLargeLogLoadsRanges(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir, eventlog.Options{IndexBuckets: 8})
	e.createDoc("t", "d", 1<<16) // a snapshot larger than the log: the size cap does not bind
	e.appendN("t", 40, eventlog.KindStatus, "d")
	e.close()
	e = open(t, dir, eventlog.Options{IndexBuckets: 8})
	w, _ := e.log.Window(context.Background())
	if w.GetOldestSeq() != 1 || w.GetLatestSeq() != 40 || w.GetRetainedEvents() != 40 {
		t.Fatalf("window after reopen %v, want 1..40, 40 events", w)
	}
	if got := e.appendN("t", 2, eventlog.KindStatus, "d"); !eq(got, []uint64{41, 42}) {
		t.Fatalf("seqs after reopen %v", got)
	}
	// Past the floor, no client: keep from 42 - margin 5 = 37, rounded down
	// to its range's start (ranges of 10: 31).
	e.clk.Advance(2 * time.Hour)
	rep, err := e.log.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	w, _ = e.log.Window(context.Background())
	if rep.Removed != 30 || rep.KeepFrom != 31 || w.GetOldestSeq() != 31 || w.GetLatestSeq() != 42 {
		t.Fatalf("prune after reopen: %+v, window %v; want 1..30 removed", rep, w)
	}
	evs, err := e.st.ReadEvents(context.Background(), store.EventQuery{AllTenants: true, Limit: 100})
	if err != nil || len(evs) == 0 || evs[0].Seq != w.GetOldestSeq() || uint64(len(evs)) != w.GetRetainedEvents() {
		t.Fatalf("store holds %d events from %v; window %v", len(evs), evs[0].Seq, w)
	}
}

// TestPruneBacklogInSteps: a pass with a backlog of 20,000 events deletes
// them in write transactions of at most 8,192 events (so the documents'
// commits get the writer in between) and ends where one DELETE would:
// every event below KeepFrom gone, the rest kept.
func TestPruneBacklogInSteps(t *testing.T) {
	e := open(t, t.TempDir(), eventlog.Options{})
	e.createDoc("t", "d", 1<<16)
	for range 20 {
		if _, err := e.log.Append(context.Background(), batch("t", eventlog.KindStatus, "d", e.now(), 1000)); err != nil {
			t.Fatal(err)
		}
	}
	e.clk.Advance(2 * time.Hour) // past the --retain-min floor
	before := e.st.WriterStats().Transactions
	rep, err := e.log.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	txns := e.st.WriterStats().Transactions - before
	if rep.Removed < 19000 || rep.Removed != rep.KeepFrom-1 {
		t.Fatalf("got %+v, want every event below KeepFrom removed (about 20,000)", rep)
	}
	if minTxns := (rep.Removed + 8191) / 8192; txns < minTxns {
		t.Fatalf("%d events removed in %d write transactions, want at least %d (8,192 a step)", rep.Removed, txns, minTxns)
	}
	w, err := e.log.Window(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if w.GetOldestSeq() != rep.KeepFrom || w.GetLatestSeq() != 20000 || w.GetRetainedEvents() != 20000-rep.KeepFrom+1 {
		t.Fatalf("window %v after %+v", w, rep)
	}
}
