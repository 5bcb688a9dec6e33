package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func userVersion(t *testing.T, dir string) int {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMigrationsFromEmptyAndReopen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, sqlite.Options{})
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base)})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := userVersion(t, dir); got != sqlite.SchemaVersion() || got < 1 {
		t.Fatalf("user_version = %d, want %d", got, sqlite.SchemaVersion())
	}
	s = openStore(t, dir, sqlite.Options{})
	if _, err := s.GetDocument(context.Background(), "t", "d1", false); err != nil {
		t.Fatalf("document lost across reopen: %v", err)
	}
	s.Close()

	// A database from a newer binary is refused, not clobbered.
	db, err := sql.Open("sqlite", filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", sqlite.SchemaVersion()+1)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := sqlite.Open(context.Background(), dir, sqlite.Options{}); err == nil {
		s.Close()
		t.Fatal("Open accepted a database with a newer schema version")
	}
}

func TestOptionsValidated(t *testing.T) {
	if _, err := sqlite.Open(context.Background(), t.TempDir(), sqlite.Options{Synchronous: "OFF"}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Synchronous=OFF: err = %v, want ErrInvalid", err)
	}
}

func TestDocumentRoundTrip(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
	ctx := context.Background()
	rec := newDoc("t", "d1", base)
	rec.Doc.Metadata = map[string]string{"k": "v"}
	rec.Doc.Entities = []*gatewayv1.Entity{{EntityId: 99}} // not stored in the row
	rec.Private = []byte{1, 2, 3}
	rec.DispatchAttempts = 2
	mustCommit(t, s, &store.Batch{
		Create: rec,
		Entities: []store.EntityRecord{
			{DocID: "d1", Entity: &gatewayv1.Entity{EntityId: 2, ParentId: 1, ScopeId: 0, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING, ChunkOffset: 1 << 40, SizeBytes: 10, Checksum: "abc"}},
			{DocID: "d1", Entity: &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_DEHYDRATING}},
		},
		Digests: []store.DigestRecord{{DocID: "d1", Digest: &gatewayv1.ScopeDigest{ScopeId: 0, MerkleRoot: "ff", Verified: true}}},
		Claims: []store.ClaimRecord{{Tenant: "t", Claim: &gatewayv1.ClaimCheck{ClaimId: "123", DocumentId: "d1", EntityId: 2,
			State: gatewayv1.ClaimCheck_ISSUED, ExpireTime: timestamppb.New(base.Add(time.Hour)), CreateTime: timestamppb.New(base)}}},
	})
	// Upsert an entity.
	mustCommit(t, s, &store.Batch{Entities: []store.EntityRecord{{DocID: "d1", Entity: &gatewayv1.Entity{EntityId: 2, ParentId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE, Attempts: 1}}}})

	got, err := s.GetDocument(ctx, "t", "d1", true)
	if err != nil {
		t.Fatal(err)
	}
	if got.Doc.GetMetadata()["k"] != "v" || string(got.Private) != "\x01\x02\x03" || got.DispatchAttempts != 2 || got.ContentPayload != rec.ContentPayload {
		t.Fatalf("record fields lost: %+v", got)
	}
	if len(got.Doc.Entities) != 2 || got.Doc.Entities[0].GetEntityId() != 1 || got.Doc.Entities[1].GetStatus() != gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE || got.Doc.Entities[1].GetAttempts() != 1 {
		t.Fatalf("entities = %v", got.Doc.Entities)
	}
	if len(got.Doc.Digests) != 1 || got.Doc.Digests[0].GetMerkleRoot() != "ff" {
		t.Fatalf("digests = %v", got.Doc.Digests)
	}
	if len(got.Doc.ClaimChecks) != 1 || got.Doc.ClaimChecks[0].GetClaimId() != "123" || !got.Doc.ClaimChecks[0].GetExpireTime().AsTime().Equal(base.Add(time.Hour)) {
		t.Fatalf("claims = %v", got.Doc.ClaimChecks)
	}
	noEnt, err := s.GetDocument(ctx, "t", "d1", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(noEnt.Doc.Entities) != 0 {
		t.Fatalf("entities filled without withEntities: %v", noEnt.Doc.Entities)
	}
}

func TestSnapshotConsistentWithSeq(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
	ctx := context.Background()
	for i := range 5 {
		id := fmt.Sprintf("d%d", i)
		mustCommit(t, s, &store.Batch{Create: newDoc("t", id, base.Add(time.Duration(i))),
			Digests: []store.DigestRecord{{DocID: id, Digest: &gatewayv1.ScopeDigest{ScopeId: 1}}},
			Events:  []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}}})
	}
	seq, docs, err := s.SnapshotDocuments(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if seq != 5 || len(docs) != 5 || len(docs[4].Doc.GetDigests()) != 1 {
		t.Fatalf("snapshot seq %d with %d docs, want 5 and 5", seq, len(docs))
	}
	n, err := s.SnapshotBytes(ctx)
	if err != nil || n <= 0 {
		t.Fatalf("SnapshotBytes = %d, %v", n, err)
	}
}

// TestCloseFlushesAndRefuses: Close commits every batch already queued
// behind the group delay (each is acknowledged and survives a reopen) and
// refuses commits after it. The group delay runs on synctest's fake clock,
// so "queued" is certain rather than hoped for after a sleep.
func TestCloseFlushesAndRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 20
		dir := t.TempDir()
		s := openStore(t, dir, sqlite.Options{MaxGroupDelay: 50 * time.Millisecond})
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = s.Commit(context.Background(), &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "", 1)}}})
			})
		}
		synctest.Wait() // every commit is queued; the writer waits out the group delay
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("commit %d queued before Close: %v, want it flushed by Close", i, err)
			}
		}
		if _, err := s.Commit(context.Background(), &store.Batch{}); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Commit after Close: %v, want ErrClosed", err)
		}
		s2 := openStore(t, dir, sqlite.Options{})
		if got := s2.LastSeq(); got != n {
			t.Fatalf("after reopen last seq %d, want %d acknowledged events", got, n)
		}
	})
}

func TestEventBodyCarriesSeq(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
	ev := newEvent("#status", "d1", 3)
	ev.Seq = 999 // ignored
	res := mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: ev}}})
	recs, err := s.ReadEvents(context.Background(), store.EventQuery{Tenant: "t"})
	if err != nil || len(recs) != 1 {
		t.Fatalf("ReadEvents = %v, %v", recs, err)
	}
	got, err := recs[0].Decode()
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(ev).(*gatewayv1.Event)
	want.Seq = res.Seqs[0]
	if !proto.Equal(got, want) || recs[0].Seq != 1 || recs[0].Rev != 3 || recs[0].Since != 2 || !recs[0].Time.Equal(base) {
		t.Fatalf("decoded %v (record %+v), want %v", got, recs[0], want)
	}
	if ev.Seq != 999 {
		t.Fatal("Commit modified the caller's event")
	}
	if _, err := s.Commit(context.Background(), &store.Batch{Events: []store.EventAppend{{Event: &gatewayv1.Event{Kind: "#info"}}}}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("event without time: %v, want ErrInvalid", err)
	}
}

func TestReadEventsFilters(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
	ctx := context.Background()
	// seq: 1 a/d1 #document, 2 b/d2 #document, 3 a/d1 #status, 4 a/d3 #status, 5 b/d2 #claim
	for _, e := range []struct{ tenant, doc, kind string }{
		{"a", "d1", "#document"}, {"b", "d2", "#document"}, {"a", "d1", "#status"}, {"a", "d3", "#status"}, {"b", "d2", "#claim"},
	} {
		mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: e.tenant, Event: newEvent(e.kind, e.doc, 1)}}})
	}
	seqs := func(q store.EventQuery) []uint64 {
		t.Helper()
		recs, err := s.ReadEvents(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, r := range recs {
			out = append(out, r.Seq)
		}
		return out
	}
	for _, c := range []struct {
		name string
		q    store.EventQuery
		want []uint64
	}{
		{"tenant a", store.EventQuery{Tenant: "a"}, []uint64{1, 3, 4}},
		{"all tenants", store.EventQuery{AllTenants: true}, []uint64{1, 2, 3, 4, 5}},
		{"from inclusive", store.EventQuery{AllTenants: true, From: 3}, []uint64{3, 4, 5}},
		{"limit", store.EventQuery{AllTenants: true, From: 2, Limit: 2}, []uint64{2, 3}},
		{"doc", store.EventQuery{Tenant: "a", DocID: "d1"}, []uint64{1, 3}},
		{"doc of other tenant", store.EventQuery{Tenant: "a", DocID: "d2"}, nil},
		{"kinds", store.EventQuery{AllTenants: true, Kinds: []string{"#status", "#claim"}}, []uint64{3, 4, 5}},
		{"beyond latest", store.EventQuery{AllTenants: true, From: 6}, nil},
	} {
		if got := seqs(c.q); !slices.Equal(got, c.want) {
			t.Errorf("%s: seqs %v, want %v", c.name, got, c.want)
		}
	}
}
