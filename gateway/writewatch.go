package gateway

import (
	"sync"
	"sync/atomic"
	"time"
)

// writeWatch bounds every write of one connection by timeout without a
// timer or context per write (the WebSocket event route writes one frame
// per event per subscriber; a context.WithTimeout per frame cost a third
// of its CPU, issue 25). Like sendWatchdog (stuck.go) it records when the
// pending write began; one timer per connection checks it and re-arms
// itself, so a write costs two atomic stores and a clock read. When a
// write has been pending for timeout the watch calls cut once (which
// closes the connection, failing the write) and reports fired.
type writeWatch struct {
	timeout time.Duration
	cut     func()
	base    time.Time    // monotonic origin of pending
	pending atomic.Int64 // time.Since(base)+1 when the current write began; 0: none
	fired   atomic.Bool

	mu    sync.Mutex // timer and done; taken by the timer and stop only
	timer *time.Timer
	done  bool
}

// newWriteWatch starts a watch that calls cut when a write stays pending
// for timeout.
func newWriteWatch(timeout time.Duration, cut func()) *writeWatch {
	w := &writeWatch{timeout: timeout, cut: cut, base: time.Now()}
	w.mu.Lock()
	w.timer = time.AfterFunc(timeout, w.check)
	w.mu.Unlock()
	return w
}

// begin and end bracket one write.
func (w *writeWatch) begin() { w.pending.Store(int64(time.Since(w.base)) + 1) }
func (w *writeWatch) end()   { w.pending.Store(0) }

// check runs on the timer: it cuts if the pending write began timeout ago
// or earlier, else re-arms for when it would.
func (w *writeWatch) check() {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	next := w.timeout
	if began := w.pending.Load(); began != 0 {
		blocked := time.Since(w.base) - time.Duration(began-1)
		if blocked >= w.timeout {
			w.fired.Store(true)
			w.done = true
			w.mu.Unlock()
			w.cut() // outside the lock: it closes a connection
			return
		}
		next = w.timeout - blocked
	}
	w.timer.Reset(next)
	w.mu.Unlock()
}

// stop ends the watch and reports whether it cut.
func (w *writeWatch) stop() bool {
	w.mu.Lock()
	w.done = true
	w.timer.Stop()
	w.mu.Unlock()
	return w.fired.Load()
}
