package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestMigrationToEventBlocks: a database of schema version 3 (an events
// row each) holding events across a pruned floor is opened by this
// binary; migration 4 turns every event into a block of one, and every
// event reads back as it was stored (seq, fields, body with its seq
// field), with the same counters, oldest seq and per-event sizes; new
// commits continue the sequence as blocks.
func TestMigrationToEventBlocks(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgstore.MigrateTo(ctx, conn, 3); err != nil {
		t.Fatal(err)
	}
	want := writeV3Events(t, conn, rand.New(rand.NewPCG(7, 3)), 300, 41) // seqs 41..340
	conn.Close(ctx)

	s := open(t, dsn)
	checkReadBack(t, s, want)
	acme, err := s.ReadEvents(ctx, store.EventQuery{Tenant: "acme", From: 100, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range acme {
		if e.Tenant != "acme" || e.Seq < 100 {
			t.Fatalf("tenant read from 100 returned %+v", e)
		}
	}
	res, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "next"), event("d", "next")}})
	if err != nil || len(res.Seqs) != 2 || res.Seqs[0] != 341 {
		t.Fatalf("commit after the migration: %+v, %v; want seqs 341, 342", res, err)
	}
}

// checkReadBack: every event of want reads back as it was, with the same
// counters, oldest seq and per-event sizes.
func checkReadBack(t *testing.T, s *pgstore.Store, want []store.EventRecord) {
	t.Helper()
	ctx := context.Background()
	got, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d events after the migration, want %d", len(got), len(want))
	}
	var bytesSum uint64
	for i := range want {
		if g, w := got[i], want[i]; g.Seq != w.Seq || g.Kind != w.Kind || g.Tenant != w.Tenant || g.DocID != w.DocID ||
			g.Rev != w.Rev || g.Since != w.Since || !g.Time.Equal(w.Time) || !bytes.Equal(g.Body, w.Body) {
			t.Fatalf("event %d after the migration: %+v, want %+v", i, g, w)
		}
		bytesSum += uint64(len(want[i].Body))
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.OldestSeq != 41 || st.LatestSeq != 340 || st.Count != 300 || st.Bytes != bytesSum {
		t.Fatalf("EventStats %+v, %v; want oldest 41, latest 340, 300 events, %d bytes", st, err, bytesSum)
	}
	i := 0
	if err := s.EachEventMeta(ctx, func(seq uint64, _ time.Time, size int) error {
		if seq != want[i].Seq || size != len(want[i].Body) {
			return fmt.Errorf("meta %d: seq %d size %d, want seq %d size %d", i, seq, size, want[i].Seq, len(want[i].Body))
		}
		i++
		return nil
	}); err != nil || i != len(want) {
		t.Fatalf("EachEventMeta: %v after %d events", err, i)
	}
}

// writeV3Events writes n events from seq first on as schema version 3
// stored them (a row each, the seq field appended to the body) and the
// counters, with the seqs below first pruned; it returns them as the
// store reads them.
func writeV3Events(t *testing.T, conn *pgx.Conn, r *rand.Rand, n int, first uint64) []store.EventRecord {
	t.Helper()
	ctx := context.Background()
	tenants := []string{"acme", "globex", "initech"}
	var out []store.EventRecord
	var total int
	for i := range n {
		seq := first + uint64(i)
		body := protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), fmt.Sprint("msg-", r.Uint32()))
		body = protowire.AppendVarint(protowire.AppendTag(body, 1, protowire.VarintType), seq)
		e := store.EventRecord{Seq: seq, Time: time.Unix(0, r.Int64N(1<<60)).UTC(), Kind: "#status",
			Tenant: tenants[r.IntN(len(tenants))], DocID: fmt.Sprint("doc-", r.IntN(20)), Rev: r.Uint64N(100), Since: r.Uint64N(100), Body: body}
		if _, err := conn.Exec(ctx, "INSERT INTO events VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
			int64(seq), e.Time.UnixNano(), e.Kind, e.Tenant, e.DocID, int64(e.Rev), int64(e.Since), len(body), body); err != nil {
			t.Fatal(err)
		}
		total += len(body)
		out = append(out, e)
	}
	last := first + uint64(n) - 1
	if _, err := conn.Exec(ctx, "UPDATE meta SET last_seq = $1, event_count = $2, event_bytes = $3", int64(last), n, total); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPruneInsideABlock: one commit's events are one block; pruning to a
// seq inside it hides the events below and keeps the rest, and every
// reader (ReadEvents, EventStats, EachEventMeta, EachEventRange) and the
// counters agree on exactly which events remain.
func TestPruneInsideABlock(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	var evs []store.EventAppend
	for range 10 {
		evs = append(evs, event("d", "#status"))
	}
	res, err := s.Commit(ctx, &store.Batch{Events: evs})
	if err != nil || len(res.Seqs) != 10 {
		t.Fatalf("commit: %+v, %v", res, err)
	}
	all, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	if err != nil || len(all) != 10 {
		t.Fatalf("read: %d events, %v", len(all), err)
	}
	cut := res.Seqs[4]
	var gone uint64
	for _, e := range all[:4] {
		gone += uint64(len(e.Body))
	}
	pr, err := s.PruneEvents(ctx, cut)
	if err != nil || pr.Removed != 4 || pr.Bytes != gone {
		t.Fatalf("prune to %d: %+v, %v; want 4 events, %d bytes removed", cut, pr, err, gone)
	}
	if pr, err := s.PruneEvents(ctx, cut); err != nil || pr.Removed != 0 {
		t.Fatalf("pruning again to %d: %+v, %v; want nothing removed", cut, pr, err)
	}
	checkPrunedTo(t, s, cut, all[4], res.Seqs[9])
	// Pruning past the latest seq removes the block but never moves the
	// floor past the next seq: the next commit's events are visible.
	if pr, err := s.PruneEvents(ctx, 1<<40); err != nil || pr.Removed != 6 {
		t.Fatalf("prune everything: %+v, %v", pr, err)
	}
	res2, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{event("d", "#status")}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true}); err != nil || len(got) != 1 || got[0].Seq != res2.Seqs[0] {
		t.Fatalf("after pruning everything and one commit: %v, %v; want the new event %d", got, err, res2.Seqs[0])
	}
}

// checkPrunedTo: after pruning to cut (inside a block of 10 events ending
// at last), every reader agrees that the 6 events from cut on remain.
func checkPrunedTo(t *testing.T, s *pgstore.Store, cut uint64, first store.EventRecord, last uint64) {
	t.Helper()
	ctx := context.Background()
	left, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	if err != nil || len(left) != 6 || left[0].Seq != cut || !bytes.Equal(left[0].Body, first.Body) {
		t.Fatalf("after the prune: %d events from %v, %v; want 6 from seq %d", len(left), left, err, cut)
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.OldestSeq != cut || st.Count != 6 {
		t.Fatalf("EventStats %+v, %v; want oldest %d, 6 events", st, err, cut)
	}
	var metas []uint64
	if err := s.EachEventMeta(ctx, func(seq uint64, _ time.Time, _ int) error { metas = append(metas, seq); return nil }); err != nil || len(metas) != 6 || metas[0] != cut {
		t.Fatalf("EachEventMeta: %v, %v; want 6 seqs from %d", metas, err, cut)
	}
	var counted uint64
	if err := s.EachEventRange(ctx, 0, last, 3, func(r store.EventRange) error {
		if r.First < cut {
			return fmt.Errorf("range %+v holds a pruned seq", r)
		}
		counted += r.Count
		return nil
	}); err != nil || counted != 6 {
		t.Fatalf("EachEventRange: %v, counted %d, want 6", err, counted)
	}
}
