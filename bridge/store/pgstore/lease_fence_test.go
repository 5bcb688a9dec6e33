package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// takeOver expires id's lease in the database (its owner paused past it)
// and has b acquire it: b holds it at epoch+1 while the owner still
// believes it holds it. The owner's renewer may extend the lease between
// the two statements (it renews every 300 ms): then both run again.
func takeOver(t *testing.T, dsn string, b *pgstore.Store, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := execSQL(dsn, "UPDATE documents SET lease_expires = clock_timestamp() - interval '1 second' WHERE id = '"+id+"'"); err != nil {
			t.Fatal(err)
		}
		got, err := b.AcquireLeases(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && got[0].Doc.Id == id {
			return
		}
		if len(got) != 0 || time.Now().After(deadline) {
			t.Fatalf("B acquire: %v, want %s", got, id)
		}
	}
}

// slowRenew: a lease whose renewer does not run within a test (renew
// every 20 s, local deadline 25 s after open), so that only the database
// can tell the owner it was deposed: the fenced write itself.
var slowRenew = pgstore.Options{LeaseDuration: 30 * time.Second, RenewInterval: 20 * time.Second, LeaseMargin: 5 * time.Second}

func openSlowRenew(t *testing.T, dsn, id string) *pgstore.Store {
	t.Helper()
	o := slowRenew
	o.ReplicaID = id
	s, err := pgstore.Open(context.Background(), dsn, o)
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wantLeaseLost fails unless err is a LeaseLostError naming exactly id.
func wantLeaseLost(t *testing.T, what string, err error, id string) {
	t.Helper()
	var le *store.LeaseLostError
	if !errors.Is(err, store.ErrLeaseLost) || !errors.As(err, &le) || len(le.DocIDs) != 1 || le.DocIDs[0] != id {
		t.Fatalf("%s: %v, want a LeaseLostError for %s", what, err, id)
	}
}

func count(t *testing.T, dsn, sql string) int64 {
	t.Helper()
	var n int64
	if err := queryRow(dsn, sql, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Close hands the leases back: a document A still holds is released at
// once (owner NULL, expired), so B's next scan takes it without waiting for
// the lease; a document B took over meanwhile is not touched (the release
// is fenced by owner and epoch).
func TestLeaseReleasedAtClose(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	ctx := context.Background()
	create(t, a, "d1")
	create(t, a, "d2")
	takeOver(t, dsn, b, "d2")
	if got, err := b.AcquireLeases(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("B acquired %d documents (err %v) while A holds d1", len(got), err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, dsn, "SELECT count(*) FROM documents WHERE id = 'd1' AND owner IS NULL AND lease_expires <= clock_timestamp() AND lease_epoch = 1"); n != 1 {
		t.Fatalf("d1 after A's Close: not released (owner NULL, expired, epoch 1)")
	}
	if n := count(t, dsn, "SELECT count(*) FROM documents WHERE id = 'd2' AND owner = 'B' AND lease_epoch = 2 AND lease_expires > clock_timestamp()"); n != 1 {
		t.Fatalf("d2 after A's Close: B's lease was touched by A's release")
	}
	got, err := b.AcquireLeases(ctx, 10)
	if err != nil || len(got) != 1 || got[0].Doc.Id != "d1" {
		t.Fatalf("B's scan right after A's Close: %v %v, want d1", got, err)
	}
	if n := count(t, dsn, "SELECT count(*) FROM documents WHERE id = 'd1' AND owner = 'B' AND lease_epoch = 2"); n != 1 {
		t.Fatalf("d1 not held by B at epoch 2 after the scan")
	}
}

// A deposed owner's streamed result payload never becomes visible: its
// Sync checks owner and epoch in the publishing transaction, is refused
// with a LeaseLostError, and leaves no row behind; the new owner's Sync
// publishes.
func TestLeaseFencedPayloadSyncRefused(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := openSlowRenew(t, dsn, "A"), openLease(t, dsn, "B")
	hook := newLostHook(a)
	ctx := context.Background()
	create(t, a, "d1")
	late := bytes.Repeat([]byte("late result of the deposed owner\n"), 20000) // 660 KB: 3 chunks
	w, err := a.CreatePayload(ctx, "d1", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(late); err != nil { // two chunks committed while A holds the lease
		t.Fatal(err)
	}
	takeOver(t, dsn, b, "d1")
	err = w.Sync()
	wantLeaseLost(t, "A's Sync after the takeover", err, "d1")
	if !strings.Contains(err.Error(), "before this payload of epoch 1 was published") {
		t.Fatalf("A's Sync was not refused by the check in its transaction: %v", err)
	}
	if ids, _ := hook.wait(t, 5e9); len(ids) != 1 || ids[0] != "d1" {
		t.Fatalf("hook reported %v, want [d1]", ids)
	}
	if _, err := b.OpenPayload(ctx, "d1", store.PayloadResult); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("result payload after the refused Sync: %v, want ErrNotFound", err)
	}
	if n := count(t, dsn, "SELECT count(*) FROM blobs WHERE doc_id = 'd1'") + count(t, dsn, "SELECT count(*) FROM blob_chunks"); n != 0 {
		t.Fatalf("%d blob rows left by the refused Sync", n)
	}
	// Refused locally from then on, before any byte is published.
	w2, err := a.CreatePayload(ctx, "d1", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w2.Write([]byte("again"))
	wantLeaseLost(t, "A's second Sync", w2.Sync(), "d1")
	// The new owner publishes.
	wb, err := b.CreatePayload(ctx, "d1", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wb.Write([]byte("the new owner's result")); err != nil {
		t.Fatal(err)
	}
	if err := wb.Sync(); err != nil {
		t.Fatalf("the new owner's Sync: %v", err)
	}
	r, err := a.OpenPayload(ctx, "d1", store.PayloadResult)
	if err != nil || r.Size() != int64(len("the new owner's result")) {
		t.Fatalf("visible result: %v, want the new owner's", err)
	}
	r.Close()
}

// childBatch writes only rows that belong to id (an entity, a digest, a
// claim, an inline payload), without id's document update.
func childBatch(id, claimID string) *store.Batch {
	return &store.Batch{
		Entities: []store.EntityRecord{{DocID: id, Attempt: 1, Entity: &gatewayv1.Entity{EntityId: 7, Status: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE}}},
		Digests:  []store.DigestRecord{{DocID: id, Attempt: 1, Digest: &gatewayv1.ScopeDigest{ScopeId: 1}}},
		Claims: []store.ClaimRecord{{Tenant: "acme", Claim: &gatewayv1.ClaimCheck{ClaimId: claimID, DocumentId: id,
			State: gatewayv1.ClaimCheck_ISSUED, ExpireTime: timestamppb.New(t0.AddDate(1, 0, 0))}}},
		Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadResult, Body: []byte("inline")}},
	}
}

// A batch carrying only entity, digest, claim or inline payload rows of a
// held document (no document update) is fenced too: while A holds the
// lease it commits as one pipeline; after a takeover A's late batch is
// refused with a LeaseLostError and writes none of its rows; the new
// owner's batch commits.
func TestLeaseFencedChildRowsRefused(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := openSlowRenew(t, dsn, "A"), openLease(t, dsn, "B")
	ctx := context.Background()
	create(t, a, "d1")
	before := a.WriterStats()
	if _, err := a.Commit(ctx, childBatch("d1", "1001")); err != nil {
		t.Fatalf("A's child rows while it holds the lease: %v", err)
	}
	if st := a.WriterStats(); st.Retries != before.Retries {
		t.Fatalf("the fenced child-only batch left the pipeline (%d retries)", st.Retries-before.Retries)
	}
	takeOver(t, dsn, b, "d1")
	rows := func() int64 {
		return count(t, dsn, `SELECT (SELECT count(*) FROM entities WHERE doc_id = 'd1') + (SELECT count(*) FROM digests WHERE doc_id = 'd1')
			+ (SELECT count(*) FROM claims WHERE doc_id = 'd1') + (SELECT count(*) FROM payloads WHERE doc_id = 'd1')`)
	}
	was := rows()
	late := childBatch("d1", "1002")
	late.Entities[0].Entity.EntityId = 8
	late.Digests[0].Digest.ScopeId = 2
	late.Payloads[0].Body = []byte("late")
	_, err := a.Commit(ctx, late)
	wantLeaseLost(t, "A's late child-only batch", err, "d1")
	if !strings.Contains(err.Error(), "before this write of its rows") {
		t.Fatalf("A's batch was not refused by the check in its transaction: %v", err)
	}
	if got := rows(); got != was {
		t.Fatalf("the refused batch changed the rows of d1: %d, was %d", got, was)
	}
	if n := count(t, dsn, "SELECT count(*) FROM payloads WHERE doc_id = 'd1' AND body = 'late'::bytea"); n != 0 {
		t.Fatalf("the refused batch replaced the inline payload")
	}
	_, err = a.Commit(ctx, childBatch("d1", "1003"))
	wantLeaseLost(t, "A's second late batch", err, "d1")
	if _, err := b.Commit(ctx, childBatch("d1", "1004")); err != nil {
		t.Fatalf("the new owner's child rows: %v", err)
	}
}
