package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestReplicasShareOneGaplessSequence: two Stores on one database (two
// replicas), each with concurrent writers. Seqs never repeat, and a hook on
// either replica sees every event of both in seq order, without a gap or a
// duplicate.
func TestReplicasShareOneGaplessSequence(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	ra, rb := newRecorder(), newRecorder()
	a.SetEventHook(ra.hook)
	b.SetEventHook(rb.hook)
	const writers, perWriter, perBatch = 4, 25, 2
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[uint64]bool{}
		errs []error
	)
	for w := range writers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				id := fmt.Sprintf("d%d-%d", w, i)
				res, err := s.Commit(ctx, &store.Batch{Create: doc(id, ""), Events: []store.EventAppend{event(id, "created"), event(id, "pending")}})
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, q := range res.Seqs {
					if seen[q] {
						errs = append(errs, fmt.Errorf("seq %d assigned twice", q))
					}
					seen[q] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("commits: %v", errs)
	}
	total := writers * perWriter * perBatch
	gapless(t, ra.waitFor(t, total), 1)
	gapless(t, rb.waitFor(t, total), 1)
	if a.LastSeq() != uint64(total) || b.LastSeq() != uint64(total) {
		t.Fatalf("LastSeq %d / %d, want %d", a.LastSeq(), b.LastSeq(), total)
	}
}

// TestEventsOfAnotherProcessWakeTheHook: an event committed by another
// connection that is not a Store at all (as another process would) reaches
// the hook through NOTIFY, without any Commit on this Store.
func TestEventsOfAnotherProcessWakeTheHook(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a := open(t, dsn)
	ra := newRecorder()
	a.SetEventHook(ra.hook)
	b := open(t, dsn) // the "other process": its own pool and listener
	if _, err := b.Commit(context.Background(), &store.Batch{Create: doc("x", ""), Events: []store.EventAppend{event("x", "created")}}); err != nil {
		t.Fatal(err)
	}
	gapless(t, ra.waitFor(t, 1), 1)
	if a.LastSeq() != 1 {
		t.Fatalf("LastSeq %d, want 1", a.LastSeq())
	}
}

// TestLateCommitOfAnEarlierSeqIsNotLost is the commit-order problem: a
// transaction that took a seq and has not committed yet must not be
// overtaken by a later one. The test holds the counter row in an open
// transaction (what a slow replica between its seq UPDATE and its COMMIT
// looks like), shows that a Store's Commit waits for it, and that the hook
// then sees the held seq before the later one.
func TestLateCommitOfAnEarlierSeqIsNotLost(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	rec := newRecorder()
	s.SetEventHook(rec.hook)
	ctx := context.Background()
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("d", "")}); err != nil {
		t.Fatal(err)
	}
	slow, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close(ctx)
	tx, err := slow.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	if err := tx.QueryRow(ctx, "UPDATE meta SET last_seq = last_seq + 1, event_count = event_count + 1 WHERE id = 1 RETURNING last_seq").Scan(&held); err != nil {
		t.Fatal(err)
	}
	// One event with an empty body (its seq field is appended on read).
	if _, err := tx.Exec(ctx, `INSERT INTO event_blocks VALUES ($1, $1, '{1}', '{slow}', '{acme}', '{d}', '{0}', '{0}', '{0}', ARRAY['\x'::bytea])`, held); err != nil {
		t.Fatal(err)
	}
	done := make(chan store.CommitResult, 1)
	go func() {
		res, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "fast")}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitForLockWait(t, dsn)
	select {
	case <-done:
		t.Fatal("a later commit took a seq while an earlier seq was uncommitted")
	default:
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify('pipestream_events', $1)", fmt.Sprint(held)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if len(res.Seqs) != 1 || res.Seqs[0] != uint64(held)+1 {
		t.Fatalf("later commit got seqs %v, want [%d]", res.Seqs, held+1)
	}
	gapless(t, rec.waitFor(t, 2), uint64(held))
}

// waitForLockWait polls pg_locks (with a deadline) until a backend waits on
// a lock.
func waitForLockWait(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no backend waited on the counter row within 30s")
		}
		time.Sleep(10 * time.Millisecond) // polling pg_locks with a deadline, not synchronisation by sleep
	}
}

// TestConcurrentMigration: replicas starting at once on an empty database
// all open (the advisory lock serialises the migration) and share one
// schema.
func TestConcurrentMigration(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, n)
	stores := make(chan *pgstore.Store, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{MaxConns: 2})
			if err != nil {
				errs <- err
				return
			}
			stores <- s
		}()
	}
	wg.Wait()
	close(errs)
	close(stores)
	var opened []*pgstore.Store
	for s := range stores {
		opened = append(opened, s)
	}
	defer func() {
		for _, s := range opened {
			s.Close()
		}
	}()
	for err := range errs {
		t.Errorf("concurrent open: %v", err)
	}
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var v, rows int
	if err := c.QueryRow(context.Background(), "SELECT max(version), count(*) FROM schema_version").Scan(&v, &rows); err != nil {
		t.Fatal(err)
	}
	if v != pgstore.SchemaVersion() || rows != 1 {
		t.Fatalf("schema_version %d (%d rows), want %d (1 row)", v, rows, pgstore.SchemaVersion())
	}
}

// TestNewerSchemaRefused: a database migrated by a newer binary is refused
// with a message that says to upgrade.
func TestNewerSchemaRefused(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	_ = s
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), "UPDATE schema_version SET version = version + 1"); err != nil {
		t.Fatal(err)
	}
	_, err = pgstore.Open(context.Background(), dsn, pgstore.Options{})
	if err == nil || !containsAll(err.Error(), "newer", "upgrade") {
		t.Fatalf("open of a newer schema: %v; want a refusal naming the upgrade", err)
	}
}

// TestClaimRedeemedOnceAcrossReplicas: 30 concurrent redemptions of one
// claim over two replicas: exactly one succeeds, the others answer
// ErrClaimRedeemed.
func TestClaimRedeemedOnceAcrossReplicas(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	claim := &gatewayv1.ClaimCheck{ClaimId: "77", DocumentId: "d", State: gatewayv1.ClaimCheck_ISSUED,
		ExpireTime: timestamppb.New(time.Now().Add(time.Hour)), CreateTime: timestamppb.New(t0)}
	if _, err := a.Commit(ctx, &store.Batch{Create: doc("d", ""), Claims: []store.ClaimRecord{{Tenant: "acme", Claim: claim}}}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	var wg sync.WaitGroup
	results := make(chan error, n)
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Commit(ctx, &store.Batch{Redeem: &store.RedeemClaim{Tenant: "acme", ClaimID: "77", Now: time.Now()},
				Events: []store.EventAppend{event("d", "redeemed")}})
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	ok := 0
	for err := range results {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, store.ErrClaimRedeemed):
			t.Errorf("redemption failed with %v, want ErrClaimRedeemed", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d redemptions succeeded, want exactly 1", ok)
	}
	if st, err := a.EventStats(ctx); err != nil || st.Count != 1 {
		t.Fatalf("events after the redemptions: %+v, %v; want exactly one (the failed batches applied nothing)", st, err)
	}
}

// TestIdempotentCreateAcrossReplicas: the same request id submitted at
// once through two replicas creates one document; every other attempt gets
// it back as Duplicate; a different body under that request id conflicts.
func TestIdempotentCreateAcrossReplicas(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	const n = 20
	var wg sync.WaitGroup
	type out struct {
		res store.CommitResult
		err error
	}
	outs := make(chan out, n)
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := doc(fmt.Sprintf("doc%d", i), "req-1")
			d.BodyHash = []byte("same")
			res, err := s.Commit(ctx, &store.Batch{Create: d, Events: []store.EventAppend{event(d.Doc.Id, "created")}})
			outs <- out{res, err}
		}()
	}
	wg.Wait()
	close(outs)
	created, dups := 0, map[string]int{}
	for o := range outs {
		switch {
		case o.err != nil:
			t.Errorf("create: %v", o.err)
		case o.res.Duplicate != nil:
			dups[o.res.Duplicate.Doc.GetId()]++
		default:
			created++
		}
	}
	if created != 1 || len(dups) != 1 {
		t.Fatalf("created %d, duplicates of %v; want 1 created and every other one a duplicate of it", created, dups)
	}
	other := doc("docX", "req-1")
	other.BodyHash = []byte("different")
	if _, err := b.Commit(ctx, &store.Batch{Create: other}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("different body under the same request id: %v, want ErrConflict", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !contains(s, x) {
			return false
		}
	}
	return true
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestListenerReconnectsAndCatchesUp: the LISTEN connection is killed
// (pg_terminate_backend: a database restart or a network cut looks the
// same to it); events committed by another replica meanwhile still reach
// the hook, in order, after the store reconnects.
func TestListenerReconnectsAndCatchesUp(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a := open(t, dsn)
	rec := newRecorder()
	a.SetEventHook(rec.hook)
	b := open(t, dsn)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var killed int
	if err := c.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 2 {
		t.Fatalf("terminated %d LISTEN connections, want 2 (one per store)", killed)
	}
	if _, err := b.Commit(ctx, &store.Batch{Create: doc("x", ""), Events: []store.EventAppend{event("x", "created"), event("x", "more")}}); err != nil {
		t.Fatal(err)
	}
	gapless(t, rec.waitFor(t, 2), 1)
	if _, err := b.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("x", "after")}}); err != nil {
		t.Fatal(err)
	}
	gapless(t, rec.waitFor(t, 3), 1)
}

// TestHookAfterLastSeqMissesNothing: the event log's pattern — read
// LastSeq, then install the hook. Events delivered in between (here our own
// commit, with no hook yet; in production another replica's at any time)
// reach the new hook, once, in order; older ones do not.
func TestHookAfterLastSeqMissesNothing(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	ctx := context.Background()
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("d", ""), Events: []store.EventAppend{event("d", "old")}}); err != nil {
		t.Fatal(err)
	}
	base := s.LastSeq()
	if _, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "between1"), event("d", "between2")}}); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	s.SetEventHook(rec.hook)
	if _, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "after")}}); err != nil {
		t.Fatal(err)
	}
	got := rec.waitFor(t, 3)
	gapless(t, got, base+1)
	if len(got) != 3 {
		t.Fatalf("hook got %v, want seqs %d..%d", got, base+1, base+3)
	}
}
