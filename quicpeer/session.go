package quicpeer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// session is the state of one PipeStream connection in either role.
type session struct {
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
	pub        *Session

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
func start(cfg *resolved, role Role, conn connection, ctrl stream, n Negotiated) *session {
	n.Profile = conn.NegotiatedProtocol() == ALPNProfile
	s := &session{
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
	s.initFraming(cfg.Framing)
	s.log = cfg.Logger.With("session", s.id, "role", role.String())
	s.pub = &Session{impl: s}
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

func (r Role) String() string {
	if r == RoleClient {
		return "client"
	}
	return "server"
}

// watch waits for the connection to end, stops the session's goroutines,
// then calls HandleClose exactly once and closes done.
func (s *session) watch() {
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
	s.handler.HandleClose(s.pub, s.err())
	close(s.done)
}

// setErr records why the session ended; the first record wins, so a local
// close (recorded before the CONNECTION_CLOSE is sent) beats the echo.
func (s *session) setErr(err error) {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	if !s.errSet {
		s.errSet, s.err0 = true, err
	}
}

func (s *session) err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err0
}

// closeWithError closes the connection with a PipeStream code (Section
// 11.4). It does not wait for HandleClose; use Done for that.
func (s *session) closeWithError(code wire.ErrorCode, msg string) error {
	if code == wire.CodeNoError {
		s.setErr(nil)
	} else {
		s.setErr(&CloseError{Code: code, Reason: msg})
		s.log.Warn("closing connection", "code", code.String(), "reason", msg)
	}
	return s.conn.CloseWithError(code, msg)
}

// closeFor closes the connection because of a protocol error err.
func (s *session) closeFor(err error) {
	_ = s.closeWithError(wire.CodeOf(err), err.Error())
}

// notifyLocked wakes goroutines waiting for state changes (AssignID,
// GoAway drain, Checkpoint). It allocates only when someone waits.
func (s *session) notifyLocked() {
	if s.waiters > 0 {
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// wait blocks until the state changes, ctx ends or the session ends. The
// caller holds s.mu; wait releases it while blocked and reacquires it.
func (s *session) waitLocked(ctx context.Context) error {
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
func (s *session) endedErr() error {
	if err := s.err(); err != nil {
		return err
	}
	return localErr(wire.CodeNoError, "session closed")
}

// writeLocked writes s.wbuf to stream 0; the caller holds wmu.
func (s *session) writeLocked() error {
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
	if _, err := s.ctrl.Write(out); err != nil {
		return err
	}
	s.lastSent.Store(time.Now().UnixNano())
	return nil
}

// writeFrame appends one frame with app and writes it to stream 0.
func (s *session) writeFrame(app func([]byte) []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wbuf = app(s.wbuf[:0])
	return s.writeLocked()
}
