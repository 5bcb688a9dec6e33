package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestDocumentContract: create, read by tenant only, conditional update,
// children of the highest attempt, paging, snapshot — the SQLite store's
// rules, until the storetest conformance suite runs here too.
func TestDocumentContract(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	for i := range 5 {
		d := doc(fmt.Sprintf("d%d", i), "")
		d.Doc.CreateTime = timestamppb.New(t0.Add(time.Duration(i) * time.Second))
		if _, err := s.Commit(ctx, &store.Batch{Create: d, Events: []store.EventAppend{event(d.Doc.Id, "created")}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.GetDocument(ctx, "other", "d1", false); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's document: %v, want ErrNotFound", err)
	}
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("d1", "")}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("reused id: %v, want ErrConflict", err)
	}
	up := doc("d1", "")
	up.Doc.Rev, up.Doc.State = 2, gatewayv1.State_RUNNING
	ents := []store.EntityRecord{
		{DocID: "d1", Attempt: 1, Entity: &gatewayv1.Entity{EntityId: 1, ScopeId: 0, ChunkOffset: 1 << 40}},
		{DocID: "d1", Attempt: 2, Entity: &gatewayv1.Entity{EntityId: 7, ScopeId: 3, Checksum: "c"}},
	}
	if _, err := s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: 1}}, Entities: ents}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: 1}}}); !errors.Is(err, store.ErrStaleRev) {
		t.Fatalf("stale update: %v, want ErrStaleRev", err)
	}
	got, err := s.GetDocument(ctx, "acme", "d1", true)
	if err != nil {
		t.Fatal(err)
	}
	if got.Doc.GetState() != gatewayv1.State_RUNNING || len(got.Doc.Entities) != 1 || got.Doc.Entities[0].GetEntityId() != 7 {
		t.Fatalf("after update: state %v, entities %v (want RUNNING and only attempt 2's entity 7)", got.Doc.GetState(), got.Doc.Entities)
	}
	if _, err := s.Commit(ctx, &store.Batch{Entities: []store.EntityRecord{{DocID: "nope", Entity: &gatewayv1.Entity{EntityId: 1}}}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("entity of a missing document: %v, want ErrNotFound", err)
	}
	var ids []string
	tok := ""
	for {
		page, next, err := s.ListDocuments(ctx, "acme", store.ListQuery{PageSize: 2, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page {
			ids = append(ids, d.Doc.GetId())
		}
		if next == "" {
			break
		}
		tok = next
	}
	if fmt.Sprint(ids) != "[d4 d3 d2 d1 d0]" {
		t.Fatalf("pages: %v, want newest first", ids)
	}
	if _, _, err := s.ListDocuments(ctx, "acme", store.ListQuery{PageToken: "garbage!"}); !errors.Is(err, store.ErrBadPageToken) {
		t.Fatalf("bad token: %v", err)
	}
	seq, docs, err := s.SnapshotDocuments(ctx, "acme")
	if err != nil || seq != 5 || len(docs) != 5 {
		t.Fatalf("snapshot: seq %d, %d docs, %v; want 5, 5", seq, len(docs), err)
	}
}

// TestRetentionAndSeqRules: pruning keeps the counter (seqs never repeat),
// the stats stay exact, filters work, and a reopened store continues.
func TestRetentionAndSeqRules(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	ctx := context.Background()
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("d", "")}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		kind := "a"
		if i%2 == 1 {
			kind = "b"
		}
		if _, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", kind)}}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.ReadEvents(ctx, store.EventQuery{Tenant: "acme", Kinds: []string{"b"}})
	if err != nil || len(evs) != 5 || evs[0].Seq != 2 {
		t.Fatalf("kind filter: %d events, %v", len(evs), err)
	}
	if e, err := evs[0].Decode(); err != nil || e.GetSeq() != 2 {
		t.Fatalf("stored body carries seq %d (%v), want 2", e.GetSeq(), err)
	}
	pr, err := s.PruneEvents(ctx, 11)
	if err != nil || pr.Removed != 10 {
		t.Fatalf("prune: %+v, %v", pr, err)
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.Count != 0 || st.Bytes != 0 || st.LatestSeq != 10 || st.OldestSeq != 0 {
		t.Fatalf("stats after pruning everything: %+v, %v", st, err)
	}
	s2, err := pgstore.Open(ctx, dsn, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.LastSeq() != 10 {
		t.Fatalf("reopened LastSeq %d, want 10", s2.LastSeq())
	}
	res, err := s2.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "a"), event("d", "a")}})
	if err != nil || fmt.Sprint(res.Seqs) != "[11 12]" {
		t.Fatalf("after prune and reopen: seqs %v, %v; want [11 12]", res.Seqs, err)
	}
	if _, err := s2.Commit(ctx, &store.Batch{Events: []store.EventAppend{{Tenant: "acme", Event: &gatewayv1.Event{}}}}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("event without kind: %v, want ErrInvalid", err)
	}
	s2.Close()
	if _, err := s2.ReadEvents(ctx, store.EventQuery{AllTenants: true}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
	if _, err := s2.Commit(ctx, &store.Batch{}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("commit after Close: %v, want ErrClosed", err)
	}
}

// TestBadURL: a malformed --store URL is refused with a message naming the
// expected form; an unreachable server is an error, not a hang.
func TestBadURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pgstore.Open(ctx, "postgres://%zz", pgstore.Options{}); !errors.Is(err, store.ErrInvalid) || !contains(err.Error(), "postgres://user:password@host:port/database") {
		t.Fatalf("malformed URL: %v", err)
	}
	if _, err := pgstore.Open(ctx, "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=5", pgstore.Options{}); err == nil {
		t.Fatal("open of an unreachable server succeeded")
	}
}

// TestSeqFieldAcrossVarintWidths: the seq field the database appends to
// stored bodies (pipestream_seq_field) is byte-identical to the one the
// Store hands the hook, across varint width boundaries (127/128,
// 16383/16384), and event_bytes counts exactly the stored bytes.
func TestSeqFieldAcrossVarintWidths(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	ctx := context.Background()
	var hooked []store.EventRecord
	s.SetEventHook(func(evs []store.EventRecord) { hooked = append(hooked, evs...) })
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("d", "")}); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, start := range []int64{125, 16381} {
		if _, err := c.Exec(ctx, "UPDATE meta SET last_seq = $1", start); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "a"), event("d", "b"), event("d", "c"), event("d", "d")}}); err != nil {
			t.Fatal(err)
		}
	}
	stored, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 8 || len(hooked) != 8 {
		t.Fatalf("%d stored, %d hooked events, want 8", len(stored), len(hooked))
	}
	var total uint64
	for i, e := range stored {
		if !bytes.Equal(e.Body, hooked[i].Body) || e.Seq != hooked[i].Seq {
			t.Fatalf("seq %d: stored body %x, hooked %x (seq %d)", e.Seq, e.Body, hooked[i].Body, hooked[i].Seq)
		}
		ev, err := e.Decode()
		if err != nil || ev.GetSeq() != e.Seq {
			t.Fatalf("stored body of seq %d decodes to seq %d (%v)", e.Seq, ev.GetSeq(), err)
		}
		total += uint64(len(e.Body))
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.Bytes != total || st.Count != 8 {
		t.Fatalf("stats %+v (%v), want %d bytes, 8 events", st, err, total)
	}
}

// TestPoolSize: Options.MaxConns, else the URL's pool_max_conns, else 16.
func TestPoolSize(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	for _, c := range []struct {
		url  string
		opt  int32
		want int32
	}{{dsn, 0, 16}, {dsn + "&pool_max_conns=3", 0, 3}, {dsn + "&pool_max_conns=3", 5, 5}} {
		s, err := pgstore.Open(ctx, c.url, pgstore.Options{MaxConns: c.opt})
		if err != nil {
			t.Fatal(err)
		}
		got := s.MaxConns()
		s.Close()
		if got != c.want {
			t.Errorf("%s with MaxConns %d: pool of %d, want %d", c.url, c.opt, got, c.want)
		}
	}
}
