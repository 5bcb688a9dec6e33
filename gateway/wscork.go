package gateway

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"

	"github.com/pipestream/gateway/gateway/h2guard"
)

// corkMaxBytes bounds what a corked WebSocket connection holds before its
// goroutine writes anyway (a replay from the store sends many events
// before the subscriber is caught up).
const corkMaxBytes = 64 << 10

// errCloseSent is writeData's answer once a close frame went out: RFC
// 6455 5.5.1, no data frame after a close frame.
var errCloseSent = errors.New("websocket: a close frame was sent; no data frame may follow")

// corkConn is a WebSocket subscriber's hijacked connection, the one way
// out for every frame the server sends on it (issue 25: at 1,000
// subscribers the write(2) per frame and coder/websocket's two
// channel-based locks per message were half of the fan-out's CPU):
//
//   - event frames are the subscriber goroutine's (the owner's): writeData
//     appends a whole, pre-framed binary message (wsBinaryMessage: the
//     event cache frames each event once for every subscriber) to the
//     pending bytes, no coder/websocket on the way;
//   - coder/websocket still does the handshake, reading, pings, pongs and
//     close frames; it writes them through Write, which queues them in
//     the same pending bytes, so the wire order is the order queued;
//   - while the owner corks (the frames of one event-log batch), pending
//     bytes wait; flush writes them with one write(2) when the log has
//     nothing more for the subscriber (eventlog.WithIdle). Uncorked, a
//     writer drains at once.
//
// Write watches the frames coder/websocket writes (frameScan): once a
// close frame is queued, writeData refuses, so no data frame ever
// follows a close frame on the wire (coder/websocket's own rule, which it
// can no longer enforce for frames it does not write).
//
// No write happens under mu: mu guards the pending bytes and the flags.
// Writes to the connection are serialized by wsem, taken by whichever
// goroutine drains (as net.Conn serializes its own writes); a drainer
// writes what every goroutine queued, in order. The owner's drain runs
// under its write watch (wsSink), so a consumer that stops reading cuts
// the connection, which fails any write waiting behind it. One corner,
// as with any batching: the close frame coder/websocket sends in reply to
// a client's close while a batch is corked waits for the batch's flush;
// the reader's error closes the connection at once (discardWSReads), so
// such a client may see the TCP close without the reply, as when it
// closes during a frame write.
type corkConn struct {
	net.Conn
	out  io.Writer     // where drain writes: Conn, or the socket under its wrappers (rawWriter)
	wsem chan struct{} // capacity 1: held while writing to out
	try  *tryWriter    // out's socket for writes that must not block (tryFlush); nil: none

	mu        sync.Mutex
	corked    bool      // the owner collects a batch: leave pending to its flush
	closeSent bool      // a close frame is queued: writeData refuses
	scan      frameScan // frame boundaries of what coder/websocket writes
	buf       *[]byte   // pending bytes, from corkBufs (nil: none)
}

func newCorkConn(nc net.Conn) *corkConn {
	return &corkConn{Conn: nc, out: nc, wsem: make(chan struct{}, 1)}
}

// rawWriter is the connection under the gateway's own wrappers of a
// hijacked HTTP/1 connection, for the frames' writes (issue 25: each
// wrapper's Write was one more cold struct, and the HTTP/2 guard's a
// channel send and receive, per write at 1,000 subscribers). It passes
// the request smuggling guard (which only reads), the connection cap's
// wrapper (which only counts closes) and the HTTP/2 guard of a connection
// that is not HTTP/2 (which has no frames to follow or cut); anything
// else, TLS included, is written as it is.
func rawWriter(nc net.Conn) io.Writer {
	for {
		switch c := nc.(type) {
		case *guardConn:
			nc = c.Conn
		case *cappedConn:
			nc = c.Conn
		case *h2guard.Conn:
			raw, ok := c.HTTP1Conn()
			if !ok {
				return nc
			}
			nc = raw
		default:
			return nc
		}
	}
}

// Write queues coder/websocket's frames (pings, pongs, close, the error
// frame), then writes them unless the owner's batch is open.
func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.scan.feed(p) {
		c.closeSent = true
	}
	c.queue(p)
	corked := c.corked
	c.mu.Unlock()
	if corked {
		return len(p), nil // out with the batch
	}
	if err := c.drain(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeData queues a whole data message (the owner's); the caller
// flushes, now or at the end of its batch.
func (c *corkConn) writeData(msg []byte) error {
	_, err := c.queueData(msg, false)
	return err
}

// queueData is writeData under one lock with the batch's bookkeeping:
// with hold it also corks (cork), and it reports whether the pending
// bytes reached corkMaxBytes (full).
func (c *corkConn) queueData(msg []byte, hold bool) (full bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeSent {
		return false, errCloseSent
	}
	if hold {
		c.corked = true
	}
	c.queue(msg)
	return len(*c.buf) >= corkMaxBytes, nil
}

// queue appends p to the pending bytes (mu held).
func (c *corkConn) queue(p []byte) {
	if c.buf == nil {
		c.buf = corkBufs.Get().(*[]byte)
	}
	*c.buf = append(*c.buf, p...)
}

// full reports whether the pending bytes reached corkMaxBytes: the
// corking goroutine then flushes without waiting for the batch's end.
func (c *corkConn) full() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf != nil && len(*c.buf) >= corkMaxBytes
}

// cork starts a batch: pending bytes wait for flush.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// flush ends the batch and writes what is pending.
func (c *corkConn) flush() error {
	c.mu.Lock()
	c.corked = false
	c.mu.Unlock()
	return c.drain()
}

// drain writes the pending bytes until none are left or a batch opens,
// one write(2) per turn, holding wsem (not mu) while it writes.
func (c *corkConn) drain() error {
	c.wsem <- struct{}{}
	defer func() { <-c.wsem }()
	for {
		c.mu.Lock()
		if c.corked {
			c.mu.Unlock()
			return nil
		}
		held := c.buf
		c.buf = nil
		c.mu.Unlock()
		if held == nil {
			return nil
		}
		if len(*held) == 0 { // only empty writes were queued
			corkBufs.Put(held)
			return nil
		}
		_, err := c.out.Write(*held)
		if cap(*held) <= 2*corkMaxBytes {
			*held = (*held)[:0] // written: another batch reuses it
			corkBufs.Put(held)
		}
		if err != nil {
			return err
		}
	}
}

// tryFlush ends the batch and writes what is pending with one write(2)
// that does not wait: on a fan-out worker (eventlog.Push), which serves
// many subscribers and must not block on one. It reports whether all of
// it was written; if not (the socket's buffer is full, another goroutine
// is writing, or the write failed), what is left stays pending, in
// order, for the owner's flush, which waits under its write watch and
// sees the error, if any.
func (c *corkConn) tryFlush() bool {
	if c.try == nil {
		return false
	}
	select {
	case c.wsem <- struct{}{}:
	default:
		return false // a ping or close frame is being written
	}
	defer func() { <-c.wsem }()
	c.mu.Lock()
	c.corked = false
	held := c.buf
	c.buf = nil
	c.mu.Unlock()
	if held == nil {
		return true
	}
	n := c.try.write(*held)
	if n == len(*held) {
		if cap(*held) <= 2*corkMaxBytes {
			*held = (*held)[:0]
			corkBufs.Put(held)
		}
		return true
	}
	// Put the rest back before anything queued meanwhile.
	rest := append((*held)[:0], (*held)[n:]...)
	*held = rest
	c.mu.Lock()
	if c.buf != nil {
		*held = append(*held, *c.buf...)
		*c.buf = (*c.buf)[:0]
		corkBufs.Put(c.buf)
	}
	c.buf = held
	c.mu.Unlock()
	return false
}

// tryWriter writes to a socket without waiting for it to drain: one
// write(2) on the non-blocking descriptor through syscall.RawConn (the
// runtime's poller keeps its own rules: the descriptor's write lock,
// closed and deadline checks).
type tryWriter struct {
	rc  syscall.RawConn
	buf []byte
	n   int
	fn  func(fd uintptr) bool // bound once: no closure per write
}

// newTryWriter is nil when w is not a socket (TLS, a test's pipe).
func newTryWriter(w io.Writer) *tryWriter {
	sc, ok := w.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	t := &tryWriter{rc: rc}
	t.fn = func(fd uintptr) bool {
		n, err := syscall.Write(int(fd), t.buf)
		if err != nil || n < 0 {
			n = 0 // EAGAIN (full), EINTR, or a failure the owner's write will see
		}
		t.n = n
		return true // never wait: the owner does
	}
	return t
}

// write writes what p's first write(2) takes and returns how much.
func (t *tryWriter) write(p []byte) int {
	t.buf, t.n = p, 0
	if err := t.rc.Write(t.fn); err != nil {
		t.n = 0 // closed: the owner's write reports it
	}
	t.buf = nil
	return t.n
}

// corkBufs are the pending buffers of every connection: one is held only
// from a batch's first frame to its flush, so 1,000 idle subscribers hold
// none.
var corkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// wsBinaryMessage appends payload as one unmasked, unfragmented binary
// WebSocket frame (RFC 6455 5.2: FIN and opcode 2, then the payload
// length in 7, 7+16 or 7+64 bits; a server's frames are not masked).
func wsBinaryMessage(dst, payload []byte) []byte {
	const finBinary = 0x82
	n := len(payload)
	switch {
	case n < 126:
		dst = append(dst, finBinary, byte(n))
	case n <= 0xffff:
		dst = append(dst, finBinary, 126)
		dst = binary.BigEndian.AppendUint16(dst, uint16(n))
	default:
		dst = append(dst, finBinary, 127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	return append(dst, payload...)
}

// frameScan follows the frame boundaries of a byte stream of WebSocket
// frames (RFC 6455 5.2) fed in arbitrary pieces, and reports close
// frames (opcode 8).
type frameScan struct {
	hdr  [14]byte // the current frame's header so far
	n    int      // bytes of hdr read
	left uint64   // payload bytes of the current frame still to skip
}

// feed consumes p and reports whether a close frame's header was in it.
func (s *frameScan) feed(p []byte) (sawClose bool) {
	for len(p) > 0 {
		if s.left > 0 {
			k := min(uint64(len(p)), s.left)
			s.left -= k
			p = p[k:]
			continue
		}
		s.hdr[s.n] = p[0]
		s.n++
		p = p[1:]
		need, ok := wsHeaderLen(s.hdr[:s.n])
		if !ok || s.n < need {
			continue
		}
		if s.hdr[0]&0x0f == 0x8 {
			sawClose = true
		}
		s.left = wsPayloadLen(s.hdr[:s.n])
		s.n = 0
	}
	return sawClose
}

// wsHeaderLen is the length of the frame header that h begins (ok false
// until h holds its first two bytes).
func wsHeaderLen(h []byte) (int, bool) {
	if len(h) < 2 {
		return 0, false
	}
	n := 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 { // masked (a client's frame)
		n += 4
	}
	return n, true
}

// wsPayloadLen is the payload length of the whole header h.
func wsPayloadLen(h []byte) uint64 {
	switch l := h[1] & 0x7f; l {
	case 126:
		return uint64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		return binary.BigEndian.Uint64(h[2:10])
	default:
		return uint64(l)
	}
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
	h.conn = newCorkConn(nc)
	h.conn.out = rawWriter(nc)
	h.conn.try = newTryWriter(h.conn.out)
	brw.Writer.Reset(h.conn) // net/http's buffer, now writing to the corkConn
	return h.conn, brw, nil
}

func (h *corkHijacker) Unwrap() http.ResponseWriter { return h.ResponseWriter }
