package peer

import (
	"sync"
	"time"
)

// watch runs the completion-policy timeouts (docs/profile.md 5) of a
// session's running attempts on one timer instead of a timer per attempt:
// an attempt registers its deadline (a map entry, no allocation once the
// map has grown) and deregisters it when it ends, and the timer is set to
// the earliest deadline only when a new one is earlier than the one it is
// set to. Almost every attempt ends long before its deadline (300 s by
// default), so the timer rarely fires; when it does, it times out the due
// attempts and is set to the earliest deadline left.
type watch struct {
	mu      sync.Mutex
	on      map[*entity]watchEntry
	t       *time.Timer
	at      time.Time // when t fires; zero while it is not set
	now     func() time.Time
	stopped bool
}

// watchEntry is an attempt's deadline; gen tells a re-armed or later
// attempt of the same entity from the one registered (entity.timeout).
type watchEntry struct {
	at  time.Time
	gen uint64
}

// add registers e's deadline at for its attempt gen (replacing any).
func (w *watch) add(e *entity, at time.Time, gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if w.on == nil {
		w.on = map[*entity]watchEntry{}
	}
	w.on[e] = watchEntry{at: at, gen: gen}
	if w.at.IsZero() || at.Before(w.at) {
		w.setLocked(at)
	}
}

// remove deregisters e; the timer is left as it is (a spurious wake-up
// finds nothing due).
func (w *watch) remove(e *entity) {
	w.mu.Lock()
	delete(w.on, e)
	w.mu.Unlock()
}

func (w *watch) setLocked(at time.Time) {
	w.at = at
	d := max(at.Sub(w.now()), 0)
	if w.t == nil {
		w.t = time.AfterFunc(d, w.fire)
		return
	}
	w.t.Reset(d)
}

// fire times out every attempt whose deadline has passed and sets the
// timer to the earliest deadline left.
func (w *watch) fire() {
	type due struct {
		e   *entity
		gen uint64
	}
	var ends []due
	w.mu.Lock()
	now := w.now()
	var next time.Time
	for e, en := range w.on {
		if !now.Before(en.at) {
			ends = append(ends, due{e, en.gen})
			delete(w.on, e)
		} else if next.IsZero() || en.at.Before(next) {
			next = en.at
		}
	}
	w.at = time.Time{}
	if !next.IsZero() && !w.stopped {
		w.setLocked(next)
	}
	w.mu.Unlock()
	for _, d := range ends {
		d.e.timeout(d.gen)
	}
}

// stop ends the watch (the session closed): nothing times out any more.
func (w *watch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.t != nil {
		w.t.Stop()
	}
}
