package sqlite

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

var groupBase = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func groupDoc(tenant, id string, rev uint64) *store.DocumentRecord {
	return &store.DocumentRecord{Tenant: tenant, Doc: &gatewayv1.Document{
		Id: id, State: gatewayv1.State_PENDING, Rev: rev,
		CreateTime: timestamppb.New(groupBase), UpdateTime: timestamppb.New(groupBase),
	}}
}

func groupEvent(doc string, rev uint64) store.EventAppend {
	return store.EventAppend{Tenant: "t", Event: &gatewayv1.Event{Time: timestamppb.New(groupBase), Kind: "#status", DocumentId: doc, Rev: rev}}
}

// runOneGroup hands the batches to the writer in this order so that they
// form exactly one group (Options.MaxGroupBatches == len(reqs)), and waits.
func runOneGroup(t *testing.T, s *Store, reqs ...*request) {
	t.Helper()
	for _, r := range reqs {
		s.queue <- r
	}
	for _, r := range reqs {
		<-r.done
	}
}

func mustPrepare(t *testing.T, b *store.Batch) *request {
	t.Helper()
	r, err := prepare(b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestGroupWithFailingBatches: a group whose batches fail between good ones
// (a claim conflict after the batch inserted a document and an entity, a
// create reusing an id created earlier in the same group) is rolled back
// and rerun with savepoints: the good batches commit with contiguous seqs
// and exact event bodies, the failed ones leave nothing, the meta counters
// match the stored events, and a prune in the group sees the events of the
// batches before it. A group without failures is not rerun.
func TestGroupWithFailingBatches(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	owned := seedGroupStore(t, dir)

	s, err := Open(ctx, dir, Options{MaxGroupBatches: 5, MaxGroupDelay: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := s.WriterStats()
	steal := proto.CloneOf(owned)
	steal.DocumentId = "b"
	upd := groupDoc("t", "d", 2)
	good1 := mustPrepare(t, &store.Batch{Create: groupDoc("t", "a", 1), Events: []store.EventAppend{groupEvent("a", 1), groupEvent("a", 2)},
		Payloads: []store.PayloadRecord{{DocID: "a", Kind: store.PayloadContent, Body: []byte("content")}}})
	bad1 := mustPrepare(t, &store.Batch{Create: groupDoc("t", "b", 1), Events: []store.EventAppend{groupEvent("b", 1)},
		Entities: []store.EntityRecord{{DocID: "b", Entity: &gatewayv1.Entity{EntityId: 1}}},
		Claims:   []store.ClaimRecord{{Tenant: "t", Claim: steal}}})
	good2 := mustPrepare(t, &store.Batch{Updates: []store.DocumentUpdate{{Record: upd, PrevRev: 1}}, Events: []store.EventAppend{groupEvent("d", 2)}})
	bad2 := mustPrepare(t, &store.Batch{Create: groupDoc("t", "a", 1), Events: []store.EventAppend{groupEvent("a", 1)}})
	prune := &request{prune: true, before: 3, done: make(chan struct{})}
	runOneGroup(t, s, good1, bad1, good2, bad2, prune)

	checkFailingGroupResults(t, s, before, good1, bad1, good2, bad2, prune)
	checkFailingGroupStored(t, s)
	checkFailingGroupEvents(t, s, map[uint64]*gatewayv1.Event{3: good1.b.Events[1].Event, 4: good2.b.Events[0].Event})
	checkCleanGroup(t, s)
	s.Close()
	checkGroupCountersDurable(t, dir)
}

// seedGroupStore commits document d (tenant t) and du (tenant u, one event,
// owning claim 7) and returns that claim.
func seedGroupStore(t *testing.T, dir string) *gatewayv1.ClaimCheck {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	owned := &gatewayv1.ClaimCheck{ClaimId: "7", DocumentId: "d", ExpireTime: timestamppb.New(groupBase.Add(time.Hour))}
	if _, err := s.Commit(ctx, &store.Batch{Create: groupDoc("t", "d", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, &store.Batch{Create: groupDoc("u", "du", 1), Events: []store.EventAppend{groupEvent("du", 1)},
		Claims: []store.ClaimRecord{{Tenant: "u", Claim: proto.CloneOf(owned)}}}); err != nil {
		t.Fatal(err)
	}
	return owned
}

// checkFailingGroupResults: the group ran once and was retried once; the
// good batches and the prune succeeded with contiguous seqs, the failing
// ones got ErrConflict and no seqs.
func checkFailingGroupResults(t *testing.T, s *Store, before store.WriterStats, good1, bad1, good2, bad2, prune *request) {
	t.Helper()
	ws := s.WriterStats()
	if ws.Transactions-before.Transactions != 1 || ws.Retries-before.Retries != 1 {
		t.Fatalf("one group: %d transactions, %d retries; want 1 and 1", ws.Transactions-before.Transactions, ws.Retries-before.Retries)
	}
	if good1.err != nil || good2.err != nil || prune.err != nil {
		t.Fatalf("good batches failed: %v, %v, prune %v", good1.err, good2.err, prune.err)
	}
	if !errors.Is(bad1.err, store.ErrConflict) || !errors.Is(bad2.err, store.ErrConflict) {
		t.Fatalf("failing batches: %v, %v; want ErrConflict (claim of another tenant, reused document id)", bad1.err, bad2.err)
	}
	if bad1.res.Seqs != nil || bad2.res.Seqs != nil {
		t.Fatalf("failed batches report seqs %v %v", bad1.res.Seqs, bad2.res.Seqs)
	}
	// Seq 1 was du's event; the group's good events are 2, 3 and 4.
	if len(good1.res.Seqs) != 2 || good1.res.Seqs[0] != 2 || good1.res.Seqs[1] != 3 || len(good2.res.Seqs) != 1 || good2.res.Seqs[0] != 4 {
		t.Fatalf("seqs %v %v, want [2 3] [4]", good1.res.Seqs, good2.res.Seqs)
	}
	if prune.pres.Removed != 2 {
		t.Fatalf("prune before 3 removed %d events, want 2 (seq 1 and the group's seq 2)", prune.pres.Removed)
	}
}

// checkFailingGroupStored: the failed batch's document is absent, the good
// batches' update and payload are stored.
func checkFailingGroupStored(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.GetDocument(ctx, "t", "b", true); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("document of the failed batch: %v, want ErrNotFound", err)
	}
	if got, err := s.GetDocument(ctx, "t", "d", false); err != nil || got.Doc.GetRev() != 2 {
		t.Fatalf("updated document: %v, %v; want rev 2", got, err)
	}
	if p, err := s.GetPayload(ctx, "t", "a", store.PayloadContent); err != nil || string(p) != "content" {
		t.Fatalf("payload of a good batch: %q, %v", p, err)
	}
}

// checkFailingGroupEvents: the stored events are exactly want, each body
// the event with one seq field appended, and EventStats matches them.
func checkFailingGroupEvents(t *testing.T, s *Store, want map[uint64]*gatewayv1.Event) {
	t.Helper()
	ctx := context.Background()
	evs, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, e := range evs {
		ev, ok := want[e.Seq]
		if !ok {
			t.Fatalf("unexpected event seq %d", e.Seq)
		}
		body, _ := proto.Marshal(ev)
		body = protowire.AppendVarint(protowire.AppendTag(body, eventFieldSeq, protowire.VarintType), e.Seq)
		if !bytes.Equal(e.Body, body) {
			t.Fatalf("event %d body %x, want the event with one seq field appended %x", e.Seq, e.Body, body)
		}
		sum += uint64(len(e.Body))
		delete(want, e.Seq)
	}
	if len(want) != 0 {
		t.Fatalf("events missing: %v", want)
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.Count != 2 || st.Bytes != sum || st.OldestSeq != 3 || st.LatestSeq != 4 || s.LastSeq() != 4 {
		t.Fatalf("EventStats %+v, %v, LastSeq %d; want count 2, %d bytes, seqs 3..4", st, err, s.LastSeq(), sum)
	}
}

// checkCleanGroup: a group without failures runs once, without savepoints;
// its prune sees the events queued before it (seqs 3 to 6).
func checkCleanGroup(t *testing.T, s *Store) {
	t.Helper()
	before := s.WriterStats()
	reqs := []*request{
		mustPrepare(t, &store.Batch{Create: groupDoc("t", "c1", 1), Events: []store.EventAppend{groupEvent("c1", 1)}}),
		mustPrepare(t, &store.Batch{Create: groupDoc("t", "c2", 1), Events: []store.EventAppend{groupEvent("c2", 1)}}),
		mustPrepare(t, &store.Batch{Events: []store.EventAppend{groupEvent("", 1), groupEvent("", 2)}}),
		{prune: true, before: 7, done: make(chan struct{})},
		mustPrepare(t, &store.Batch{Updates: []store.DocumentUpdate{{Record: groupDoc("t", "d", 3), PrevRev: 2}}, Events: []store.EventAppend{groupEvent("d", 3)}}),
	}
	runOneGroup(t, s, reqs...)
	ws := s.WriterStats()
	if ws.Transactions-before.Transactions != 1 || ws.Retries != before.Retries {
		t.Fatalf("clean group: %d transactions, %d retries; want 1 and 0", ws.Transactions-before.Transactions, ws.Retries-before.Retries)
	}
	next := uint64(5)
	for i, r := range reqs {
		if r.err != nil {
			t.Fatalf("batch %d: %v", i, r.err)
		}
		for _, seq := range r.res.Seqs {
			if seq != next {
				t.Fatalf("batch %d seqs %v, want contiguous from %d", i, r.res.Seqs, next)
			}
			next++
		}
	}
	if next != 10 {
		t.Fatalf("clean group assigned seqs up to %d, want 9", next-1)
	}
	if reqs[3].pres.Removed != 4 {
		t.Fatalf("prune before 7 removed %d events, want 4", reqs[3].pres.Removed)
	}
}

// checkGroupCountersDurable: after a reopen the meta counters match the
// stored events.
func checkGroupCountersDurable(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var count, size int64
	if err := s.EachEventMeta(ctx, func(_ uint64, _ time.Time, n int) error {
		count, size = count+1, size+int64(n)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.EventStats(ctx); err != nil || count != 3 || st.Count != 3 || st.Bytes != uint64(size) || st.LatestSeq != 9 || s.LastSeq() != 9 {
		t.Fatalf("after reopen EventStats %+v, %v, LastSeq %d; want 3 (of %d) events of %d bytes, last seq 9", st, err, s.LastSeq(), count, size)
	}
}

// TestCreateReusedIDIsConflict: without a lookup before the INSERT, a reused
// document id (same or another tenant) still fails with ErrConflict and
// leaves the stored document unchanged.
func TestCreateReusedIDIsConflict(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Commit(ctx, &store.Batch{Create: groupDoc("t", "x", 1)}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"t", "other"} {
		again := groupDoc(tenant, "x", 5)
		_, err := s.Commit(ctx, &store.Batch{Create: again, Events: []store.EventAppend{groupEvent("x", 5)}})
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("tenant %s reusing id x: %v, want ErrConflict", tenant, err)
		}
	}
	if got, err := s.GetDocument(ctx, "t", "x", false); err != nil || got.Doc.GetRev() != 1 {
		t.Fatalf("document after refused creates: %v, %v; want rev 1", got, err)
	}
	if s.LastSeq() != 0 {
		t.Fatalf("refused creates appended events: LastSeq %d", s.LastSeq())
	}
}

// TestGroupEventsSpanSeveralBlocks: a group whose events need several
// blocks (more than maxBlockEvents, split across batches) stores every
// event once, under its seq, with the seq in its body, in as few blocks as
// the bound allows.
func TestGroupEventsSpanSeveralBlocks(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir(), Options{MaxGroupBatches: 3, MaxGroupDelay: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sizes := []int{maxBlockEvents + 6, 1, 2*maxBlockEvents + 2}
	var reqs []*request
	for _, n := range sizes {
		b := &store.Batch{}
		for i := range n {
			b.Events = append(b.Events, groupEvent("", uint64(i)))
		}
		reqs = append(reqs, mustPrepare(t, b))
	}
	runOneGroup(t, s, reqs...)
	var total uint64
	for i, r := range reqs {
		if r.err != nil || len(r.res.Seqs) != sizes[i] {
			t.Fatalf("batch %d: %d seqs, %v; want %d", i, len(r.res.Seqs), r.err, sizes[i])
		}
		for j, seq := range r.res.Seqs {
			if seq != total+uint64(j)+1 {
				t.Fatalf("batch %d seqs not contiguous from %d: %v", i, total+1, r.res.Seqs)
			}
		}
		total += uint64(sizes[i])
	}
	evs, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true, Limit: 1000})
	if err != nil || uint64(len(evs)) != total {
		t.Fatalf("ReadEvents: %d events, %v; want %d", len(evs), err, total)
	}
	for i, e := range evs {
		ev, err := e.Decode()
		if err != nil || e.Seq != uint64(i)+1 || ev.GetSeq() != e.Seq {
			t.Fatalf("event %d: seq %d, body seq %d, %v", i, e.Seq, ev.GetSeq(), err)
		}
	}
	if st, err := s.EventStats(ctx); err != nil || st.Count != total || st.LatestSeq != total {
		t.Fatalf("EventStats %+v, %v; want %d events", st, err, total)
	}
	var blocks uint64
	if err := s.rdb.QueryRow("SELECT count(*) FROM event_blocks").Scan(&blocks); err != nil || blocks != (total+maxBlockEvents-1)/maxBlockEvents {
		t.Fatalf("%d events in %d blocks (%v), want %d", total, blocks, err, (total+maxBlockEvents-1)/maxBlockEvents)
	}
}

// TestIdempotentCreateReusingTheID: a retry that repeats both the request id
// and the document id is a duplicate (same body) or a request id conflict
// (other body), as when the idempotency lookup ran before the INSERT
// (SQLite happens to report the request id index first here; applyCreate
// does not rely on that order); a duplicate keeps the group on its first run.
func TestIdempotentCreateReusingTheID(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := groupDoc("t", "x", 1)
	first.Doc.RequestId, first.BodyHash = "req", []byte("h1")
	if _, err := s.Commit(ctx, &store.Batch{Create: first}); err != nil {
		t.Fatal(err)
	}
	before := s.WriterStats()
	again := groupDoc("t", "x", 1)
	again.Doc.RequestId, again.BodyHash = "req", []byte("h1")
	res, err := s.Commit(ctx, &store.Batch{Create: again, Events: []store.EventAppend{groupEvent("x", 1)}})
	if err != nil || res.Duplicate == nil || res.Duplicate.Doc.GetId() != "x" || res.Seqs != nil {
		t.Fatalf("retry with the same ids and body: %+v, %v; want Duplicate x and no events", res, err)
	}
	if ws := s.WriterStats(); ws.Retries != before.Retries {
		t.Fatalf("a duplicate create reran its group (%d retries)", ws.Retries-before.Retries)
	}
	other := groupDoc("t", "x", 1)
	other.Doc.RequestId, other.BodyHash = "req", []byte("h2")
	if _, err := s.Commit(ctx, &store.Batch{Create: other}); !errors.Is(err, store.ErrConflict) || !bytes.Contains([]byte(err.Error()), []byte("request id")) {
		t.Fatalf("retry with the same ids and another body: %v, want the request id ErrConflict", err)
	}
	// A new request id with a used document id is an id conflict.
	reuse := groupDoc("t", "x", 1)
	reuse.Doc.RequestId = "req-2"
	if _, err := s.Commit(ctx, &store.Batch{Create: reuse}); !errors.Is(err, store.ErrConflict) || !bytes.Contains([]byte(err.Error()), []byte("document id")) {
		t.Fatalf("new request id, used document id: %v, want the document id ErrConflict", err)
	}
	if s.LastSeq() != 0 {
		t.Fatalf("refused or duplicate creates appended events: LastSeq %d", s.LastSeq())
	}
}
