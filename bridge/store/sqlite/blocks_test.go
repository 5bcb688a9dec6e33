package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	"github.com/pipestream/gateway/bridge/store/storetest"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestMigrationToEventBlocks: a database of schema version 5 (an events
// row each, with a gap in the seqs and more consecutive events than fit in
// one block) is opened by this binary; migration 6 moves every event into
// blocks, and every event reads back as it was stored (seq, fields, body
// with its seq field), by every filter, with the same counters, oldest
// seq, per-event sizes and range summaries; the events table is gone,
// new commits continue the sequence, and the migration is logged before
// and after (it runs at start, about a minute per four million events).
func TestMigrationToEventBlocks(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	db := rawDB(t, dir)
	if err := sqlite.MigrateTo(ctx, db, 5); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 3))
	want := writeV5Events(t, db, r, 41, 300)                 // seqs 41..340
	want = append(want, writeV5Events(t, db, r, 400, 20)...) // a gap: 341..399 were never written
	setV5Counters(t, db, want)
	db.Close()

	var logs bytes.Buffer
	s := openStore(t, dir, sqlite.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if !strings.Contains(logs.String(), `msg="store: migrating the database schema" from=5 to=6`) ||
		!strings.Contains(logs.String(), `msg="store: database schema migrated" from=5 to=6`) {
		t.Fatalf("the migration logged %q; want a line before and one after", logs.String())
	}
	m := eventModel{events: want}
	m.check(t, s, r, "after the migration")
	for _, q := range []store.EventQuery{{Tenant: "acme", From: 100, Limit: 10000}, {AllTenants: true, DocID: "doc-3"},
		{Tenant: "globex", Kinds: []string{"#info"}}, {AllTenants: true, From: 380, Limit: 3}} {
		m.checkRead(t, s, q, "after the migration")
	}
	var tables int
	if err := rawDB(t, dir).QueryRow("SELECT count(*) FROM sqlite_master WHERE name = 'events'").Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("events table still there after the migration: %d, %v", tables, err)
	}
	res, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "d", 1)}, {Tenant: "t", Event: newEvent("#info", "d", 2)}}})
	if err != nil || len(res.Seqs) != 2 || res.Seqs[0] != 420 {
		t.Fatalf("commit after the migration: %+v, %v; want seqs 420, 421", res, err)
	}
}

// writeV5Events writes n events from seq first on as schema version 5
// stored them (a row each, the seq field appended to the body) and
// returns them as the store reads them.
func writeV5Events(t *testing.T, db *sql.DB, r *rand.Rand, first uint64, n int) []store.EventRecord {
	t.Helper()
	var out []store.EventRecord
	for i := range n {
		seq := first + uint64(i)
		e := randomEvent(r)
		ev := e.Event
		body := bodyWithSeq(t, ev, seq)
		rec := store.EventRecord{Seq: seq, Time: ev.GetTime().AsTime(), Kind: ev.GetKind(), Tenant: e.Tenant,
			DocID: ev.GetDocumentId(), Rev: ev.GetRev(), Since: ev.GetSince(), Body: body}
		if _, err := db.Exec("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", int64(seq), rec.Time.UnixNano(), rec.Kind,
			rec.Tenant, rec.DocID, int64(rec.Rev), int64(rec.Since), len(body), body); err != nil {
			t.Fatal(err)
		}
		out = append(out, rec)
	}
	return out
}

func setV5Counters(t *testing.T, db *sql.DB, evs []store.EventRecord) {
	t.Helper()
	var total int
	for _, e := range evs {
		total += len(e.Body)
	}
	if _, err := db.Exec(`UPDATE meta SET value = CASE key WHEN 'last_seq' THEN ?1 WHEN 'event_count' THEN ?2
		WHEN 'event_bytes' THEN ?3 ELSE value END`, int64(evs[len(evs)-1].Seq), len(evs), total); err != nil {
		t.Fatal(err)
	}
}

// bodyWithSeq is ev encoded as the store returns it: its fields, then its
// seq field (the writer appends it to the encoded event).
func bodyWithSeq(t *testing.T, ev *gatewayv1.Event, seq uint64) []byte {
	t.Helper()
	body, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return protowire.AppendVarint(protowire.AppendTag(body, 1, protowire.VarintType), seq)
}

var (
	modelTenants = []string{"acme", "globex", "initech"}
	modelKinds   = []string{"#status", "#document", "#info"}
)

// randomEvent is an event of a random tenant, document (doc-0..doc-11 or
// none) and kind, with a message of random length.
func randomEvent(r *rand.Rand) store.EventAppend {
	doc := ""
	if r.IntN(8) > 0 {
		doc = fmt.Sprint("doc-", r.IntN(12))
	}
	rev := r.Uint64N(100) + 1
	return store.EventAppend{Tenant: modelTenants[r.IntN(len(modelTenants))], Event: &gatewayv1.Event{
		Time: timestamppb.New(base.Add(time.Duration(r.Int64N(1e12)))), Kind: modelKinds[r.IntN(len(modelKinds))],
		DocumentId: doc, Rev: rev, Since: rev - 1, Message: string(make([]byte, r.IntN(300)))}}
}

// eventModel is what the store must retain: the committed events in seq
// order, those below the last prune removed.
type eventModel struct {
	events []store.EventRecord
}

func (m *eventModel) prune(before uint64) (removed, bytes uint64) {
	i := 0
	for i < len(m.events) && m.events[i].Seq < before {
		removed, bytes = removed+1, bytes+uint64(len(m.events[i].Body))
		i++
	}
	m.events = m.events[i:]
	return removed, bytes
}

func (m *eventModel) matching(q store.EventQuery) []store.EventRecord {
	limit := q.Limit
	if limit <= 0 {
		limit = 1000
	}
	var out []store.EventRecord
	for _, e := range m.events {
		if len(out) == limit {
			break
		}
		if e.Seq < q.From || !q.AllTenants && e.Tenant != q.Tenant || q.DocID != "" && e.DocID != q.DocID ||
			len(q.Kinds) > 0 && !slices.Contains(q.Kinds, e.Kind) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// checkRead: ReadEvents(q) returns exactly the model's matching events.
func (m *eventModel) checkRead(t *testing.T, s *sqlite.Store, q store.EventQuery, what string) {
	t.Helper()
	got, err := s.ReadEvents(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: ReadEvents(%+v): %v", what, q, err)
	}
	want := m.matching(q)
	if len(got) != len(want) {
		t.Fatalf("%s: ReadEvents(%+v) returned %d events, want %d", what, q, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Kind != w.Kind || g.Tenant != w.Tenant || g.DocID != w.DocID || g.Rev != w.Rev ||
			g.Since != w.Since || !g.Time.Equal(w.Time) || !bytes.Equal(g.Body, w.Body) {
			t.Fatalf("%s: ReadEvents(%+v)[%d] = %+v, want %+v", what, q, i, g, w)
		}
	}
}

// check compares the stats, metadata, range summaries and random reads
// with the model.
func (m *eventModel) check(t *testing.T, s *sqlite.Store, r *rand.Rand, what string) {
	t.Helper()
	ctx := context.Background()
	var want store.EventStats
	want.LatestSeq = s.LastSeq()
	for _, e := range m.events {
		want.Count++
		want.Bytes += uint64(len(e.Body))
	}
	if len(m.events) > 0 {
		want.OldestSeq = m.events[0].Seq
	}
	if st, err := s.EventStats(ctx); err != nil || st != want {
		t.Fatalf("%s: EventStats %+v, %v; want %+v", what, st, err, want)
	}
	i := 0
	if err := s.EachEventMeta(ctx, func(seq uint64, tm time.Time, size int) error {
		if i >= len(m.events) || seq != m.events[i].Seq || size != len(m.events[i].Body) || !tm.Equal(m.events[i].Time) {
			return fmt.Errorf("meta %d: seq %d size %d", i, seq, size)
		}
		i++
		return nil
	}); err != nil || i != len(m.events) {
		t.Fatalf("%s: EachEventMeta: %v after %d of %d events", what, err, i, len(m.events))
	}
	m.checkRanges(t, s, r, what)
	for range 20 {
		q := store.EventQuery{Limit: r.IntN(60), AllTenants: r.IntN(3) == 0}
		if !q.AllTenants {
			q.Tenant = modelTenants[r.IntN(len(modelTenants))]
		}
		if r.IntN(3) == 0 {
			q.DocID = fmt.Sprint("doc-", r.IntN(13))
		}
		if r.IntN(3) == 0 {
			q.Kinds = []string{modelKinds[r.IntN(len(modelKinds))]}
		}
		if last := s.LastSeq(); r.IntN(4) > 0 {
			q.From = r.Uint64N(last + 2)
		}
		m.checkRead(t, s, q, what)
	}
}

// checkRanges: EachEventRange over a random span and width summarises
// exactly the model's events of each range.
func (m *eventModel) checkRanges(t *testing.T, s *sqlite.Store, r *rand.Rand, what string) {
	t.Helper()
	last := s.LastSeq()
	from, width := r.Uint64N(last+2), r.Uint64N(50)+1
	to := from + r.Uint64N(last+2)
	var want []store.EventRange
	for _, e := range m.events {
		if e.Seq < from || (e.Seq-from)/width*width+from > to {
			continue
		}
		if n := len(want); n > 0 && (want[n-1].First-from)/width == (e.Seq-from)/width {
			w := &want[n-1]
			w.Last, w.Count, w.Bytes = e.Seq, w.Count+1, w.Bytes+uint64(len(e.Body))
			if e.Time.Before(w.Oldest) {
				w.Oldest = e.Time
			}
			if e.Time.After(w.Newest) {
				w.Newest = e.Time
			}
			continue
		}
		want = append(want, store.EventRange{First: e.Seq, Last: e.Seq, Count: 1, Oldest: e.Time, Newest: e.Time, Bytes: uint64(len(e.Body))})
	}
	var got []store.EventRange
	if err := s.EachEventRange(context.Background(), from, to, width, func(x store.EventRange) error {
		got = append(got, x)
		return nil
	}); err != nil {
		t.Fatalf("%s: EachEventRange: %v", what, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: EachEventRange(%d, %d, %d): %d ranges, want %d", what, from, to, width, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.First != w.First || g.Last != w.Last || g.Count != w.Count || g.Bytes != w.Bytes || !g.Oldest.Equal(w.Oldest) || !g.Newest.Equal(w.Newest) {
			t.Fatalf("%s: EachEventRange(%d, %d, %d)[%d] = %+v, want %+v", what, from, to, width, i, g, w)
		}
	}
}

// TestEventBlocksModel runs a seeded workload against the block log and
// checks it against a model after every step: concurrent commits of
// batches of 1 to 40 events (so that groups write blocks of many batches,
// tenants and documents), prunes at random seqs (most inside a block),
// and reads by every filter, stats, metadata and range summaries. A
// failure prints the seed; STORETEST_SEED=<seed> replays it. The
// event_keys rows of pruned blocks must be gone.
func TestEventBlocksModel(t *testing.T) {
	for _, seed := range storetest.Seeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, sqlite.Options{Synchronous: "NORMAL", MaxGroupDelay: time.Millisecond})
			r := rand.New(rand.NewPCG(seed, 25))
			var m eventModel
			for round := range 30 {
				what := fmt.Sprintf("seed %d round %d", seed, round)
				commitRound(t, s, r, &m, what)
				if r.IntN(3) == 0 {
					before := r.Uint64N(s.LastSeq() + 3)
					res, err := s.PruneEvents(context.Background(), before)
					removed, bytes := m.prune(before)
					if err != nil || res.Removed != removed || res.Bytes != bytes {
						t.Fatalf("%s: PruneEvents(%d) = %+v, %v; want %d removed, %d bytes", what, before, res, err, removed, bytes)
					}
				}
				m.check(t, s, r, what)
			}
			checkNoStaleKeys(t, dir, s)
		})
	}
}

// commitRound commits 1 to 8 batches concurrently and adds their events
// to the model in seq order.
func commitRound(t *testing.T, s *sqlite.Store, r *rand.Rand, m *eventModel, what string) {
	t.Helper()
	batches := make([]*store.Batch, 1+r.IntN(8))
	for i := range batches {
		b := &store.Batch{}
		for range 1 + r.IntN(40) {
			b.Events = append(b.Events, randomEvent(r))
		}
		batches[i] = b
	}
	results := make([]store.CommitResult, len(batches))
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for i, b := range batches {
		wg.Go(func() { results[i], errs[i] = s.Commit(context.Background(), b) })
	}
	wg.Wait()
	var added []store.EventRecord
	for i, b := range batches {
		if errs[i] != nil {
			t.Fatalf("%s: commit: %v", what, errs[i])
		}
		for j, e := range b.Events {
			ev := e.Event
			body := bodyWithSeq(t, ev, results[i].Seqs[j])
			added = append(added, store.EventRecord{Seq: results[i].Seqs[j], Time: ev.GetTime().AsTime(), Kind: ev.GetKind(), Tenant: e.Tenant,
				DocID: ev.GetDocumentId(), Rev: ev.GetRev(), Since: ev.GetSince(), Body: body})
		}
	}
	slices.SortFunc(added, func(a, b store.EventRecord) int { return int(a.Seq) - int(b.Seq) })
	m.events = append(m.events, added...)
}

// checkNoStaleKeys: every event_keys row names a retained block, and
// every block's tenants and documents have their rows.
func checkNoStaleKeys(t *testing.T, dir string, s *sqlite.Store) {
	t.Helper()
	db := rawDB(t, dir)
	var stale int
	if err := db.QueryRow(`SELECT count(*) FROM event_keys k WHERE NOT EXISTS
		(SELECT 1 FROM event_blocks b WHERE b.first_seq = k.first_seq)`).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("%d event_keys rows name no block (%v)", stale, err)
	}
	evs, err := s.ReadEvents(context.Background(), store.EventQuery{AllTenants: true, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM event_keys k JOIN event_blocks b ON b.first_seq = k.first_seq
			WHERE k.kind = 1 AND k.key = ? AND b.first_seq <= ? AND b.last_seq >= ?`, e.Tenant, int64(e.Seq), int64(e.Seq)).Scan(&n); err != nil || n != 1 {
			t.Fatalf("event %d: %d tenant key rows for its block (%v)", e.Seq, n, err)
		}
	}
}

// TestDamagedEventBlock: a block whose head claims more bytes than its
// bodies hold, more events than its seq range, or is cut short fails the
// reads that reach it with an error naming the damage; it neither panics
// nor allocates from the lengths it read.
func TestDamagedEventBlock(t *testing.T) {
	huge := protowire.AppendVarint(nil, 1<<62)
	cases := map[string]func(head, bodies []byte) (lastDelta int64, h, b []byte){
		"cut short":        func(h, b []byte) (int64, []byte, []byte) { return 0, h[:len(h)-3], b },
		"bodies too short": func(h, b []byte) (int64, []byte, []byte) { return 0, h, b[:len(b)-1] },
		"one event more":   func(h, b []byte) (int64, []byte, []byte) { return 1, h, b },
		"huge body length": func(h, b []byte) (int64, []byte, []byte) {
			return 0, append(h[:len(h)-1:len(h)-1], huge...), b
		},
		"huge string length": func(h, b []byte) (int64, []byte, []byte) {
			return 0, append(append(h[:len(h):len(h)], 0), huge...), b
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, sqlite.Options{})
			b := &store.Batch{}
			for i := range 3 {
				b.Events = append(b.Events, store.EventAppend{Tenant: "t", Event: newEvent("#info", "d", uint64(i+1))})
			}
			mustCommit(t, s, b)
			db := rawDB(t, dir)
			var head, bodies []byte
			var last int64
			if err := db.QueryRow("SELECT last_seq, head, bodies FROM event_blocks WHERE first_seq = 1").Scan(&last, &head, &bodies); err != nil {
				t.Fatal(err)
			}
			d, h, bb := damage(head, bodies)
			if _, err := db.Exec("UPDATE event_blocks SET last_seq = ?, head = ?, bodies = ? WHERE first_seq = 1", last+d, h, bb); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ReadEvents(context.Background(), store.EventQuery{Tenant: "t"}); err == nil {
				t.Fatal("ReadEvents of a damaged block succeeded")
			}
			if err := s.EachEventMeta(context.Background(), func(uint64, time.Time, int) error { return nil }); err == nil {
				t.Fatal("EachEventMeta of a damaged block succeeded")
			}
			if _, err := s.PruneEvents(context.Background(), 2); err == nil {
				t.Fatal("PruneEvents through a damaged block succeeded")
			}
		})
	}
}
