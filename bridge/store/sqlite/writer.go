package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/pipestream/gateway/bridge/store"
)

// request is one queued unit of work for the writer: a Batch (encoded by
// the caller's goroutine) or a prune.
type request struct {
	b       *store.Batch
	create  *docRow
	updates []docRow
	events  []encEvent

	prune  bool
	before uint64

	res  store.CommitResult
	pres store.PruneResult
	err  error
	done chan struct{}
}

// Commit applies b atomically through the group-commit writer and returns
// once it is durable. On error nothing of b was applied, except when ctx
// ends first: then Commit returns ctx.Err() and the batch may or may not
// commit later (idempotent creates make a retry safe). b and its messages
// must not be modified until Commit returns.
func (s *Store) Commit(ctx context.Context, b *store.Batch) (store.CommitResult, error) {
	r, err := prepare(b)
	if err != nil {
		return store.CommitResult{}, err
	}
	if err := s.enqueue(ctx, r); err != nil {
		return store.CommitResult{}, err
	}
	return r.res, r.err
}

// PruneEvents deletes every event with seq < beforeSeq through the writer
// (last_seq is kept, so seqs never repeat) and reports what it removed.
func (s *Store) PruneEvents(ctx context.Context, before uint64) (store.PruneResult, error) {
	r := &request{prune: true, before: before, done: make(chan struct{})}
	if err := s.enqueue(ctx, r); err != nil {
		return store.PruneResult{}, err
	}
	return r.pres, r.err
}

// enqueue hands r to the writer and waits for its outcome.
func (s *Store) enqueue(ctx context.Context, r *request) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return store.ErrClosed
	}
	select {
	case s.queue <- r:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("store: outcome unknown, the batch may still commit: %w", ctx.Err())
	}
}

// writer is the single writer goroutine: it takes the first queued request,
// drains what else is queued (bounded), and commits them in one transaction.
func (s *Store) writer() {
	defer close(s.done)
	group := make([]*request, 0, s.opts.MaxGroupBatches)
	for first := range s.queue {
		group = append(group[:0], first)
		var timer <-chan time.Time
		if s.opts.MaxGroupDelay > 0 {
			timer = time.After(s.opts.MaxGroupDelay)
		}
	drain:
		for len(group) < s.opts.MaxGroupBatches {
			if timer == nil {
				select {
				case r, ok := <-s.queue:
					if !ok {
						break drain
					}
					group = append(group, r)
				default:
					break drain
				}
			} else {
				select {
				case r, ok := <-s.queue:
					if !ok {
						break drain
					}
					group = append(group, r)
				case <-timer:
					break drain
				}
			}
		}
		s.runGroup(group)
		clear(group)
	}
}

// txState is the meta row set, carried through a group transaction.
type txState struct {
	lastSeq, count, bytes uint64
}

// errBatchFailed ends a group transaction run without savepoints when one of
// its batches failed: the transaction is rolled back and the group runs again
// with a savepoint per batch.
var errBatchFailed = errors.New("store: a batch of the group failed")

// runGroup commits reqs in one transaction. The common case, every batch
// succeeding, runs without savepoints (two statements per batch fewer) and
// writes the group's events as one block at the end. If any batch
// fails, that transaction is rolled back and the group runs again with each
// batch in its own savepoint, so a failing batch is rolled back alone and
// the others commit, exactly as if every run had used savepoints.
func (s *Store) runGroup(reqs []*request) {
	start := time.Now()
	err := s.runTx(reqs, false)
	if errors.Is(err, errBatchFailed) {
		s.retries.Add(1)
		err = s.runTx(reqs, true)
	}
	if err == nil {
		s.txns.Add(1)
		s.batches.Add(uint64(len(reqs)))
		s.met.observe(len(reqs), time.Since(start))
		if fn := s.hook.Load(); fn != nil {
			if published := publish(reqs); len(published) > 0 {
				(*fn)(published)
			}
		}
	}
	for _, r := range reqs {
		if err != nil && r.err == nil {
			r.err = err
			r.res = store.CommitResult{}
		}
		close(r.done)
	}
}

// runTx runs reqs in one transaction and commits it. Each request's outcome
// is reset first, so a run may follow a rolled-back one. Without savepoints
// the first failing batch rolls the transaction back and runTx returns
// errBatchFailed; with savepoints a failing batch is rolled back alone and
// keeps its error. Any other error has rolled the transaction back.
func (s *Store) runTx(reqs []*request, savepoints bool) error {
	ctx := context.Background()
	s.dropPending()
	if _, err := s.exec(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	st, err := s.readMeta(ctx)
	if err != nil {
		s.rollback()
		return err
	}
	before := st
	for _, r := range reqs {
		r.err, r.res, r.pres = nil, store.CommitResult{}, store.PruneResult{}
		if savepoints {
			if _, err := s.exec(ctx, "SAVEPOINT b"); err != nil {
				s.rollback()
				return fmt.Errorf("store: savepoint: %w", err)
			}
		}
		saved := st
		if r.prune {
			// The prune must see the events queued before it.
			if r.err = s.flushEvents(ctx); r.err == nil {
				r.err = s.applyPrune(ctx, r, &st)
			}
		} else {
			r.err = s.apply(ctx, r, &st)
		}
		if r.err == nil && savepoints {
			r.err = s.flushEvents(ctx)
		}
		if r.err != nil {
			if !savepoints {
				s.rollback()
				return errBatchFailed
			}
			st = saved
			s.dropPending()
			r.res, r.pres = store.CommitResult{}, store.PruneResult{}
			if _, err := s.exec(ctx, "ROLLBACK TO b"); err != nil {
				s.rollback()
				return fmt.Errorf("store: rollback to savepoint: %w", err)
			}
		}
		if savepoints {
			if _, err := s.exec(ctx, "RELEASE b"); err != nil {
				s.rollback()
				return fmt.Errorf("store: release savepoint: %w", err)
			}
		}
	}
	if err := s.flushEvents(ctx); err != nil {
		// Only without savepoints can events still be pending; which batch
		// they belong to is found by the run with savepoints.
		s.rollback()
		return errBatchFailed
	}
	if st != before {
		if _, err := s.exec(ctx, `UPDATE meta SET value = CASE key
			WHEN 'last_seq' THEN ?1 WHEN 'event_count' THEN ?2 WHEN 'event_bytes' THEN ?3 ELSE value END`, int64(st.lastSeq), int64(st.count), int64(st.bytes)); err != nil {
			s.rollback()
			return fmt.Errorf("store: update meta: %w", err)
		}
	}
	if _, err := s.exec(ctx, "COMMIT"); err != nil {
		s.rollback()
		return fmt.Errorf("store: commit: %w", err)
	}
	s.lastSeq.Store(st.lastSeq)
	return nil
}

// publish lists the committed events of reqs in seq order for the event hook.
func publish(reqs []*request) []store.EventRecord {
	var out []store.EventRecord
	for _, r := range reqs {
		if r.err != nil || len(r.res.Seqs) == 0 {
			continue
		}
		for i, e := range r.events {
			out = append(out, store.EventRecord{
				Seq: r.res.Seqs[i], Time: fromNanos(e.timeNs), Kind: e.kind, Tenant: e.tenant,
				DocID: e.doc, Rev: e.rev, Since: e.since, Body: e.body,
			})
		}
	}
	return out
}

func (s *Store) rollback() {
	if _, err := s.wconn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		s.log.Error("store: rollback failed", "err", err)
	}
}

func (s *Store) readMeta(ctx context.Context) (txState, error) {
	rows, err := s.query(ctx, "SELECT key, value FROM meta")
	if err != nil {
		return txState{}, fmt.Errorf("store: read meta: %w", err)
	}
	defer rows.Close()
	var st txState
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return txState{}, fmt.Errorf("store: read meta: %w", err)
		}
		switch k {
		case "last_seq":
			st.lastSeq = uint64(v)
		case "event_count":
			st.count = uint64(v)
		case "event_bytes":
			st.bytes = uint64(v)
		}
	}
	return st, rows.Err()
}

// prep returns the writer connection's prepared statement for q (cached).
// Writer goroutine only.
func (s *Store) prep(ctx context.Context, q string) (*sql.Stmt, error) {
	if st, ok := s.stmts[q]; ok {
		return st, nil
	}
	st, err := s.wconn.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	s.stmts[q] = st
	return st, nil
}

// exec, query and queryRow run q on the writer connection through its
// prepared statement; if preparing fails they run it unprepared so that the
// error surfaces from the call itself.
func (s *Store) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	s.stmtCount.Add(1)
	st, err := s.prep(ctx, q)
	if err != nil {
		return s.wconn.ExecContext(ctx, q, args...)
	}
	return st.ExecContext(ctx, args...)
}

func (s *Store) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	s.stmtCount.Add(1)
	st, err := s.prep(ctx, q)
	if err != nil {
		return s.wconn.QueryContext(ctx, q, args...)
	}
	return st.QueryContext(ctx, args...)
}

func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	s.stmtCount.Add(1)
	st, err := s.prep(ctx, q)
	if err != nil {
		return s.wconn.QueryRowContext(ctx, q, args...)
	}
	return st.QueryRowContext(ctx, args...)
}
