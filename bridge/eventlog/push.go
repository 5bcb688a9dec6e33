package eventlog

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
)

// Push lets a caught-up subscription be served by the log's fan-out
// workers instead of its own goroutine (issue 25: at 1,000 WebSocket
// subscribers, waking every subscriber's goroutine on each commit, its
// select and its scheduling were a fifth of the fan-out's CPU). Once the
// subscriber has sent everything committed and called the idle hook, its
// goroutine parks; on the next publish a worker reads the subscriber's
// new items, calls send for each as the goroutine would (the same send,
// so whatever wraps it still sees every message), then Flush. The
// goroutine takes the subscription back whenever a worker cannot finish a
// turn without blocking or the subscription must end: Flush could not
// write everything (a slow consumer: the goroutine's idle hook then
// writes under its own deadline), send or Flush failed, the subscriber
// fell behind the tail, the log closed or the subscription's context
// ended. send and Flush are never called concurrently: one goroutine owns
// the subscription at a time, and the hand-overs order their memory.
type Push interface {
	// Pushable reports, on the subscriber's goroutine just before it
	// parks, whether workers may serve it now; false: it waits on its own
	// goroutine as without Push.
	Pushable() bool
	// Begin is called on a worker before its turn's first send: the sends
	// until Flush must not block (queue, do not write).
	Begin()
	// Flush writes what the turn's sends queued without blocking and
	// reports whether all of it was written; false leaves the rest for
	// the idle hook, which the subscriber's goroutine calls next. An error
	// ends the subscription with it.
	Flush() (bool, error)
}

// WithPush returns ctx carrying p: a subscription followed with that
// context (Follow, Subscribe) is served by the log's fan-out workers while
// it is caught up and p.Pushable (see Push). It needs WithIdle too (the
// goroutine's write of what a worker could not).
func WithPush(ctx context.Context, p Push) context.Context {
	return context.WithValue(ctx, pushKey{}, p)
}

type pushKey struct{}

// pushTurnItems bounds one worker turn of one subscriber: a subscriber
// with more to read than this after a publish (a large commit) goes back
// to its goroutine, which may block while it writes.
const pushTurnItems = 2 * subscriberBatch

// fanout is the log's set of parked subscribers and its workers.
type fanout struct {
	l       *Log
	workers int
	kick    chan struct{} // capacity 1: a publish happened, or a subscriber parked late
	help    chan *round   // unbuffered: an idle worker joins a round

	mu      sync.Mutex
	parked  []*subscriber
	closed  bool
	started bool // the workers run (startLocked)
}

// round is one publish's share of parked subscribers, served by every
// worker that joins it.
type round struct {
	subs []*subscriber
	next atomic.Int64
}

func newFanout(l *Log) *fanout {
	return &fanout{l: l, workers: max(1, runtime.GOMAXPROCS(0)), kick: make(chan struct{}, 1), help: make(chan *round)}
}

// startLocked runs the workers on first use (a log without push
// subscribers has none). It runs under mu, after the closed check: Close
// marks the fan-out closed under mu before it waits on the log's
// WaitGroup, so no worker is added once that wait may have begun (a
// WaitGroup's Add must not race its Wait at zero).
func (f *fanout) startLocked() {
	if f.started {
		return
	}
	f.started = true
	for range f.workers {
		f.l.wg.Add(1)
		go f.worker()
	}
}

// wake asks a worker to serve the parked subscribers (after a publish).
func (f *fanout) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// park hands sub to the workers, started on first use; false when the
// log is closing (the goroutine keeps it). The check after the append closes the race with a
// publish: the publisher stores latest before it wakes the workers, so
// either that wake-up finds sub parked, or sub sees the new latest here.
func (f *fanout) park(sub *subscriber) bool {
	next := sub.next // read before a worker may own sub
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return false
	}
	f.startLocked()
	f.parked = append(f.parked, sub)
	f.mu.Unlock()
	if ready, _ := f.l.tail.waitFor(next); ready {
		f.wake()
	}
	return true
}

// parkAll is park for the subscribers a worker served in one round, under
// one lock.
func (f *fanout) parkAll(subs []*subscriber) {
	if len(subs) == 0 {
		return
	}
	next := subs[0].next // the lowest next, read while this worker owns them
	for _, sub := range subs[1:] {
		next = min(next, sub.next)
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		for _, sub := range subs {
			sub.resume <- nil // the goroutine sees the log closed
		}
		return
	}
	f.parked = append(f.parked, subs...)
	f.mu.Unlock()
	// As in park: a publish during the round, or a subscription that ended
	// while a worker held it (its goroutine sets quit, then fails to take
	// it back: unpark), needs a round now. quit is an atomic: sub may be
	// another worker's again already.
	if next <= f.l.tail.latestSeq() {
		f.wake()
		return
	}
	for _, sub := range subs {
		if sub.quit.Load() {
			f.wake()
			return
		}
	}
}

// unpark takes sub back from the parked list for its goroutine; false
// when a worker holds it (the worker hands it back).
func (f *fanout) unpark(sub *subscriber) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, s := range f.parked {
		if s == sub {
			last := len(f.parked) - 1
			f.parked[i] = f.parked[last]
			f.parked[last] = nil
			f.parked = f.parked[:last]
			return true
		}
	}
	return false
}

// take empties the parked list into a round (nil when empty).
func (f *fanout) take() *round {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.parked) == 0 {
		return nil
	}
	r := &round{subs: f.parked}
	f.parked = make([]*subscriber, 0, cap(r.subs))
	return r
}

// close hands every parked subscriber back (each then sees the log
// closed) and makes park refuse.
func (f *fanout) close() {
	f.mu.Lock()
	f.closed = true
	subs := f.parked
	f.parked = nil
	f.mu.Unlock()
	for _, sub := range subs {
		sub.resume <- nil
	}
}

// worker serves rounds until the log closes: on a wake-up it takes the
// parked subscribers and offers the round to idle workers.
func (f *fanout) worker() {
	defer f.l.wg.Done()
	var again []*subscriber
	for {
		var r *round
		select {
		case <-f.kick:
			if r = f.take(); r == nil {
				continue
			}
			for range f.workers - 1 {
				select {
				case f.help <- r:
				default:
				}
			}
		case r = <-f.help:
		case <-f.l.done:
			return
		}
		again = r.serve(again[:0])
		f.parkAll(again)
		clear(again)
	}
}

// serve runs a turn for each subscriber of the round not taken by another
// worker; those to park again are appended to again.
func (r *round) serve(again []*subscriber) []*subscriber {
	for {
		i := int(r.next.Add(1)) - 1
		if i >= len(r.subs) {
			return again
		}
		sub := r.subs[i]
		r.subs[i] = nil
		if sub.turn() {
			again = append(again, sub)
		} // else handed back to its goroutine
	}
}

// turn delivers what the tail has for sub on a worker and reports
// whether sub stays with the workers; otherwise it was handed back.
func (sub *subscriber) turn() bool {
	if sub.quit.Load() {
		return sub.handBack(nil) // the goroutine returns ctx.Err()
	}
	l := sub.l
	began := false
	for sent := 0; ; {
		ready, _ := l.tail.waitFor(sub.next)
		if !ready {
			break
		}
		if sent >= pushTurnItems {
			return sub.handBack(nil) // more than a turn: the goroutine writes as it goes
		}
		n, pos, res, _ := l.tail.read(sub.next, sub.hint, sub.batch[:])
		if res != readItems {
			return sub.handBack(nil) // behind: the goroutine reports it
		}
		if !began {
			sub.push.Begin()
			began = true
		}
		sub.hint = pos
		if err := sub.deliver(sub.batch[:n]); err != nil {
			return sub.handBack(err)
		}
		sent += n
	}
	if !began {
		return true // nothing new (woken for another subscriber's items)
	}
	if ok, err := sub.push.Flush(); err != nil || !ok {
		return sub.handBack(err)
	}
	return true
}

// handBack returns sub to its goroutine with err (nil: carry on there).
func (sub *subscriber) handBack(err error) bool {
	sub.resume <- err
	return false
}

// parkWait parks a caught-up subscriber with the workers and waits until
// one hands it back (nil: carry on in run) or the subscription ends.
func (sub *subscriber) parkWait(ctx context.Context) (parked bool, err error) {
	f := sub.l.fan
	if !f.park(sub) {
		return false, nil
	}
	select {
	case err := <-sub.resume:
		return true, err
	case <-sub.done:
		sub.quit.Store(true) // before unpark: a worker that re-parks sub sees it (parkAll)
		if f.unpark(sub) {
			return true, ctx.Err()
		}
		if err := <-sub.resume; err != nil { // a worker has it: it hands back
			return true, err
		}
		return true, ctx.Err()
	}
}
