package pgstore

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/pipestream/gateway/bridge/store"
)

// Events are stored as blocks (schema migration 4): one row of
// event_blocks per committing transaction, its columns arrays with one
// element per event, event first_seq + i at index i. A group commit of
// many small documents thus writes one heap row and one primary-key
// entry for all their events, and the GIN indexes on tenants and doc_ids
// one entry per distinct tenant and document of the block, where a row
// per event wrote a heap row and three B-tree entries each.
//
// Readers find the block holding their first seq by the primary key, read
// blocks in first_seq order, and filter events in Go (a block matched by
// the tenant or document index may hold other tenants' events too).
// Pruning deletes whole blocks below the floor and records the floor in
// meta.floor_seq; a block straddling it stays, its earlier events hidden.

// blockRowsFirst and blockRowsMax bound how many blocks one query reads:
// the first query of a read reads few (a live reader needs the newest
// events only), each further one twice as many.
const (
	blockRowsFirst = 4
	blockRowsMax   = 256
)

// eventBlock is one row of event_blocks as read.
type eventBlock struct {
	first                int64
	times, revs, sinces  []int64
	kinds, tenants, docs []string
	bodies               [][]byte
}

// readBlocksSQL reads up to $2 blocks holding events at or above
// max($1, floor_seq), in first_seq order, with the effective lower bound.
// Filters are appended as further conditions on b.
//
// The bounds are uncorrelated scalar subqueries (InitPlans), so the scan
// of b starts at the first block in the primary key (an Index Cond). A
// join against a CTE of the bounds, as before, let the planner walk the
// whole table in first_seq order from its start and drop every block below
// the bound with a join filter (LIMIT with an ORDER BY the index gives:
// the planner expects matches early): a read near the head cost a scan of
// the whole history, 44 ms at 8,000 blocks (TestReadNearTheHeadScansNoHistory;
// docs/performance.md, "PostgreSQL: reads near the head").
const readBlocksSQL = `WITH f AS (SELECT greatest($1::bigint, floor_seq) AS lo FROM meta WHERE id = 1)
SELECT b.first_seq, b.times, b.kinds, b.tenants, b.doc_ids, b.revs, b.sinces, b.bodies, (SELECT lo FROM f)
FROM event_blocks b
WHERE b.first_seq >= coalesce((SELECT max(first_seq) FROM event_blocks WHERE first_seq <= (SELECT lo FROM f)), (SELECT lo FROM f))
AND b.last_seq >= (SELECT lo FROM f)`

// blocksQuery is readBlocksSQL with eq's filters, and its arguments. A
// document's blocks are found through the doc_ids index first and then
// read by primary key (an InitPlan array, "= ANY"): as a plain condition
// on b, the generic plan walked every block from the lower bound and
// dropped the other documents' with a filter, so the events of one
// document from an early cursor (WatchDocument, its fold) cost a scan of
// the history (TestReadNearTheHeadScansNoHistory).
func blocksQuery(eq store.EventQuery, from int64, n int) (string, []any) {
	var w where
	w.args = []any{from, n}
	sql := readBlocksSQL
	if !eq.AllTenants {
		sql += " AND b.tenants @> ARRAY[" + w.param(eq.Tenant) + "::text]"
	}
	if eq.DocID != "" {
		sql += " AND b.first_seq = ANY(ARRAY(SELECT first_seq FROM event_blocks WHERE doc_ids @> ARRAY[" + w.param(eq.DocID) + "::text]))"
	}
	if len(eq.Kinds) > 0 {
		sql += " AND b.kinds && " + w.param(eq.Kinds) + "::text[]"
	}
	return sql + " ORDER BY b.first_seq LIMIT $2", w.args
}

func readEvents(ctx context.Context, q querier, eq store.EventQuery) ([]store.EventRecord, error) {
	limit := eq.Limit
	if limit <= 0 {
		limit = defaultEventLimit
	}
	limit = min(limit, maxEventLimit)
	from := int64(min(eq.From, store.MaxSeq))
	var out []store.EventRecord
	for rows := blockRowsFirst; ; rows = min(2*rows, blockRowsMax) {
		blocks, lo, err := readBlocks(ctx, q, eq, from, rows)
		if err != nil {
			return nil, err
		}
		for i := range blocks {
			if out = blocks[i].appendMatching(out, eq, lo, limit); len(out) >= limit {
				return out, nil
			}
		}
		if len(blocks) < rows {
			return out, nil
		}
		from = blocks[len(blocks)-1].last() + 1
	}
}

// readBlocks reads up to n blocks at or after from that may hold events
// matching eq, and the effective lower bound (from, or the floor).
func readBlocks(ctx context.Context, q querier, eq store.EventQuery, from int64, n int) ([]eventBlock, int64, error) {
	sql, args := blocksQuery(eq, from, n)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, 0, asUnavailable(fmt.Errorf("pgstore: read events: %w", err))
	}
	defer rows.Close()
	var (
		out []eventBlock
		lo  int64
	)
	for rows.Next() {
		var b eventBlock
		if err := rows.Scan(&b.first, &b.times, &b.kinds, &b.tenants, &b.docs, &b.revs, &b.sinces, &b.bodies, &lo); err != nil {
			return nil, 0, asUnavailable(fmt.Errorf("pgstore: read events: %w", err))
		}
		if err := b.check(); err != nil {
			return nil, 0, err
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, asUnavailable(fmt.Errorf("pgstore: read events: %w", err))
	}
	return out, lo, nil
}

// check reports a block whose arrays disagree in length (a damaged row).
func (b *eventBlock) check() error {
	n := len(b.times)
	if n == 0 || len(b.kinds) != n || len(b.tenants) != n || len(b.docs) != n || len(b.revs) != n ||
		len(b.sinces) != n || len(b.bodies) != n {
		return fmt.Errorf("pgstore: event block at seq %d is damaged: its columns hold different numbers of events", b.first)
	}
	return nil
}

func (b *eventBlock) last() int64 { return b.first + int64(len(b.times)) - 1 }

// appendMatching appends b's events at or above lo that match eq to out,
// up to limit events in all.
func (b *eventBlock) appendMatching(out []store.EventRecord, eq store.EventQuery, lo int64, limit int) []store.EventRecord {
	for i := max(0, lo-b.first); i < int64(len(b.times)) && len(out) < limit; i++ {
		if !eq.AllTenants && b.tenants[i] != eq.Tenant || eq.DocID != "" && b.docs[i] != eq.DocID ||
			len(eq.Kinds) > 0 && !slices.Contains(eq.Kinds, b.kinds[i]) {
			continue
		}
		seq := uint64(b.first + i)
		body := b.bodies[i]
		out = append(out, store.EventRecord{Seq: seq, Time: time.Unix(0, b.times[i]).UTC(), Kind: b.kinds[i],
			Tenant: b.tenants[i], DocID: b.docs[i], Rev: uint64(b.revs[i]), Since: uint64(b.sinces[i]),
			Body: protowire.AppendVarint(protowire.AppendTag(body[:len(body):len(body)], eventFieldSeq, protowire.VarintType), seq)})
	}
	return out
}

// seqFieldLen is the encoded size of an event's seq field.
func seqFieldLen(seq uint64) int {
	return protowire.SizeTag(eventFieldSeq) + protowire.SizeVarint(seq)
}

// EventStats describes the retained log (counters kept in the meta row).
func (s *Store) EventStats(ctx context.Context) (st store.EventStats, err error) {
	if err := s.enter(); err != nil {
		return st, err
	}
	defer s.wg.Done()
	var last, count, bytes, floor int64
	var oldest *int64
	if err := s.pool.QueryRow(ctx, `SELECT last_seq, event_count, event_bytes, floor_seq,
		(SELECT min(first_seq) FROM event_blocks) FROM meta WHERE id = 1`).Scan(&last, &count, &bytes, &floor, &oldest); err != nil {
		return st, asUnavailable(fmt.Errorf("pgstore: event stats: %w", err))
	}
	st = store.EventStats{LatestSeq: uint64(last), Count: uint64(count), Bytes: uint64(bytes)}
	if oldest != nil {
		st.OldestSeq = uint64(max(*oldest, floor))
	}
	return st, nil
}

// EachEventMeta calls fn with the seq, time and encoded size of every
// retained event in ascending seq order, without reading bodies (one
// query; an error from fn ends it).
func (s *Store) EachEventMeta(ctx context.Context, fn func(seq uint64, t time.Time, size int) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.wg.Done()
	rows, err := s.pool.Query(ctx, `SELECT b.first_seq, b.times, b.sizes, m.floor_seq
		FROM event_blocks b, meta m WHERE m.id = 1 ORDER BY b.first_seq`)
	if err != nil {
		return asUnavailable(fmt.Errorf("pgstore: read event metadata: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var first, floor int64
		var times []int64
		var sizes []int32
		if err := rows.Scan(&first, &times, &sizes, &floor); err != nil {
			return asUnavailable(fmt.Errorf("pgstore: read event metadata: %w", err))
		}
		if len(sizes) != len(times) {
			return fmt.Errorf("pgstore: event block at seq %d is damaged: its columns hold different numbers of events", first)
		}
		if err := eachMeta(first, floor, times, sizes, fn); err != nil {
			return err
		}
	}
	return asUnavailable(rows.Err())
}

func eachMeta(first, floor int64, times []int64, sizes []int32, fn func(seq uint64, t time.Time, size int) error) error {
	for i := max(0, floor-first); i < int64(len(times)); i++ {
		seq := uint64(first + i)
		if err := fn(seq, time.Unix(0, times[i]).UTC(), int(sizes[i])+seqFieldLen(seq)); err != nil {
			return err
		}
	}
	return nil
}

// eventRangesSQL summarises the retained events of [max($1, floor), $2]
// by ranges of $3 seqs. Its lower bound is an InitPlan for the reason
// given at readBlocksSQL: the scan of b starts at the block holding it.
const eventRangesSQL = `WITH m AS (SELECT greatest($1::bigint, floor_seq) AS lo FROM meta WHERE id = 1),
e AS (SELECT b.first_seq + u.ord - 1 AS seq, u.t, u.sz
	FROM event_blocks b, unnest(b.times, b.sizes) WITH ORDINALITY AS u(t, sz, ord)
	WHERE b.first_seq <= $2 AND b.last_seq >= (SELECT lo FROM m)
	AND b.first_seq >= coalesce((SELECT max(first_seq) FROM event_blocks WHERE first_seq <= (SELECT lo FROM m)), (SELECT lo FROM m)))
SELECT min(seq), max(seq), count(*), min(t), max(t), sum(sz + pipestream_seq_field_len(seq))::bigint
FROM e WHERE e.seq >= (SELECT lo FROM m) AND e.seq <= $2 GROUP BY (e.seq - $1) / $3 ORDER BY 1`

// EachEventRange calls fn with a summary of the retained events of every
// seq range [from + k*width, from + (k+1)*width) that holds any, in
// ascending order (one aggregate query).
func (s *Store) EachEventRange(ctx context.Context, from, to, width uint64, fn func(r store.EventRange) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.wg.Done()
	width = max(width, 1)
	rows, err := s.pool.Query(ctx, eventRangesSQL, int64(min(from, store.MaxSeq)), int64(min(to, uint64(math.MaxInt64))), int64(min(width, uint64(math.MaxInt64))))
	if err != nil {
		return asUnavailable(fmt.Errorf("pgstore: read event ranges: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var first, last, n, tmin, tmax, bytes int64
		if err := rows.Scan(&first, &last, &n, &tmin, &tmax, &bytes); err != nil {
			return asUnavailable(fmt.Errorf("pgstore: read event ranges: %w", err))
		}
		if err := fn(store.EventRange{First: uint64(first), Last: uint64(last), Count: uint64(n),
			Oldest: time.Unix(0, tmin).UTC(), Newest: time.Unix(0, tmax).UTC(), Bytes: uint64(bytes)}); err != nil {
			return err
		}
	}
	return asUnavailable(rows.Err())
}
