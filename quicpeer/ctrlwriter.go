package quicpeer

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ctrlWriter coalesces the frames that goroutines write to stream 0
// (Section 5.1): while one Write is in flight, frames queued by other
// goroutines are appended to a second buffer and go out together in the
// next Write. An idle writer writes a frame at once (no added latency);
// each caller returns once the Write that carried its frame returned, with
// that Write's error (the backpressure of stream-0 flow control reaches
// every caller, as with one Write per frame). Frames leave in the order
// they were appended, so a caller that appends under begin/commit while it
// applies a state change keeps the wire order equal to the state order.
//
// The goroutine whose frame finds no Write in flight becomes the flusher;
// it writes batches until its own frame is written, then hands the role to
// a waiting caller, so no caller writes for others indefinitely. The queue
// holds at most ctrlBatchMax octets (plus one frame): callers wait for room
// before they append. Steady state does not allocate: the two buffers are
// swapped and reused.
type ctrlWriter struct {
	w        io.Writer
	lastSent *atomic.Int64 // unix nanos of the last successful Write

	mu      sync.Mutex
	cond    sync.Cond // signalled after every Write
	buf     []byte    // frames appended since the last Write started
	spare   []byte    // the buffer of the Write in flight (or idle)
	writing bool      // a flusher owns the Write
	fill    uint64    // batch number that buf will carry
	written uint64    // highest batch number whose Write returned
	errGen  uint64    // first batch whose Write failed (0: none)
	err     error     // its error; later batches report it without writing
}

func newCtrlWriter(w io.Writer, lastSent *atomic.Int64) *ctrlWriter {
	c := &ctrlWriter{
		w:        w,
		lastSent: lastSent,
		buf:      make([]byte, 0, 256),
		spare:    make([]byte, 0, 256),
		fill:     1,
	}
	c.cond.L = &c.mu
	return c
}

// begin locks the queue, waiting while it is full, and returns the
// buffer to append frames to. The caller must end with commit or cancel;
// between them it may take s.mu (lock order: queue, then s.mu).
func (c *ctrlWriter) begin() []byte {
	c.mu.Lock()
	for c.writing && len(c.buf) >= ctrlBatchMax {
		c.cond.Wait()
	}
	return c.buf
}

// cancel unlocks the queue without queueing anything.
func (c *ctrlWriter) cancel() { c.mu.Unlock() }

// commit queues b (begin's buffer with frames appended), unlocks, and
// returns once those frames were written, with the error of the Write
// that carried them.
func (c *ctrlWriter) commit(b []byte) error {
	c.buf = b
	gen := c.fill
	for {
		if c.written >= gen {
			err := c.errFor(gen)
			c.mu.Unlock()
			return err
		}
		if !c.writing {
			c.flush(gen)
			err := c.errFor(gen)
			c.mu.Unlock()
			return err
		}
		c.cond.Wait()
	}
}

// flush writes batches until batch gen is written; c.mu is held on entry
// and on return (it is released during each Write).
func (c *ctrlWriter) flush(gen uint64) {
	c.writing = true
	for c.written < gen {
		out := c.buf
		c.buf, c.spare = c.spare[:0], out
		g := c.fill
		c.fill++
		failed := c.errGen != 0
		c.mu.Unlock()
		var err error
		if !failed {
			_, err = c.w.Write(out)
			if err == nil {
				c.lastSent.Store(time.Now().UnixNano())
			}
		}
		c.mu.Lock()
		if err != nil && c.errGen == 0 {
			c.errGen, c.err = g, err
		}
		c.written = g
		c.cond.Broadcast()
	}
	// A caller whose frames were queued meanwhile was woken by the last
	// Broadcast; it finds writing false once it holds c.mu and takes over.
	c.writing = false
}

// errFor is the result of batch gen: nil, or the first failed Write's
// error when gen was at or after it (stream 0 does not recover).
func (c *ctrlWriter) errFor(gen uint64) error {
	if c.errGen != 0 && gen >= c.errGen {
		return c.err
	}
	return nil
}

// writeFrame appends one frame with app and writes it to stream 0.
func (c *ctrlWriter) writeFrame(app func([]byte) []byte) error {
	return c.commit(app(c.begin()))
}
