package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
)

// Group commit: concurrent Commits of one Store are gathered into one
// transaction, as the SQLite writer does (bridge/store, writer.go). A
// Commit queues its batch; while fewer than maxGroups groups are in flight
// it starts one, which takes everything queued (at most maxGroupBatches).
// A group is one pipeline (pipeline.go): BEGIN, the statements of every
// batch in queue order, ONE event append for all their events (the counter
// UPDATE, the INSERT and the NOTIFY, still last, so seqs stay in commit
// order), then COMMIT. Batches queued meanwhile form the next group.
//
// Per-batch outcomes stay exact: when a statement of batch k meets
// anything but the plain outcome the group rolls back (nothing of it
// stays, no seq), batches before k are rerun as a group, batch k alone
// step by step (which names its outcome: Duplicate, ErrConflict,
// ErrStaleRev, ErrLeaseLost, ...), and the batches after k as a group. A
// failing batch therefore applies nothing and takes no other batch down.

const (
	// maxGroups is the number of group transactions of one Store in
	// flight at once: one gathers while the other commits.
	maxGroups = 2
	// maxGroupBatches bounds one group (its pipeline and its rollback).
	maxGroupBatches = 128
)

// pending is one queued Commit.
type pending struct {
	ctx  context.Context
	p    *prepared
	res  store.CommitResult
	err  error
	done chan struct{}
}

func (w *pending) finish(res store.CommitResult, err error) {
	w.res, w.err = res, err
	close(w.done)
}

// grouper is the queue of Commits waiting for a group.
type grouper struct {
	mu      sync.Mutex
	queue   []*pending
	running int // groups in flight
}

// takeLocked removes the next group from the queue. Callers hold mu.
func (g *grouper) takeLocked() []*pending {
	n := min(len(g.queue), maxGroupBatches)
	out := append([]*pending(nil), g.queue[:n]...)
	rest := copy(g.queue, g.queue[n:])
	clear(g.queue[rest:])
	g.queue = g.queue[:rest]
	return out
}

// commitGrouped queues p, starts a group when fewer than maxGroups run, and
// waits for p's outcome. When ctx ends first it returns ctx's error: the
// outcome is then unknown, as for any Commit whose ctx ends (a batch not
// yet taken into a group is dropped; the group's transaction ends once the
// ctx of every member ended, groupContext). A group counts as a call in
// flight (s.wg): Close waits for it.
func (s *Store) commitGrouped(ctx context.Context, p *prepared) (store.CommitResult, error) {
	w := &pending{ctx: ctx, p: p, done: make(chan struct{})}
	g := &s.group
	g.mu.Lock()
	g.queue = append(g.queue, w)
	var first []*pending
	if g.running < maxGroups {
		g.running++
		first = g.takeLocked()
	}
	g.mu.Unlock()
	if first != nil {
		s.wg.Add(1) // the caller's own call keeps the count above zero
		go s.runGroups(first)
	}
	select {
	case <-w.done:
		return w.res, w.err
	case <-ctx.Done():
		return store.CommitResult{}, fmt.Errorf("pgstore: commit: %w (the outcome is unknown)", ctx.Err())
	}
}

// runGroups commits group after group until the queue is empty.
func (s *Store) runGroups(batch []*pending) {
	defer s.wg.Done()
	g := &s.group
	for {
		s.runGroup(batch)
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.running--
			g.mu.Unlock()
			return
		}
		batch = g.takeLocked()
		g.mu.Unlock()
	}
}

// runGroup drops the members whose ctx already ended (nothing of them was
// applied) and commits the rest.
func (s *Store) runGroup(batch []*pending) {
	live := make([]*pending, 0, len(batch))
	for _, w := range batch {
		if err := w.ctx.Err(); err != nil {
			w.finish(store.CommitResult{}, err)
			continue
		}
		live = append(live, w)
	}
	if len(live) == 0 {
		return
	}
	ctx, stop := groupContext(live)
	defer stop()
	if writesEvents(live) {
		s.tail.ownBegin()
		defer s.tail.ownEnd()
	}
	s.commitGroup(ctx, live)
}

// writesEvents reports whether a member of batch appends events (its
// commit then delivers them itself: tail.ownBegin).
func writesEvents(batch []*pending) bool {
	for _, w := range batch {
		if len(w.p.events) > 0 {
			return true
		}
	}
	return false
}

// groupContext ends when the ctx of every member ended.
func groupContext(batch []*pending) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, w := range batch {
		stops[i] = context.AfterFunc(w.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// commitGroup commits batch as one pipelined transaction; on a non-plain
// outcome it splits the group around the batch that met it (see the top of
// this file). An error that is not about one batch (the connection, the
// COMMIT, ctx) is every member's: nothing was applied, or, when the COMMIT
// was sent, the outcome is unknown as with a single Commit.
func (s *Store) commitGroup(ctx context.Context, batch []*pending) {
	ps := make([]*prepared, len(batch))
	for i, w := range batch {
		ps[i] = w.p
	}
	evs, failed, err := s.runPipelined(ctx, ps)
	s.txns.Add(1)
	switch {
	case err == nil:
		s.finishGroup(batch, evs)
		return
	case !errors.Is(err, errSlowPath):
		for _, w := range batch {
			w.finish(store.CommitResult{}, err)
		}
		return
	}
	s.retries.Add(1)
	switch {
	case len(batch) == 1:
		s.commitStepwise(ctx, batch[0])
	case failed < 0: // not one batch's statement: each alone
		for _, w := range batch {
			s.commitGroup(ctx, []*pending{w})
		}
	default:
		if failed > 0 {
			s.commitGroup(ctx, batch[:failed])
		}
		s.commitStepwise(ctx, batch[failed])
		if failed+1 < len(batch) {
			s.commitGroup(ctx, batch[failed+1:])
		}
	}
}

// finishGroup hands each member its seqs (evs holds the group's events in
// member order), records the leases, delivers the events to the hook once
// for the group, and only then lets the Commits return.
func (s *Store) finishGroup(batch []*pending, evs []store.EventRecord) {
	now := time.Now()
	res := make([]store.CommitResult, len(batch))
	off := 0
	for i, w := range batch {
		n := len(w.p.events)
		res[i].Seqs = make([]uint64, n)
		for j := range n {
			res[i].Seqs[j] = evs[off+j].Seq
		}
		off += n
		s.lease.committed(w.p, now)
	}
	if len(evs) > 0 {
		s.tail.deliverOwn(evs)
	}
	for i, w := range batch {
		w.finish(res[i], nil)
	}
}

// commitStepwise applies one batch statement by statement in its own
// transaction: the path that classifies every outcome exactly.
func (s *Store) commitStepwise(ctx context.Context, w *pending) {
	res, err := s.applyStepwise(ctx, w.p)
	w.finish(res, err)
}

// applyStepwise is commitStepwise's transaction; it also serves claim
// redemptions, which are never pipelined.
func (s *Store) applyStepwise(ctx context.Context, p *prepared) (store.CommitResult, error) {
	var (
		res store.CommitResult
		evs []store.EventRecord
	)
	if len(p.events) > 0 {
		s.tail.ownBegin()
		defer s.tail.ownEnd()
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		res, evs = store.CommitResult{}, nil
		var err error
		if res, err = apply(ctx, tx, p); err != nil || res.Duplicate != nil {
			return err
		}
		evs, err = appendEvents(ctx, tx, p.events)
		if err != nil {
			return err
		}
		res.Seqs = make([]uint64, len(evs))
		for i := range evs {
			res.Seqs[i] = evs[i].Seq
		}
		return nil
	})
	s.txns.Add(1)
	if err != nil {
		s.lease.lostByWrite(err)
		return store.CommitResult{}, err
	}
	if res.Duplicate == nil {
		s.lease.committed(p, time.Now())
	}
	if len(evs) > 0 {
		s.tail.deliverOwn(evs)
	}
	return res, nil
}
