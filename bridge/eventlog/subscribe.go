package eventlog

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/eventlog/internal/retention"
	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Filter narrows a subscription. The tenant filter is always applied: a
// subscription sees only events committed with its own tenant ("" sees only
// tenant "").
type Filter struct {
	// Kinds keeps only these kinds ("#status", ...); empty keeps all.
	Kinds []string
	// DocumentID keeps only this document's events; "" keeps all.
	DocumentID string
}

func (f *Filter) match(tenant string, it *item) bool {
	return it.tenant == tenant &&
		(f.DocumentID == "" || it.doc == f.DocumentID) &&
		(len(f.Kinds) == 0 || slices.Contains(f.Kinds, it.kind))
}

// Subscription describes one follower of the log.
type Subscription struct {
	Tenant string
	// ClientKey identifies the client for retention tracking (e.g. the
	// authenticated principal or the remote address). It is hashed with a
	// rotating salt and never stored; "" is not tracked.
	ClientKey string
	// Cursor follows the AT sync draft ("Cursors and Resumption"):
	//   nil           live only: events committed after Subscribe starts;
	//   0             the whole retained window, then live;
	//   in the window replay from *Cursor INCLUSIVE, then live;
	//   below oldest  an #info OutdatedCursor event, then the whole window;
	//   above latest  ErrFutureCursor, before anything is sent.
	// A consumer resumes with the last seq it processed (the draft's rule):
	// that event comes again first and is skipped by seq; or with that seq
	// + 1 when it is not above the latest seq.
	Cursor *uint64
	Filter Filter
	// OnStart, if set, is called once the cursor is accepted and before any
	// event is sent, with the latest committed seq at that moment. Every
	// event after that seq will be delivered (live-only subscriptions start
	// right after it). WatchDocument uses it to read the document's current
	// state without a race.
	OnStart func(latest uint64) error
}

// Subscribe follows the log for tenant with the AT sync cursor rules (see
// Subscription.Cursor), calling send for every matching event in seq order
// until ctx ends (ctx.Err()), send fails (its error), the log closes
// (ErrClosed), or the subscriber falls out of the tail while live
// (ErrConsumerTooSlow). ErrFutureCursor is returned before anything is sent.
//
// send runs on the caller's goroutine. The *Event is shared with every other
// subscriber and must not be modified; it may be retained. A send that
// blocks holds no memory in the log, but if the tail moves past the
// subscriber meanwhile it ends with ErrConsumerTooSlow: the transport should
// put a deadline on writes.
func (l *Log) Subscribe(ctx context.Context, tenant, clientKey string, cursor *uint64, f Filter, send func(*gatewayv1.Event) error) error {
	return l.Follow(ctx, Subscription{Tenant: tenant, ClientKey: clientKey, Cursor: cursor, Filter: f}, send)
}

// SubscribeDocument follows one document of tenant from cursor (same rules
// as Subscribe, filtered to docID), for WatchDocument. onStart (optional)
// runs before the first event, see Subscription.OnStart; send may return a
// sentinel error of the caller's (e.g. on a terminal state) to stop.
func (l *Log) SubscribeDocument(ctx context.Context, tenant, clientKey, docID string, cursor *uint64, onStart func(latest uint64) error, send func(*gatewayv1.Event) error) error {
	if docID == "" {
		return fmt.Errorf("eventlog: SubscribeDocument needs a document id")
	}
	return l.Follow(ctx, Subscription{Tenant: tenant, ClientKey: clientKey, Cursor: cursor,
		Filter: Filter{DocumentID: docID}, OnStart: onStart}, send)
}

// WithIdle returns ctx carrying idle, which a subscription followed with
// that context (Follow, Subscribe) calls each time it has sent every event
// committed so far and is about to wait for more: a transport that
// buffers what send gave it writes it out then (one write for the events
// of a batch rather than one each). An error from idle ends the
// subscription with that error.
func WithIdle(ctx context.Context, idle func() error) context.Context {
	return context.WithValue(ctx, idleKey{}, idle)
}

type idleKey struct{}

// subscriber is the whole per-subscription state: a constant size.
type subscriber struct {
	l      *Log
	s      Subscription
	send   func(*gatewayv1.Event) error
	idle   func() error // WithIdle's hook, or nil
	push   Push         // WithPush's hooks, or nil (push.go)
	resume chan error   // a worker hands a parked subscriber back (push.go)
	done   <-chan struct{}
	quit   atomic.Bool // done fired while parked: a worker hands it back (push.go)
	client *retention.Client
	next   uint64 // next seq to deliver
	hint   uint64 // tail position expected for next
	live   bool   // has reached the head of the tail at least once
	sent   bool   // has sent an event (other than #info)
	info   bool   // has sent #info OutdatedCursor
	batch  [subscriberBatch]*item
}

// Follow is Subscribe with every option (see Subscription).
func (l *Log) Follow(ctx context.Context, s Subscription, send func(*gatewayv1.Event) error) error {
	select {
	case <-l.done:
		return ErrClosed
	default:
	}
	if s.Cursor != nil && *s.Cursor >= store.MaxSeq {
		return fmt.Errorf("cursor %d is not below 2^53: %w", *s.Cursor, ErrFutureCursor)
	}
	// Fix the starting point against a consistent (oldest, latest) pair.
	l.pubMu.Lock()
	latest := l.tail.latestSeq()
	oldest := l.oldestLocked()
	l.pubMu.Unlock()
	if oldest == 0 {
		oldest = latest + 1 // nothing retained
	}
	if s.Cursor != nil && *s.Cursor > latest {
		return fmt.Errorf("cursor %d is ahead of the latest seq %d; resume with a cursor you received: %w",
			*s.Cursor, latest, ErrFutureCursor)
	}
	sub := &subscriber{l: l, s: s, send: send}
	sub.idle, _ = ctx.Value(idleKey{}).(func() error) // WithIdle
	if p, ok := ctx.Value(pushKey{}).(Push); ok && sub.idle != nil {
		sub.push, sub.resume = p, make(chan error, 1)
	}
	if s.ClientKey != "" {
		sub.client = l.ret.Touch(s.ClientKey, s.Cursor, l.opts.Now())
		defer func() { l.ret.Release(sub.client, l.opts.Now()) }()
	}
	l.subs.Add(1)
	defer l.subs.Add(-1)
	if l.m != nil {
		l.m.Subscribers.Inc()
		defer l.m.Subscribers.Dec()
	}
	if s.OnStart != nil {
		if err := s.OnStart(latest); err != nil {
			return err
		}
	}
	switch {
	case s.Cursor == nil:
		sub.next = latest + 1
	case *s.Cursor == 0:
		sub.next = oldest
	case *s.Cursor < oldest:
		if err := sub.outdated(*s.Cursor, oldest); err != nil {
			return err
		}
	default:
		sub.next = *s.Cursor
	}
	return sub.run(ctx)
}

// outdated sends the #info OutdatedCursor event and moves to the oldest
// retained seq (the whole window follows).
func (sub *subscriber) outdated(cursor, oldest uint64) error {
	if sub.l.m != nil {
		sub.l.m.OutdatedCursor.Inc()
	}
	sub.next, sub.info = oldest, true
	return sub.send(outdatedEvent(sub.l.opts.Now(), cursor, oldest))
}

// outdatedEvent is the #info OutdatedCursor event for a cursor older than
// the oldest retained seq.
func outdatedEvent(now time.Time, cursor, oldest uint64) *gatewayv1.Event {
	return &gatewayv1.Event{
		Kind: KindInfo,
		Time: timestamppb.New(now),
		Name: InfoOutdatedCursor,
		Message: fmt.Sprintf("cursor %d is older than the oldest retained event %d: events were pruned; "+
			"resync from the snapshot (StreamSnapshot, GET /v1/events:streamSnapshot) and resume from its seq; "+
			"the whole retained window follows", cursor, oldest),
	}
}

// run delivers until the subscription ends. The wait for more costs one
// two-way select on channels of its own and the tail's: ctx.Done() is read
// once (a context deep in values walks its chain on every call), and the
// log's Close closes the tail's channel instead of a third, shared one
// (issue 25: 1,000 subscribers waiting on one channel contend for its
// lock on every wake).
func (sub *subscriber) run(ctx context.Context) error {
	l := sub.l
	done := ctx.Done()
	sub.done = done
	for {
		select {
		case <-done:
			return ctx.Err()
		default:
		}
		if ready, wake := l.tail.waitFor(sub.next); !ready && sub.live {
			// Caught up (the common case at a wake-up's end): no lock.
			if err := sub.wait(ctx, done, wake); err != nil {
				return err
			}
			continue
		}
		n, pos, res, wake := l.tail.read(sub.next, sub.hint, sub.batch[:])
		switch res {
		case readItems:
			sub.hint = pos
			if err := sub.deliver(sub.batch[:n]); err != nil {
				return err
			}
		case readCaughtUp:
			sub.live = true
			if err := sub.wait(ctx, done, wake); err != nil {
				return err
			}
		case readBehind:
			if sub.live {
				if l.m != nil {
					l.m.ConsumerTooSlow.Inc()
				}
				return fmt.Errorf("next seq %d left the in-memory tail while the subscriber was live; "+
					"resume with the last seq processed: %w", sub.next, ErrConsumerTooSlow)
			}
			if err := sub.replayPage(ctx); err != nil {
				return err
			}
		}
	}
}

// wait calls the idle hook (everything committed so far was sent), then
// waits for the next publish, the subscription's end or the log's close;
// with Push, it parks with the log's workers instead (push.go) until one
// hands it back.
func (sub *subscriber) wait(ctx context.Context, done <-chan struct{}, wake <-chan struct{}) error {
	if sub.idle != nil {
		if err := sub.idle(); err != nil {
			return err
		}
	}
	if sub.push != nil && sub.push.Pushable() {
		if parked, err := sub.parkWait(ctx); parked {
			return err // nil: the run loop looks again
		}
	}
	select {
	case <-wake:
	case <-done:
		return ctx.Err()
	}
	if ready, _ := sub.l.tail.waitFor(sub.next); !ready && sub.l.isClosed() {
		return ErrClosed
	}
	return nil
}

// deliver sends the matching items of a tail batch and clears the batch.
func (sub *subscriber) deliver(items []*item) error {
	for i, it := range items {
		items[i] = nil
		if it.gapTo > 0 {
			if err := sub.sendGap(it.seq, it.gapTo); err != nil {
				clear(items[i+1:])
				return err
			}
			continue
		}
		sub.next = it.seq + 1
		if !sub.s.Filter.match(sub.s.Tenant, it) {
			continue
		}
		if err := sub.send(it.ev); err != nil {
			clear(items[i+1:])
			return err
		}
		sub.sent = true
		sub.client.Deliver(it.seq)
	}
	return nil
}

// replayPage reads one page at sub.next from the store. Pruning is
// detected through the floor the pruner raises before deleting: if the
// floor passed sub.next, events may be missing, so the page is not used.
func (sub *subscriber) replayPage(ctx context.Context) error {
	l := sub.l
	hi := l.tail.latestSeq() // every event <= hi is committed before the read
	q := store.EventQuery{From: sub.next, Limit: l.opts.ReplayPage, Tenant: sub.s.Tenant,
		DocID: sub.s.Filter.DocumentID, Kinds: sub.s.Filter.Kinds}
	recs, err := l.st.ReadEvents(ctx, q)
	if err != nil {
		return fmt.Errorf("eventlog: replay from %d: %w", sub.next, err)
	}
	l.pubMu.Lock()
	oldest := l.oldestLocked()
	l.pubMu.Unlock()
	if len(recs) == 0 || recs[0].Seq != sub.next {
		// The page may start late because events were filtered out or
		// because they were pruned, by this replica (the floor above) or
		// by another sharing the store: the store's oldest seq after the
		// read tells (prunes only raise it).
		so, err := l.storeOldest(ctx)
		if err != nil {
			return fmt.Errorf("eventlog: replay from %d: %w", sub.next, err)
		}
		oldest = max(oldest, so)
	}
	if oldest > sub.next {
		if sub.sent {
			if l.m != nil {
				l.m.ConsumerTooSlow.Inc()
			}
			return fmt.Errorf("events from seq %d were pruned while replaying (oldest is now %d); "+
				"resync from the snapshot: %w", sub.next, oldest, ErrConsumerTooSlow)
		}
		// Nothing sent yet: the request is re-judged against the new window.
		if sub.s.Cursor != nil && *sub.s.Cursor != 0 && !sub.info {
			return sub.outdated(*sub.s.Cursor, oldest)
		}
		sub.next = oldest
		return nil
	}
	for i := range recs {
		r := &recs[i]
		if r.Seq > hi {
			// Committed but not yet published: the tail delivers it, so no
			// subscriber ever sees a seq above Latest().
			sub.next = r.Seq
			return nil
		}
		ev, err := r.Decode()
		if err != nil {
			return fmt.Errorf("eventlog: replay: %w", err)
		}
		sub.next = r.Seq + 1
		if err := sub.send(ev); err != nil {
			return err
		}
		sub.sent = true
		sub.client.Deliver(r.Seq)
	}
	if len(recs) < q.Limit {
		// A short page holds every matching event up to hi.
		sub.next = max(sub.next, hi+1)
	}
	return nil
}
