package quicpeer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// The in-process transport: a connection between two endpoints of one
// process (the gateway and its embedded peer) with QUIC's stream semantics
// and none of its packets (docs/architecture.md, "The embedded peer").
// It implements the session core's connection interface (transport.go),
// so the session, its frames and its state machines are the same code
// either way; only TLS, packet protection and UDP are left out.
//
// What it keeps of QUIC, because the session core relies on it:
//   - stream IDs as QUIC numbers them (client bidi 0, 4, ...; client uni
//     2, 6, ...; server uni 3, 7, ...);
//   - flow control: each stream buffers at most inprocStreamWindow unread
//     octets and a connection inprocConnWindow across its uni streams
//     (quic-go's defaults are 6 MiB and 15 MiB at most), so a receiver
//     that leaves streams unread holds their senders back and memory stays
//     bounded;
//   - the receiver's uni-stream limit (Limits.MaxIncomingStreams): opening
//     waits while that many streams are open, and a stream's slot is
//     returned when its receiver is done with it (FIN read, reset read,
//     or CancelRead), as QUIC's MAX_STREAMS credit is;
//   - RESET_STREAM and STOP_SENDING with their codes, as *quic.StreamError;
//     a connection close with its code and reason, as *quic.ApplicationError
//     (Remote set on the other end), through both ends' Context;
//   - read and write deadlines that fail with os.ErrDeadlineExceeded;
//   - ALPN: the listener selects the first of its protocols the dialer
//     offers, as TLS does (RFC 7301), and refuses a dialer with none.
//
// There is no idle timeout: nothing is lost between two ends of one
// process; stream-0 silence (3 x keepalive) still ends a stuck session.

// InProcessScheme prefixes the address of an in-process listener: Listen
// and Dial with "inproc:<name>" use this transport instead of UDP.
const InProcessScheme = "inproc:"

const (
	inprocStreamWindow = 1 << 20
	inprocConnWindow   = 8 << 20
	// inprocBlock is the size of the pooled blocks a pipe buffers in.
	inprocBlock = 32 << 10
	// inprocAcceptQueue caps the queue of opened, not yet accepted uni
	// streams; the receiver's stream limit bounds it first.
	inprocAcceptQueue = 1 << 12
)

// inprocNet is the process's table of in-process listeners.
var inprocNet = struct {
	mu        sync.Mutex
	listeners map[string]*inprocListener
}{listeners: map[string]*inprocListener{}}

var inprocSeq atomic.Uint64

// inprocAddr is the net.Addr of an in-process listener.
type inprocAddr string

func (a inprocAddr) Network() string { return "inproc" }
func (a inprocAddr) String() string  { return string(a) }

// inprocListener is the server end's queue of new connections.
type inprocListener struct {
	addr   inprocAddr
	alpn   []string
	maxUni int64 // the server's Limits.MaxIncomingStreams
	conns  chan *inprocConn
	done   chan struct{}
	once   sync.Once
}

// listenInProcess registers a listener at addr ("inproc:<name>"; an empty
// name or "inproc:0" picks a fresh one, as port 0 does).
func listenInProcess(addr string, cfg *resolved) (*inprocListener, error) {
	name := addr[len(InProcessScheme):]
	if name == "" || name == "0" {
		name = "peer-" + strconv.FormatUint(inprocSeq.Add(1), 10)
	}
	l := &inprocListener{addr: inprocAddr(InProcessScheme + name), alpn: slices.Clone(cfg.TLS.NextProtos),
		maxUni: cfg.Limits.MaxIncomingStreams, conns: make(chan *inprocConn), done: make(chan struct{})}
	inprocNet.mu.Lock()
	defer inprocNet.mu.Unlock()
	if _, ok := inprocNet.listeners[string(l.addr)]; ok {
		return nil, fmt.Errorf("quicpeer: listen %s: address already in use", l.addr)
	}
	inprocNet.listeners[string(l.addr)] = l
	return l, nil
}

func (l *inprocListener) accept(ctx context.Context) (*inprocConn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *inprocListener) close() {
	l.once.Do(func() {
		inprocNet.mu.Lock()
		delete(inprocNet.listeners, string(l.addr))
		inprocNet.mu.Unlock()
		close(l.done)
	})
}

// dialInProcess connects to the listener at addr; clientMaxUni is the
// dialer's own limit on server-opened uni streams.
func dialInProcess(ctx context.Context, addr string, cfg *resolved) (*inprocConn, error) {
	inprocNet.mu.Lock()
	l := inprocNet.listeners[addr]
	inprocNet.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("quicpeer: dial %s: no in-process listener at this address", addr)
	}
	proto, ok := selectALPN(l.alpn, cfg.TLS.NextProtos)
	if !ok {
		return nil, fmt.Errorf("quicpeer: dial %s: no application protocol in common (offered %q, the listener takes %q)", addr, cfg.TLS.NextProtos, l.alpn)
	}
	client, server := newInprocPair(proto, cfg.Limits.MaxIncomingStreams, l.maxUni)
	select {
	case l.conns <- server:
		return client, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("quicpeer: dial %s: %w", addr, ctx.Err())
	case <-l.done:
		return nil, fmt.Errorf("quicpeer: dial %s: %w", addr, net.ErrClosed)
	}
}

// selectALPN is the server's choice (RFC 7301 3.2): its first protocol the
// client offers.
func selectALPN(server, client []string) (string, bool) {
	for _, p := range server {
		if slices.Contains(client, p) {
			return p, true
		}
	}
	return "", false
}

// inprocConn is one end of an in-process connection.
type inprocConn struct {
	client bool
	proto  string
	other  *inprocConn
	ctx    context.Context
	cancel context.CancelCauseFunc
	closed *sync.Once // shared by both ends

	// What this end opens: the next stream numbers, and the credit the
	// other end grants (its stream limit and its connection window).
	nextUni  atomic.Int64
	opened   atomic.Bool // stream 0
	sendWin  *credit
	uniSlots chan struct{}

	// What the other end opens toward this one.
	incomingUni  chan *inprocPipe
	incomingBidi chan *inprocStream
}

func newInprocPair(proto string, clientMaxUni, serverMaxUni int64) (client, server *inprocConn) {
	once := new(sync.Once)
	mk := func(isClient bool, maxUni int64) *inprocConn {
		c := &inprocConn{client: isClient, proto: proto, closed: once,
			incomingUni: make(chan *inprocPipe, min(maxUni, inprocAcceptQueue)), incomingBidi: make(chan *inprocStream, 1)}
		c.ctx, c.cancel = context.WithCancelCause(context.Background())
		return c
	}
	client, server = mk(true, clientMaxUni), mk(false, serverMaxUni)
	client.other, server.other = server, client
	// Each end's sending credit is the other end's receiving limit.
	client.uniSlots, server.uniSlots = make(chan struct{}, serverMaxUni), make(chan struct{}, clientMaxUni)
	client.sendWin, server.sendWin = &credit{avail: inprocConnWindow}, &credit{avail: inprocConnWindow}
	return client, server
}

// uniStreamID numbers the next uni stream this end opens (RFC 9000 2.1).
func (c *inprocConn) uniStreamID() int64 {
	id := 4*(c.nextUni.Add(1)-1) + 2
	if !c.client {
		id++
	}
	return id
}

// OpenStreamSync opens stream 0, the only bidirectional stream of a
// PipeStream connection (the client's; a second one is refused).
func (c *inprocConn) OpenStreamSync(ctx context.Context) (stream, error) {
	if !c.client || !c.opened.CompareAndSwap(false, true) {
		return nil, errors.New("quicpeer: in-process connection: only the client's stream 0 is bidirectional")
	}
	out := newInprocPipe(0, c, c.other, nil, nil)
	in := newInprocPipe(0, c.other, c, nil, nil)
	mine, theirs := &inprocStream{in: in, out: out}, &inprocStream{in: out, out: in}
	select {
	case c.other.incomingBidi <- theirs:
		return mine, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, context.Cause(c.ctx)
	}
}

func (c *inprocConn) AcceptStream(ctx context.Context) (stream, error) {
	select {
	case s := <-c.incomingBidi:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, context.Cause(c.ctx)
	}
}

// OpenUniStreamSync waits for a slot under the other end's stream limit.
func (c *inprocConn) OpenUniStreamSync(ctx context.Context) (sendStream, error) {
	select {
	case c.uniSlots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, context.Cause(c.ctx)
	}
	p := newInprocPipe(c.uniStreamID(), c, c.other, c.sendWin, c.uniSlots)
	select {
	case c.other.incomingUni <- p:
		return inprocSend{p}, nil
	case <-ctx.Done():
		p.releaseSlot()
		return nil, ctx.Err()
	case <-c.ctx.Done():
		p.releaseSlot()
		return nil, context.Cause(c.ctx)
	}
}

func (c *inprocConn) AcceptUniStream(ctx context.Context) (receiveStream, error) {
	select {
	case p := <-c.incomingUni:
		return inprocRecv{p}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, context.Cause(c.ctx)
	}
}

// CloseWithError ends both ends: this one sees its own close, the other
// the peer's (Remote), as QUIC's CONNECTION_CLOSE reports them.
func (c *inprocConn) CloseWithError(code wire.ErrorCode, msg string) error {
	c.closed.Do(func() {
		c.cancel(&quic.ApplicationError{ErrorCode: quic.ApplicationErrorCode(code), ErrorMessage: msg})
		c.other.cancel(&quic.ApplicationError{ErrorCode: quic.ApplicationErrorCode(code), ErrorMessage: msg, Remote: true})
	})
	return nil
}

func (c *inprocConn) Context() context.Context   { return c.ctx }
func (c *inprocConn) NegotiatedProtocol() string { return c.proto }

// inprocPipe is one direction of a stream: what the writer end has sent
// and the reader end has not read yet.
type inprocPipe struct {
	id     int64
	w, r   *inprocConn
	win    *credit       // the connection window (nil: stream 0)
	slots  chan struct{} // the stream limit (nil: stream 0)
	once   sync.Once     // the slot is returned once
	rwake  chan struct{} // the reader may go on
	wwake  chan struct{} // the writer may go on
	mu     sync.Mutex
	data   blockQueue
	fin    bool
	reset  bool // the writer cancelled (RESET_STREAM)
	stop   bool // the reader cancelled (STOP_SENDING)
	code   wire.ErrorCode
	readDL time.Time
	wrDL   time.Time
}

func newInprocPipe(id int64, w, r *inprocConn, win *credit, slots chan struct{}) *inprocPipe {
	return &inprocPipe{id: id, w: w, r: r, win: win, slots: slots, rwake: make(chan struct{}, 1), wwake: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (p *inprocPipe) streamErr(remote bool) error {
	return &quic.StreamError{StreamID: quic.StreamID(p.id), ErrorCode: quic.StreamErrorCode(p.code), Remote: remote}
}

func (p *inprocPipe) releaseSlot() {
	if p.slots != nil {
		p.once.Do(func() { <-p.slots })
	}
}

// discardLocked drops what is buffered and returns its window credit.
func (p *inprocPipe) discardLocked() {
	if n := p.data.n; n > 0 && p.win != nil {
		p.win.give(n)
	}
	p.data.drop()
}

// Write blocks until all of b is buffered (QUIC's flow control), the
// stream or the connection ends, or the write deadline passes.
func (p *inprocPipe) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k, err := p.reserve(len(b))
		if err != nil {
			return n, err
		}
		p.mu.Lock()
		if err := p.writeErrLocked(); err != nil {
			p.mu.Unlock()
			if p.win != nil {
				p.win.give(k)
			}
			return n, err
		}
		p.data.write(b[:k])
		p.mu.Unlock()
		signal(p.rwake)
		b, n = b[k:], n+k
	}
	return n, nil
}

func (p *inprocPipe) writeErrLocked() error {
	switch {
	case p.stop:
		return p.streamErr(true)
	case p.reset:
		return p.streamErr(false)
	case p.fin:
		return fmt.Errorf("quicpeer: write on closed stream %d", p.id)
	case p.w.ctx.Err() != nil:
		return context.Cause(p.w.ctx)
	}
	return nil
}

// reserve waits for room in the stream's window and takes up to want
// octets of it from the connection's window.
func (p *inprocPipe) reserve(want int) (int, error) {
	for {
		p.mu.Lock()
		err := p.writeErrLocked()
		room := inprocStreamWindow - p.data.n
		dl := p.wrDL
		p.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if room > 0 {
			return p.takeWindow(min(room, want), dl)
		}
		if err := p.wait(p.w.ctx, p.wwake, dl); err != nil {
			return 0, err
		}
	}
}

// takeWindow takes up to k octets of the connection's window, as much as
// is free (QUIC sends what the connection's credit allows, not all or
// nothing), waiting while none is.
func (p *inprocPipe) takeWindow(k int, dl time.Time) (int, error) {
	if p.win == nil {
		return k, nil
	}
	for {
		got, wake := p.win.take(k)
		if got > 0 {
			return got, nil
		}
		if err := p.wait(p.w.ctx, wake, dl); err != nil {
			return 0, err
		}
	}
}

// credit is a connection's window in one direction: octets buffered on
// its uni streams and not read yet count against it.
type credit struct {
	mu    sync.Mutex
	avail int
	wake  chan struct{} // closed when octets return while a writer waits
}

// take takes up to want octets; with none free it returns the channel
// that is closed when some return.
func (c *credit) take(want int) (int, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.avail > 0 {
		k := min(want, c.avail)
		c.avail -= k
		return k, nil
	}
	if c.wake == nil {
		c.wake = make(chan struct{})
	}
	return 0, c.wake
}

func (c *credit) give(n int) {
	c.mu.Lock()
	c.avail += n
	wake := c.wake
	c.wake = nil
	c.mu.Unlock()
	if wake != nil {
		close(wake)
	}
}

// wait blocks until ch is signalled, the end's connection closes, or dl
// passes.
func (p *inprocPipe) wait(ctx context.Context, ch chan struct{}, dl time.Time) error {
	var expired <-chan time.Time
	if !dl.IsZero() {
		d := time.Until(dl)
		if d <= 0 {
			return fmt.Errorf("quicpeer: stream %d: %w", p.id, os.ErrDeadlineExceeded)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-expired:
		return fmt.Errorf("quicpeer: stream %d: %w", p.id, os.ErrDeadlineExceeded)
	}
}

// Read returns buffered octets first, then io.EOF after the writer's FIN;
// a reset discards what is buffered, as QUIC does.
func (p *inprocPipe) Read(b []byte) (int, error) {
	for {
		p.mu.Lock()
		n, err, done := p.readLocked(b)
		dl := p.readDL
		p.mu.Unlock()
		if done {
			p.afterRead(n, err)
			return n, err
		}
		if err := p.wait(p.r.ctx, p.rwake, dl); err != nil {
			return 0, err
		}
	}
}

func (p *inprocPipe) readLocked(b []byte) (n int, err error, done bool) {
	switch {
	case p.stop:
		return 0, p.streamErr(false), true
	case p.reset:
		return 0, p.streamErr(true), true
	case p.data.n > 0:
		return p.data.read(b), nil, true
	case p.fin:
		return 0, io.EOF, true
	case len(b) == 0:
		return 0, nil, true
	}
	return 0, nil, false
}

func (p *inprocPipe) afterRead(n int, err error) {
	if n > 0 {
		if p.win != nil {
			p.win.give(n)
		}
		signal(p.wwake)
	}
	if err != nil {
		var se *quic.StreamError
		if err == io.EOF || errors.As(err, &se) {
			p.releaseSlot()
		}
	}
}

// Close sends FIN: the reader gets io.EOF after what is buffered.
func (p *inprocPipe) Close() error {
	p.mu.Lock()
	if p.reset {
		p.mu.Unlock()
		return fmt.Errorf("quicpeer: close of reset stream %d", p.id)
	}
	p.fin = true
	p.mu.Unlock()
	signal(p.rwake)
	return nil
}

// CancelWrite resets the stream (RESET_STREAM): unread data is dropped
// and the reader gets a *quic.StreamError with code.
func (p *inprocPipe) CancelWrite(code wire.ErrorCode) {
	p.mu.Lock()
	if p.reset || p.stop || (p.fin && p.data.n == 0) {
		p.mu.Unlock()
		return
	}
	p.reset, p.code = true, code
	p.discardLocked()
	p.mu.Unlock()
	signal(p.rwake)
	signal(p.wwake)
}

// CancelRead stops the stream (STOP_SENDING): the writer's next Write
// fails with code, and the stream's slot returns to the writer.
func (p *inprocPipe) CancelRead(code wire.ErrorCode) {
	p.mu.Lock()
	if !p.stop && !p.reset {
		p.stop, p.code = true, code
		p.discardLocked()
	}
	p.mu.Unlock()
	p.releaseSlot()
	signal(p.wwake)
	signal(p.rwake)
}

func (p *inprocPipe) setReadDeadline(t time.Time) error {
	p.mu.Lock()
	p.readDL = t
	p.mu.Unlock()
	signal(p.rwake)
	return nil
}

func (p *inprocPipe) setWriteDeadline(t time.Time) error {
	p.mu.Lock()
	p.wrDL = t
	p.mu.Unlock()
	signal(p.wwake)
	return nil
}

// blockQueue holds a pipe's unread octets in pooled blocks, so a
// stream's buffer is recycled rather than grown and left to the GC.
type blockQueue struct {
	blocks []*[]byte
	off    int // read offset in blocks[0]
	n      int // unread octets
}

var blockPool = sync.Pool{New: func() any {
	b := make([]byte, 0, inprocBlock)
	return &b
}}

func (q *blockQueue) write(b []byte) {
	for len(b) > 0 {
		if len(q.blocks) == 0 || len(*q.blocks[len(q.blocks)-1]) == inprocBlock {
			q.blocks = append(q.blocks, blockPool.Get().(*[]byte))
		}
		last := q.blocks[len(q.blocks)-1]
		k := copy((*last)[len(*last):inprocBlock], b)
		*last = (*last)[:len(*last)+k]
		b, q.n = b[k:], q.n+k
	}
}

func (q *blockQueue) read(p []byte) int {
	n := 0
	for len(p) > 0 && q.n > 0 {
		first := q.blocks[0]
		k := copy(p, (*first)[q.off:])
		p, n, q.n, q.off = p[k:], n+k, q.n-k, q.off+k
		if q.off < len(*first) {
			break
		}
		// blocks[0] is read to its end: recycle it.
		*first = (*first)[:0]
		blockPool.Put(first)
		q.blocks[0] = nil
		q.blocks, q.off = q.blocks[1:], 0
	}
	return n
}

// drop recycles every block, read or not.
func (q *blockQueue) drop() {
	for i, b := range q.blocks {
		*b = (*b)[:0]
		blockPool.Put(b)
		q.blocks[i] = nil
	}
	q.blocks, q.off, q.n = nil, 0, 0
}

// inprocSend, inprocRecv and inprocStream are the ends' views of pipes.
type inprocSend struct{ p *inprocPipe }

func (s inprocSend) Write(b []byte) (int, error)     { return s.p.Write(b) }
func (s inprocSend) TryWriteAll([]byte) error        { return errWouldBlock }
func (s inprocSend) Close() error                    { return s.p.Close() }
func (s inprocSend) CancelWrite(code wire.ErrorCode) { s.p.CancelWrite(code) }
func (s inprocSend) StreamID() int64                 { return s.p.id }

type inprocRecv struct{ p *inprocPipe }

func (r inprocRecv) Read(b []byte) (int, error)        { return r.p.Read(b) }
func (r inprocRecv) CancelRead(code wire.ErrorCode)    { r.p.CancelRead(code) }
func (r inprocRecv) StreamID() int64                   { return r.p.id }
func (r inprocRecv) SetReadDeadline(t time.Time) error { return r.p.setReadDeadline(t) }

type inprocStream struct{ in, out *inprocPipe }

func (s *inprocStream) Read(b []byte) (int, error)         { return s.in.Read(b) }
func (s *inprocStream) Write(b []byte) (int, error)        { return s.out.Write(b) }
func (s *inprocStream) Close() error                       { return s.out.Close() }
func (s *inprocStream) CancelWrite(code wire.ErrorCode)    { s.out.CancelWrite(code) }
func (s *inprocStream) CancelRead(code wire.ErrorCode)     { s.in.CancelRead(code) }
func (s *inprocStream) StreamID() int64                    { return s.in.id }
func (s *inprocStream) SetReadDeadline(t time.Time) error  { return s.in.setReadDeadline(t) }
func (s *inprocStream) SetWriteDeadline(t time.Time) error { return s.out.setWriteDeadline(t) }

// TryWriteAll never queues: an in-process Write copies into the pipe as
// soon as its window has room and never waits for a packet, so the
// session's stream-0 writes take Write (bounded by its write deadline).
func (s *inprocStream) TryWriteAll([]byte) error { return errWouldBlock }
