package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"time"

	"github.com/pipestream/gateway/bridge/store"
)

// blockRowsFirst and blockRowsMax bound how many blocks one query of a
// read returns: the first reads few (a live reader wants the newest events
// only), each further one twice as many.
const (
	blockRowsFirst = 4
	blockRowsMax   = 256
)

// startBlockSQL is the first_seq of the block holding seq ?1 (or ?1 when
// no block starts at or below it).
const startBlockSQL = `coalesce((SELECT first_seq FROM event_blocks WHERE first_seq <= ?1 ORDER BY first_seq DESC LIMIT 1), ?1)`

// Reads of up to ?2 blocks holding seqs >= ?1, in seq order: all blocks,
// or those event_keys lists for (?3, ?4).
const (
	readBlocksSQL = `SELECT first_seq, last_seq, head, bodies FROM event_blocks
		WHERE first_seq >= ` + startBlockSQL + ` ORDER BY first_seq LIMIT ?2`
	readKeyBlocksSQL = `SELECT b.first_seq, b.last_seq, b.head, b.bodies FROM event_keys k
		JOIN event_blocks b ON b.first_seq = k.first_seq
		WHERE k.kind = ?3 AND k.key = ?4 AND k.first_seq >= ` + startBlockSQL + ` ORDER BY k.first_seq LIMIT ?2`
)

// ReadEvents returns up to q.Limit retained events with seq >= q.From that
// match the filter, in ascending seq order (for replay). It reads the
// blocks that may hold them (a document's or tenant's through event_keys)
// and filters their events; a read that needs more than one query reads
// further blocks from where the last one ended.
func (s *Store) ReadEvents(ctx context.Context, eq store.EventQuery) ([]store.EventRecord, error) {
	limit := eq.Limit
	if limit <= 0 {
		limit = defaultEventLimit
	}
	limit = min(limit, maxEventLimit)
	q, args := s.readBlocks, []any{int64(min(eq.From, store.MaxSeq)), 0}
	switch {
	case eq.DocID != "":
		q, args = s.readKeyBlocks, append(args, keyDoc, eq.DocID)
	case !eq.AllTenants:
		q, args = s.readKeyBlocks, append(args, keyTenant, eq.Tenant)
	}
	var (
		out []store.EventRecord
		evs []blockEvent
	)
	for rows := blockRowsFirst; ; rows = min(2*rows, blockRowsMax) {
		args[1] = rows
		n, next, err := eachBlock(ctx, q, args, func(first, last int64, head, bodies []byte) error {
			var err error
			if evs, err = decodeHead(evs, first, last, head, len(bodies)); err != nil {
				return err
			}
			out = appendMatching(out, eq, args[0].(int64), first, evs, bodies, limit)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("store: read events: %w", err)
		}
		if n < rows || len(out) >= limit {
			return out, nil
		}
		args[0] = next
	}
}

// eachBlock runs a block query and calls fn with each block's columns
// (valid during the call only); it returns how many blocks it read and the
// seq after the last one.
func eachBlock(ctx context.Context, q *sql.Stmt, args []any, fn func(first, last int64, head, bodies []byte) error) (n int, next int64, err error) {
	rows, err := q.QueryContext(ctx, args...)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	var head, bodies sql.RawBytes
	for rows.Next() {
		var first, last int64
		if err := rows.Scan(&first, &last, &head, &bodies); err != nil {
			return 0, 0, err
		}
		if err := fn(first, last, head, bodies); err != nil {
			return 0, 0, err
		}
		n, next = n+1, last+1
	}
	return n, next, rows.Err()
}

// appendMatching appends the events of the block at first (decoded as
// evs) with seq >= from that match eq to out, up to limit in all.
func appendMatching(out []store.EventRecord, eq store.EventQuery, from, first int64, evs []blockEvent, bodies []byte, limit int) []store.EventRecord {
	for i := max(0, from-first); i < int64(len(evs)) && len(out) < limit; i++ {
		e := &evs[i]
		if !eq.AllTenants && string(e.tenant) != eq.Tenant || eq.DocID != "" && string(e.doc) != eq.DocID || !kindMatches(eq.Kinds, e.kind) {
			continue
		}
		seq := uint64(first + i)
		body := make([]byte, 0, e.n+seqFieldLen(seq))
		body = appendSeqField(append(body, bodies[e.off:e.off+e.n]...), seq)
		out = append(out, store.EventRecord{Seq: seq, Time: fromNanos(e.timeNs), Kind: string(e.kind),
			Tenant: string(e.tenant), DocID: string(e.doc), Rev: e.rev, Since: e.since, Body: body})
	}
	return out
}

// kindMatches reports whether kind is one of kinds (any kind when none).
func kindMatches(kinds []string, kind []byte) bool {
	if len(kinds) == 0 {
		return true
	}
	for _, k := range kinds {
		if k == string(kind) {
			return true
		}
	}
	return false
}

// EventStats describes the retained log (O(1): counters kept in meta, the
// oldest seq is the first block's).
func (s *Store) EventStats(ctx context.Context) (st store.EventStats, err error) {
	err = s.readTx(ctx, func(tx *sql.Tx) error {
		var last, count, bytes int64
		var oldest sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT
			(SELECT value FROM meta WHERE key = 'last_seq'),
			(SELECT value FROM meta WHERE key = 'event_count'),
			(SELECT value FROM meta WHERE key = 'event_bytes'),
			(SELECT min(first_seq) FROM event_blocks)`).Scan(&last, &count, &bytes, &oldest); err != nil {
			return fmt.Errorf("store: event stats: %w", err)
		}
		st = store.EventStats{OldestSeq: uint64(oldest.Int64), LatestSeq: uint64(last), Count: uint64(count), Bytes: uint64(bytes)}
		return nil
	})
	return st, err
}

// eachHeadSQL reads the heads (not the bodies) of the blocks holding seqs
// in [?1, ?2).
const eachHeadSQL = `SELECT first_seq, last_seq, head, length(bodies) FROM event_blocks
	WHERE first_seq >= ` + startBlockSQL + ` AND first_seq < ?2 ORDER BY first_seq`

// eachEventHead calls fn with the seq and decoded head of every retained
// event in [from, to), in ascending seq order, in one query that does not
// read the bodies.
func eachEventHead(ctx context.Context, q querier, from, to int64, fn func(seq int64, e *blockEvent) error) error {
	rows, err := q.QueryContext(ctx, eachHeadSQL, from, to)
	if err != nil {
		return err
	}
	return scanHeads(rows, func(first, _ int64, evs []blockEvent) error {
		for i := max(0, from-first); i < int64(len(evs)) && first+i < to; i++ {
			if err := fn(first+i, &evs[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// scanHeads decodes the head of each row of rows (first_seq, last_seq,
// head, length(bodies)) and calls fn with it; evs is reused from row to
// row. It closes rows.
func scanHeads(rows *sql.Rows, fn func(first, last int64, evs []blockEvent) error) error {
	defer rows.Close()
	var evs []blockEvent
	for rows.Next() {
		var first, last int64
		var head sql.RawBytes
		var bodiesLen int
		if err := rows.Scan(&first, &last, &head, &bodiesLen); err != nil {
			return err
		}
		var err error
		if evs, err = decodeHead(evs, first, last, head, bodiesLen); err != nil {
			return err
		}
		if err := fn(first, last, evs); err != nil {
			return err
		}
	}
	return rows.Err()
}

// EachEventMeta calls fn with the seq, time and encoded size (the size
// EventRecord.Size reports) of every retained event in ascending seq
// order, without reading bodies: the event log builds its retention index
// from it at start. One query; an error from fn ends it.
func (s *Store) EachEventMeta(ctx context.Context, fn func(seq uint64, t time.Time, size int) error) error {
	err := eachEventHead(ctx, s.rdb, 0, math.MaxInt64, func(seq int64, e *blockEvent) error {
		return fn(uint64(seq), fromNanos(e.timeNs), e.n+seqFieldLen(uint64(seq)))
	})
	if err != nil {
		return fmt.Errorf("store: read event metadata: %w", err)
	}
	return nil
}

// EachEventRange calls fn with a summary of the retained events of every
// seq range [from + k*width, from + (k+1)*width) with from + k*width <= to
// that holds any, in ascending order: first and last seq, count, oldest
// and newest time and encoded bytes. One query over the blocks' heads
// (not their bodies), aggregated here.
func (s *Store) EachEventRange(ctx context.Context, from, to, width uint64, fn func(r store.EventRange) error) error {
	width = max(width, 1)
	from, to = min(from, store.MaxSeq), min(to, store.MaxSeq)
	if to < from {
		return nil
	}
	end := uint64(store.MaxSeq) // exclusive: the end of the range holding to
	if lastLo := from + (to-from)/width*width; width < end-lastLo {
		end = lastLo + width
	}
	var (
		cur  store.EventRange
		curK uint64
	)
	flush := func() error {
		if cur.Count == 0 {
			return nil
		}
		r := cur
		cur = store.EventRange{}
		return fn(r)
	}
	err := eachEventHead(ctx, s.rdb, int64(from), int64(end), func(seq int64, e *blockEvent) error {
		k := (uint64(seq) - from) / width
		if cur.Count > 0 && k != curK {
			if err := flush(); err != nil {
				return err
			}
		}
		t := fromNanos(e.timeNs)
		if cur.Count == 0 {
			curK, cur.First, cur.Oldest, cur.Newest = k, uint64(seq), t, t
		}
		cur.Last = uint64(seq)
		cur.Count++
		cur.Bytes += uint64(e.n + seqFieldLen(uint64(seq)))
		if t.Before(cur.Oldest) {
			cur.Oldest = t
		}
		if t.After(cur.Newest) {
			cur.Newest = t
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return fmt.Errorf("store: read event ranges: %w", err)
	}
	return nil
}

// applyPrune deletes the events below r.before inside the writer's
// transaction: whole blocks below it, and the block straddling it is
// rewritten without its earlier events. It counts what it removes from the
// blocks' heads, reading pruneBlocks blocks per step.
func (s *Store) applyPrune(ctx context.Context, r *request, st *txState) error {
	before := int64(min(r.before, store.MaxSeq, st.lastSeq+1))
	for {
		more, err := s.pruneStep(ctx, before, r, st)
		if err != nil {
			return fmt.Errorf("store: prune: %w", err)
		}
		if !more {
			return nil
		}
	}
}

// pruneStep prunes the first pruneBlocks blocks that start below before
// and reports whether more may follow.
func (s *Store) pruneStep(ctx context.Context, before int64, r *request, st *txState) (more bool, err error) {
	var (
		lastFirst int64 = -1
		straddle  int64 = -1 // first_seq of the block holding before, if read
		keys      []blockKey
		seen      = map[blockKey]struct{}{}
		n, size   uint64
		blocks    int
	)
	err = eachPruneHead(ctx, s, before, func(first, last int64, evs []blockEvent) {
		blocks++
		lastFirst = first
		if last >= before {
			straddle = first
		}
		for i := range evs {
			e := &evs[i]
			for _, k := range []blockKey{{keyTenant, string(e.tenant)}, {keyDoc, string(e.doc)}} {
				if _, ok := seen[k]; !ok && (k.kind == keyTenant || k.key != "") {
					seen[k] = struct{}{}
					keys = append(keys, k)
				}
			}
			if seq := first + int64(i); seq < before {
				n, size = n+1, size+uint64(e.n+seqFieldLen(uint64(seq)))
			}
		}
	})
	if err != nil || blocks == 0 {
		return false, err
	}
	var kept *blockBuilder
	if straddle >= 0 {
		if kept, err = s.keepFrom(ctx, straddle, before); err != nil {
			return false, err
		}
	}
	for _, k := range keys {
		if _, err := s.exec(ctx, "DELETE FROM event_keys WHERE kind = ? AND key = ? AND first_seq <= ?", k.kind, k.key, lastFirst); err != nil {
			return false, err
		}
	}
	if _, err := s.exec(ctx, "DELETE FROM event_blocks WHERE first_seq <= ?", lastFirst); err != nil {
		return false, err
	}
	if kept != nil {
		if err := kept.write(ctx, s.exec); err != nil {
			return false, err
		}
	}
	r.pres.Removed += n
	r.pres.Bytes += size
	st.count -= n
	st.bytes -= size
	return straddle < 0 && blocks == pruneBlocks, nil
}

// eachPruneHead calls fn with the decoded head of each of the first
// pruneBlocks blocks starting below before.
func eachPruneHead(ctx context.Context, s *Store, before int64, fn func(first, last int64, evs []blockEvent)) error {
	rows, err := s.query(ctx, `SELECT first_seq, last_seq, head, length(bodies) FROM event_blocks
		WHERE first_seq < ? ORDER BY first_seq LIMIT ?`, before, pruneBlocks)
	if err != nil {
		return err
	}
	return scanHeads(rows, func(first, last int64, evs []blockEvent) error {
		fn(first, last, evs)
		return nil
	})
}

// keepFrom encodes the events from seq before on of the block at first as
// a new block (starting at before).
func (s *Store) keepFrom(ctx context.Context, first, before int64) (*blockBuilder, error) {
	var last int64
	var head, bodies []byte
	if err := s.queryRow(ctx, "SELECT last_seq, head, bodies FROM event_blocks WHERE first_seq = ?", first).Scan(&last, &head, &bodies); err != nil {
		return nil, err
	}
	evs, err := decodeHead(nil, first, last, head, len(bodies))
	if err != nil {
		return nil, err
	}
	b := &blockBuilder{}
	b.reset(before)
	for i := before - first; i < int64(len(evs)); i++ {
		e := &evs[i]
		enc := encEvent{timeNs: e.timeNs, kind: string(e.kind), tenant: string(e.tenant), doc: string(e.doc), rev: e.rev, since: e.since}
		if err := b.add(first+i, &enc, bodies[e.off:e.off+e.n]); err != nil {
			return nil, err
		}
	}
	return b, nil
}
