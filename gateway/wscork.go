package gateway

import (
	"bufio"
	"net"
	"net/http"
	"sync"
)

// corkMaxBytes bounds what a corked WebSocket connection holds before its
// goroutine writes anyway (a replay from the store sends many events
// before the subscriber is caught up).
const corkMaxBytes = 64 << 10

// corkConn is a WebSocket subscriber's connection as coder/websocket
// writes to it. coder/websocket flushes every message with one write(2);
// at 1,000 subscribers that syscall was most of the fan-out's CPU (issue
// 25). While corked, writes are collected instead, and flush writes them
// with one write(2): the subscriber's goroutine corks before the frames of
// an event-log batch and flushes when the log has nothing more for it
// (eventlog.WithIdle), so the frames of a batch leave together, in order,
// as separate WebSocket messages (the bytes on the wire are the same).
//
// Only the corking goroutine writes collected bytes (flush). Writes from
// other goroutines (the keep-alive ping) append while corked and go out
// with the batch, else directly: a ping may then overtake a batch being
// flushed, never split a frame (each Write is one net.Conn.Write, which
// the runtime keeps whole, and coder/websocket serializes its frames). mu
// guards the buffer only: no write happens under it. One corner: the close
// frame coder/websocket sends in reply to a client's close while a batch
// is corked waits for the batch; the reader's error closes the connection
// at once (discardWSReads), so such a client may see the TCP close without
// the reply, as when it closes during a frame write.
type corkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte // from corkBufs while corked
}

// Write collects p while corked, else writes it.
func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.corked {
		if c.buf == nil {
			c.buf = (*corkBufs.Get().(*[]byte))[:0]
		}
		c.buf = append(c.buf, p...)
		c.mu.Unlock()
		return len(p), nil
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// full reports whether the collected bytes reached corkMaxBytes: the
// corking goroutine then flushes without waiting for the batch's end.
func (c *corkConn) full() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buf) >= corkMaxBytes
}

// cork starts collecting writes.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// flush stops collecting and writes what was collected.
func (c *corkConn) flush() error {
	c.mu.Lock()
	c.corked = false
	held := c.take()
	c.mu.Unlock()
	if len(held) == 0 {
		return nil
	}
	_, err := c.Conn.Write(held)
	if cap(held) <= 2*corkMaxBytes {
		held = held[:0] // written: another batch reuses it
		corkBufs.Put(&held)
	}
	return err
}

// corkBufs are the batch buffers of every corked connection: one is held
// only from a batch's first frame to its flush, so 1,000 idle subscribers
// hold none.
var corkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// take returns the collected bytes and empties the buffer (mu held).
func (c *corkConn) take() []byte {
	held := c.buf
	c.buf = nil
	return held
}

// corkHijacker hands coder/websocket (websocket.Accept finds Hijack
// before it unwraps) the hijacked connection as a corkConn, with a write
// buffer over it; the read side is net/http's, with what it buffered.
type corkHijacker struct {
	http.ResponseWriter
	conn *corkConn // set by Hijack
}

func (h *corkHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil { // the 101 response, if still buffered
		_ = nc.Close()
		return nil, nil, err
	}
	h.conn = &corkConn{Conn: nc}
	brw.Writer.Reset(h.conn) // net/http's buffer, now writing to the corkConn
	return h.conn, brw, nil
}

func (h *corkHijacker) Unwrap() http.ResponseWriter { return h.ResponseWriter }
