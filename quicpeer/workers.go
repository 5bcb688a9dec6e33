package quicpeer

import (
	"sync"
	"sync/atomic"
	"time"
)

// entityWorkers runs the session's incoming entity streams on reused
// goroutines: a fresh goroutine would grow its stack for header decoding
// on every stream. acceptLoop hands a stream to a parked worker or starts
// a new one; their number is bounded by the concurrent-stream limit.
//
// A parked worker waits on one channel receive only (no timer, no select:
// at churn rates a three-way select with a timer reset per stream was ~3%
// of an entity's CPU). Idle workers are retired by a trim that runs every
// workerIdle while any worker lives: the fewest workers parked at any
// moment since the previous trim were not needed in that period, so that
// many get a nil stream and exit. A worker idle for a whole period is
// retired within two periods; a session that ends closes work, which
// ends every parked worker.
type entityWorkers struct {
	handle func(receiveStream) // the session's handleIncoming
	work   chan receiveStream  // unbuffered: a send reaches a parked worker or fails
	parked atomic.Int32        // workers waiting on work
	low    atomic.Int32        // fewest parked since the last trim

	mu      sync.Mutex // guards below; no send on work after closed
	alive   int        // workers started and not yet exited
	closed  bool
	trimmer *time.Timer // nil while no trim is scheduled
}

func newEntityWorkers(handle func(receiveStream)) *entityWorkers {
	return &entityWorkers{handle: handle, work: make(chan receiveStream)}
}

// dispatch runs rs on a parked worker or a new one (acceptLoop only).
func (w *entityWorkers) dispatch(rs receiveStream) {
	select {
	case w.work <- rs:
		return
	default:
	}
	w.mu.Lock()
	w.alive++
	if w.trimmer == nil {
		w.low.Store(w.parked.Load())
		w.trimmer = time.AfterFunc(workerIdle, w.trim)
	}
	w.mu.Unlock()
	go w.run(rs)
}

// run handles rs, then further streams, until it gets a nil stream (a
// trim, or work closed at the session's end).
func (w *entityWorkers) run(rs receiveStream) {
	for rs != nil {
		w.handle(rs)
		w.parked.Add(1)
		rs = <-w.work
		p := w.parked.Add(-1)
		for l := w.low.Load(); p < l && !w.low.CompareAndSwap(l, p); l = w.low.Load() {
		}
	}
	w.mu.Lock()
	w.alive--
	w.mu.Unlock()
}

// trim retires the workers no stream needed since the last trim and
// schedules the next trim while workers are left.
func (w *entityWorkers) trim() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	for range w.low.Load() {
		if !w.retireOne() {
			break // none parked any more
		}
	}
	w.low.Store(w.parked.Load())
	if w.alive == 0 {
		w.trimmer = nil
		return
	}
	w.trimmer.Reset(workerIdle)
}

// retireOne sends a parked worker the nil stream that ends it; false: none
// was parked. The caller holds mu (no send after close).
func (w *entityWorkers) retireOne() bool {
	select {
	case w.work <- nil:
		return true
	default:
		return false
	}
}

// close ends every parked worker and any trim to come (acceptLoop, at the
// session's end); busy workers exit when their stream is done.
func (w *entityWorkers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.trimmer != nil {
		w.trimmer.Stop()
	}
	close(w.work)
}
