package quicpeer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Session is one PipeStream connection, in either role.
type Session struct {
	cfg        *resolved
	role       Role
	id         string
	conn       connection
	ctrl       stream // stream 0
	cr         *wire.ControlReader
	negotiated Negotiated
	codec      wire.Codec
	log        *slog.Logger
	handler    Handler

	// ctx ends when the session ends (before HandleClose runs).
	ctx    context.Context
	cancel context.CancelFunc

	// wmu serializes stream-0 writes and keeps the wire order of locally
	// sent statuses equal to the order they were applied to the state.
	wmu    sync.Mutex
	wbuf   []byte
	wbuf04 []byte // wbuf re-framed for draft-04

	// framing is framingUndecided, framingIs02 or framingIs04
	// (framing.go); framingSet is closed when it is decided.
	framing    atomic.Uint32
	framingSet chan struct{}

	mu       sync.Mutex // guards everything below
	tr       *tracker
	changed  chan struct{} // closed and replaced when waiters may proceed
	waiters  int           // goroutines waiting on changed
	cursorTo uint32        // client: cursor to announce
	// GOAWAY state (Section 6.5).
	goawaySent, goawayRecv bool
	sentLast, recvLast     uint32
	seenRoot               bool
	maxSeenRoot            uint32 // server: highest root ID seen (circular)
	cpWait                 map[cpKey]chan struct{}
	cpPending              []pendingCheckpoint
	// Receive-side window (server role, window.go).
	winDebt  []windowDebt
	winNeed  uint64 // need of the newest debt recorded
	winTimer *time.Timer

	cursorKick chan struct{} // client: cursor moved, announce it
	lastRecv   atomic.Int64  // unix nanos of the last stream-0 frame received
	lastSent   atomic.Int64  // unix nanos of the last stream-0 frame sent
	// ctrlWaiting is set while the control loop waits for stream-0 data:
	// every complete frame received so far has been handled (window.go).
	ctrlWaiting atomic.Bool

	errMu  sync.Mutex
	errSet bool
	err0   error

	loops sync.WaitGroup // internal goroutines, waited for before HandleClose
	done  chan struct{}
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// start builds the session after a completed capability exchange and
// starts its goroutines.
func start(cfg *resolved, role Role, conn connection, ctrl stream, n Negotiated) *Session {
	n.Profile = conn.NegotiatedProtocol() == ALPNProfile
	s := &Session{
		cfg:        cfg,
		role:       role,
		id:         newSessionID(),
		conn:       conn,
		ctrl:       ctrl,
		negotiated: n,
		codec:      wire.CodecFor(n.Format),
		handler:    cfg.Handler,
		tr:         newTracker(role == RoleClient, n),
		changed:    make(chan struct{}),
		cpWait:     map[cpKey]chan struct{}{},
		cursorKick: make(chan struct{}, 1),
		wbuf:       make([]byte, 0, 256),
		done:       make(chan struct{}),
	}
	s.cr = wire.NewControlReader(ctrlReader{s}, wire.MaxVariableLength)
	s.cr.SetCompleteExtLimit(max(cfg.Limits.InlineResultBytes, 0))
	s.initFraming(cfg.Framing)
	s.log = cfg.Logger.With("session", s.id, "role", role.String())
	s.ctx, s.cancel = context.WithCancel(context.Background())
	now := time.Now().UnixNano()
	s.lastRecv.Store(now)
	s.lastSent.Store(now)
	s.loops.Add(2)
	go s.controlLoop()
	go s.acceptLoop()
	if role == RoleClient {
		s.loops.Add(1)
		go s.cursorLoop()
	}
	if cfg.Heartbeat {
		s.loops.Add(1)
		go s.keepaliveLoop()
	}
	go s.watch()
	return s
}

// Role of this endpoint.
func (s *Session) Role() Role { return s.role }

// Negotiated capabilities.
func (s *Session) Negotiated() Negotiated { return s.negotiated }

// ID is a stable random session identifier (binds yield tokens).
func (s *Session) ID() string { return s.id }

// PacketCounts reports the QUIC packets this session's connection has sent
// and received so far (retransmissions and undecryptable ones included);
// both are 0 over the in-process transport. For measurements: `gateway
// bench` reports packets per entity with it.
func (s *Session) PacketCounts() (sent, received uint64) {
	if q, ok := s.conn.(quicConn); ok {
		st := q.c.ConnectionStats()
		return st.PacketsSent, st.PacketsReceived
	}
	return 0, 0
}

// Done is closed when the session has ended; Err then tells why.
func (s *Session) Done() <-chan struct{} { return s.done }

func (r Role) String() string {
	if r == RoleClient {
		return "client"
	}
	return "server"
}

// watch waits for the connection to end, stops the session's goroutines,
// then calls HandleClose exactly once and closes done.
func (s *Session) watch() {
	<-s.conn.Context().Done()
	s.setErr(closeCause(context.Cause(s.conn.Context())))
	s.cancel()
	s.stopWindowTimer()
	s.mu.Lock()
	s.notifyLocked()
	s.mu.Unlock()
	waited := make(chan struct{})
	go func() { s.loops.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(closeDrainTimeout):
		s.log.Error("session goroutines did not stop after the connection ended")
	}
	s.handler.HandleClose(s, s.Err())
	close(s.done)
}

// setErr records why the session ended; the first record wins, so a local
// close (recorded before the CONNECTION_CLOSE is sent) beats the echo.
func (s *Session) setErr(err error) {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	if !s.errSet {
		s.errSet, s.err0 = true, err
	}
}

// Err tells why the session ended, as Handler.HandleClose gets it: nil
// while it runs and after a graceful close.
func (s *Session) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err0
}

// CloseWithError closes the connection with a PipeStream error code. It
// does not wait for HandleClose; use Done for that.
func (s *Session) CloseWithError(code wire.ErrorCode, msg string) error {
	if code == wire.CodeNoError {
		s.setErr(nil)
	} else {
		s.setErr(&CloseError{Code: code, Reason: msg})
		s.log.Warn("closing connection", "code", code.String(), "reason", msg)
	}
	return s.conn.CloseWithError(code, msg)
}

// closeFor closes the connection because of a protocol error err.
func (s *Session) closeFor(err error) {
	_ = s.CloseWithError(wire.CodeOf(err), err.Error())
}

// notifyLocked wakes goroutines waiting for state changes (AssignID,
// GoAway drain, Checkpoint). It allocates only when someone waits.
func (s *Session) notifyLocked() {
	if s.waiters > 0 {
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// waitLocked blocks until the state changes, ctx ends or the session ends.
// The caller holds s.mu; waitLocked releases it while blocked and
// reacquires it.
func (s *Session) waitLocked(ctx context.Context) error {
	ch := s.changed
	s.waiters++
	s.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.ctx.Done():
		err = s.endedErr()
	}
	s.mu.Lock()
	s.waiters--
	return err
}

// endedErr is what calls on an ended session return.
func (s *Session) endedErr() error {
	if err := s.Err(); err != nil {
		return err
	}
	return localErr(wire.CodeNoError, "session closed")
}

// writeLocked writes s.wbuf to stream 0; the caller holds wmu.
func (s *Session) writeLocked() error {
	out := s.wbuf
	if len(out) > 0 && wire.FrameType(out[0]).IsFixed() {
		if s.role == RoleServer {
			s.waitFramingLocked()
		}
		if s.framing.Load() == framingIs04 {
			s.wbuf04 = wire.AppendDraft04(s.wbuf04[:0], out)
			out = s.wbuf04
		}
	}
	// Queue the frame without waiting when the peer's credit covers it:
	// quic-go's Write waits for the connection to packetize whatever does
	// not fit the one packet it buffers, so frames written back to back
	// (an inline result is ~1 KiB, docs/profile.md 4.3.2) would each wait
	// for a packet of their own; queued, they share packets. Without
	// credit, Write waits for it, bounded by ControlWriteTimeout.
	err := s.ctrl.TryWriteAll(out)
	if err == nil {
		s.lastSent.Store(time.Now().UnixNano())
		return nil
	}
	if !errors.Is(err, errWouldBlock) {
		return err
	}
	_ = s.ctrl.SetWriteDeadline(time.Now().Add(s.cfg.Limits.ControlWriteTimeout))
	if _, err := s.ctrl.Write(out); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The peer stopped reading stream 0; a partly written frame
			// cannot be taken back, so the session ends.
			err = localErr(wire.CodeIdleTimeout, "a stream-0 write waited %v for the peer to read its control stream", s.cfg.Limits.ControlWriteTimeout)
			s.closeFor(err)
		}
		return err
	}
	s.lastSent.Store(time.Now().UnixNano())
	return nil
}

// writeFrame appends one frame with app and writes it to stream 0.
func (s *Session) writeFrame(app func([]byte) []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wbuf = app(s.wbuf[:0])
	return s.writeLocked()
}
