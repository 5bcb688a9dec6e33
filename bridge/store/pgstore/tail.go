package pgstore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
)

// notifyChannel is the LISTEN/NOTIFY channel; the payload is the last seq
// of the committing transaction (decimal).
const notifyChannel = "pipestream_events"

// tail delivers every committed event of the database — this replica's and
// every other's — to the event hook exactly once, in seq order, without
// gaps (package doc, Event sequence).
type tail struct {
	s         *Store
	mu        sync.Mutex // serialises deliveries; guards nothing else
	delivered atomic.Uint64
	// reported is the last LastSeq answered while no hook was installed:
	// SetEventHook hands the new hook every event after it (see there).
	reported atomic.Uint64
	hook     atomic.Pointer[func([]store.EventRecord)]
	reads    atomic.Uint64 // catch-up queries run (tests, metrics)
	gaps     atomic.Uint64 // catch-ups that found seqs pruned before they were read
	// own counts this replica's event-writing commits in flight (ownBegin
	// to ownEnd). A notification that arrives meanwhile may be one of
	// theirs, which the commit delivers itself (deliverOwn): the listener
	// records its seq in owed instead of reading it back, and the last of
	// them to end reads whatever owed names that no commit delivered.
	own  atomic.Int64
	owed atomic.Uint64
	// ctx ends when the Store closes (a late retry of ownEnd's read stops).
	ctx context.Context
	// onDeferred, when set (tests), is called with the seq of each
	// notification the listener left to an own commit in flight.
	onDeferred atomic.Pointer[func(seq uint64)]
}

// SetEventHook installs fn (nil removes it). fn is called with committed
// events in ascending seq order, each event once: the events of this
// replica's Commit before that Commit returns, and the events of other
// replicas (processes) on the same database after their commit's NOTIFY
// arrives. fn must not block and must not call Commit. fn owns the slice.
//
// Other processes commit at any time, so events may be delivered (to no
// hook) between a caller's LastSeq and its SetEventHook. SetEventHook
// therefore first hands fn every event after the last LastSeq answered
// while no hook was installed: "every event with a higher seq than LastSeq
// reaches the hook installed after it" holds without a window.
func (s *Store) SetEventHook(fn func([]store.EventRecord)) {
	t := &s.tail
	t.mu.Lock()
	defer t.mu.Unlock()
	if fn == nil {
		t.hook.Store(nil)
		t.reported.Store(t.delivered.Load())
		return
	}
	t.hook.Store(&fn)
	from, upTo := t.reported.Load(), t.delivered.Load()
	if upTo <= from {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), catchUpTimeout)
	defer cancel()
	for from < upTo {
		evs, err := readEvents(ctx, s.pool, store.EventQuery{From: from + 1, AllTenants: true, Limit: maxEventLimit})
		for len(evs) > 0 && evs[len(evs)-1].Seq > upTo {
			evs = evs[:len(evs)-1]
		}
		if err != nil || len(evs) == 0 {
			if err != nil {
				s.log.Error("pgstore: replaying events to a new hook", "from", from+1, "to", upTo, "err", err)
			}
			return
		}
		fn(evs)
		from = evs[len(evs)-1].Seq
	}
}

// LastSeq is the highest seq delivered so far (committed by any replica
// and passed to the event hook, or that would have been).
func (s *Store) LastSeq() uint64 {
	d := s.tail.delivered.Load()
	if s.tail.hook.Load() == nil {
		s.tail.reported.Store(d)
	}
	return d
}

// deliverOwn delivers the events of a Commit of this replica (seqs
// consecutive). If deliveries are behind (events of other replicas whose
// NOTIFY has not arrived yet), it first reads the missing seqs: they are
// committed, because the seqs are taken in commit order. If that read
// fails, it delivers nothing: the listener catches up from the last
// delivered seq when our NOTIFY arrives, so a failure delays events but
// never skips one.
func (t *tail) deliverOwn(evs []store.EventRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	first, last := evs[0].Seq, evs[len(evs)-1].Seq
	d := t.delivered.Load()
	switch {
	case d >= last:
		return
	case d+1 == first:
		t.publish(evs)
	case d+1 < first:
		// Not the caller's ctx: its end must not turn into a gap.
		ctx, cancel := context.WithTimeout(context.Background(), catchUpTimeout)
		defer cancel()
		if err := t.catchUpLocked(ctx, first-1); err != nil {
			t.s.log.Warn("pgstore: reading earlier events before our own; the listener delivers them", "err", err)
			return
		}
		t.publish(evs[t.delivered.Load()+1-first:])
	default: // partly delivered already (a catch-up read them)
		t.publish(evs[d+1-first:])
	}
}

// publish advances delivered and hands evs to the hook. Callers hold mu.
// LastSeq covers evs before the hook sees them, as with SQLite (its seq is
// stored at COMMIT, before the hook runs): a hook that reads LastSeq never
// finds it behind the events it was given.
func (t *tail) publish(evs []store.EventRecord) {
	if len(evs) == 0 {
		return
	}
	t.delivered.Store(evs[len(evs)-1].Seq)
	if fn := t.hook.Load(); fn != nil {
		(*fn)(evs)
	}
}

// ownBegin marks one of this replica's event-writing commits in flight;
// call it before the transaction is sent and ownEnd once it ended (after
// deliverOwn when it committed). Commits without events must not be
// counted: they deliver nothing, so a stream of them could hold own above
// zero and leave a notified seq unread.
func (t *tail) ownBegin() { t.own.Add(1) }

// ownEnd ends an own commit. The last one in flight reads the events of
// the notifications left to the commits that no commit delivered: another
// replica's commit that came after ours, or ours when we never learnt it
// committed (an error after the COMMIT was sent). While others are still
// in flight it leaves them to those: each of them either commits after
// the notified seq, and its deliverOwn reads the seqs before its own
// first, or ends, down to the last. The listener stores owed before it
// loads own, and ownEnd decrements own before it loads owed, so one of the
// two reads every notified seq. (Reading at every end instead read the
// events of a commit still in flight whose notification beat it: the
// group runner lets a member's Commit return, and the next commit start
// in the second group, before its own ownEnd.)
func (t *tail) ownEnd() {
	if t.own.Add(-1) == 0 && t.owed.Load() > t.delivered.Load() {
		t.settleOwed()
	}
}

// settleOwed catches up to what was notified; a failed read is tried
// again a second later (no notification may come to retry it) until it
// succeeds or the Store closes.
func (t *tail) settleOwed() {
	ctx, cancel := context.WithTimeout(t.ctx, catchUpTimeout)
	defer cancel()
	if err := t.catchUp(ctx, 0); err != nil && t.ctx.Err() == nil {
		t.s.log.Warn("pgstore: reading notified events after our own commit; trying again in 1s", "err", err)
		time.AfterFunc(time.Second, func() {
			if t.ctx.Err() == nil && t.owed.Load() > t.delivered.Load() {
				t.settleOwed()
			}
		})
	}
}

// catchUp delivers every committed event after delivered (up to upTo when
// upTo > 0).
func (t *tail) catchUp(ctx context.Context, upTo uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.catchUpLocked(ctx, upTo)
}

func (t *tail) catchUpLocked(ctx context.Context, upTo uint64) error {
	if t.hook.Load() == nil {
		// Nobody listens: only advance LastSeq (the counter row is
		// committed with the events, so it is the highest visible seq).
		var last int64
		if err := t.s.pool.QueryRow(ctx, "SELECT last_seq FROM meta WHERE id = 1").Scan(&last); err != nil {
			return err
		}
		if upTo > 0 {
			last = min(last, int64(upTo))
		}
		if uint64(last) > t.delivered.Load() {
			t.delivered.Store(uint64(last))
		}
		return nil
	}
	for {
		from := t.delivered.Load() + 1
		if upTo > 0 && from > upTo {
			return nil
		}
		t.reads.Add(1)
		evs, err := readEvents(ctx, t.s.pool, store.EventQuery{From: from, AllTenants: true, Limit: maxEventLimit})
		if err != nil {
			return err
		}
		if upTo > 0 {
			for len(evs) > 0 && evs[len(evs)-1].Seq > upTo {
				evs = evs[:len(evs)-1]
			}
		}
		if len(evs) > 0 && evs[0].Seq != from {
			t.pruned(from, evs[0].Seq-1)
		}
		t.publish(evs)
		if len(evs) < maxEventLimit {
			if upTo > 0 && t.delivered.Load() < upTo {
				// The rest was pruned meanwhile: the hook's next call
				// starts above it, and the log announces the gap.
				t.pruned(t.delivered.Load()+1, upTo)
				t.delivered.Store(upTo)
			}
			return nil
		}
	}
}

// deferToOwn reports whether the events up to the notified seq are left
// to this replica's commits in flight (ownEnd): most notifications a
// replica receives are its own commits', which arrive before the commit
// has delivered its events, and reading them back would cost a query and
// a decode of every event (docs/performance.md, "PostgreSQL: own events
// not read back").
func (t *tail) deferToOwn(seq uint64) bool {
	if seq == 0 {
		return false
	}
	t.owed.Store(seq) // notifications arrive in commit order: seq only grows
	if t.own.Load() == 0 {
		// No own commit in flight. One that ended since the listener
		// compared seq with delivered has delivered its events by now
		// (deliverOwn runs before ownEnd): compare again rather than read
		// them back.
		return seq <= t.delivered.Load()
	}
	if f := t.onDeferred.Load(); f != nil {
		(*f)(seq)
	}
	return true
}

// pruned records that the committed seqs from..to were deleted (another
// replica's prune) before this replica read them. They cannot be
// delivered; seqs are dense, so the hook's next call, which starts above
// them, tells the event log of the gap (eventlog.Store, SetEventHook).
func (t *tail) pruned(from, to uint64) {
	t.gaps.Add(1)
	t.s.log.Warn("pgstore: events were pruned before this replica read them; the event log announces the gap to its subscribers",
		"from", from, "to", to)
}

// listen holds a dedicated connection on LISTEN and catches up on every
// notification that names a seq beyond what was delivered. After
// (re)connecting it catches up once, so notifications lost while the
// connection was down cost nothing. ready is closed after the first LISTEN.
func (t *tail) listen(ctx context.Context, ready chan<- error) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		listened, err := t.session(ctx, ready)
		ready = nil
		if ctx.Err() != nil {
			return
		}
		if listened {
			backoff = 100 * time.Millisecond // it worked: a new outage starts afresh
		}
		t.s.log.Warn("pgstore: event listener disconnected; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// session is one listener connection's life; listened reports that it got
// as far as LISTEN and the catch-up.
func (t *tail) session(ctx context.Context, ready chan<- error) (listened bool, _ error) {
	conn, err := pgx.ConnectConfig(ctx, t.s.listenCfg)
	if err == nil {
		_, err = conn.Exec(ctx, "LISTEN "+notifyChannel+"; LISTEN "+claimsChannel+"; LISTEN "+cancelsChannel)
	}
	if err == nil {
		err = t.catchUp(ctx, 0)
	}
	if err == nil {
		err = t.s.redeemedOfHeld(ctx, conn)
	}
	if ready != nil {
		ready <- err
	}
	if err != nil {
		if conn != nil {
			conn.Close(context.Background())
		}
		return false, err
	}
	defer conn.Close(context.Background())
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		if n.Channel == claimsChannel {
			t.s.claimNotified(n.Payload)
			continue
		}
		if n.Channel == cancelsChannel {
			t.s.cancelNotified(n.Payload)
			continue
		}
		seq, _ := strconv.ParseUint(n.Payload, 10, 64)
		if seq != 0 && seq <= t.delivered.Load() {
			continue // our own commit, or already read by a catch-up
		}
		if t.deferToOwn(seq) {
			continue
		}
		if err := t.catchUp(ctx, 0); err != nil {
			return true, err
		}
	}
}
