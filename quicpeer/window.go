package quicpeer

import (
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Receive-side window enforcement (server role; Section 9.1, 10.3;
// docs/profile.md section 2).
//
// The server counts the root-scope entities it has seen (entity stream or
// STATUS) and considers unresolved (tracker.unresolvedRoot). A client that
// keeps its window never has more than the window unresolved in its own
// view, but the server's view can be larger for a moment: a terminal
// status the client itself sent (a cancel ABANDONED, a send-failure FAILED)
// travels on stream 0, while the entity stream that reused its window slot
// travels on its own QUIC stream and may arrive first. So an excess is
// only evidence: each time the count rises above the window by k, the
// server records a debt "k more root entities must become resolved by
// now+windowGrace" (the client's in-flight terminals, or the server's own).
// A debt that is still unpaid at its deadline, while the control loop has
// processed everything received on stream 0, closes the connection with
// PIPESTREAM_WINDOW_EXCEEDED (0x08). Nothing is ever delayed for a client
// within its window.

// windowDebt: by due, tracker.rootResolutions must reach need.
type windowDebt struct {
	due  time.Time
	need uint64
}

// noteWindowLocked runs after the server's root-scope state may have
// changed (caller holds s.mu): it drops paid debts, records a new one when
// the count is above the window by more than the newest debt covers, and
// arms the deadline timer.
func (s *Session) noteWindowLocked() {
	if s.role != RoleServer {
		return
	}
	t := s.tr
	for len(s.winDebt) > 0 && s.winDebt[0].need <= t.rootResolutions {
		s.winDebt = s.winDebt[1:]
	}
	if t.overWindow() {
		need := t.rootResolutions + uint64(t.unresolvedRoot) - t.window
		if need > s.winNeed {
			s.winNeed = need
			s.winDebt = append(s.winDebt, windowDebt{due: time.Now().Add(windowGrace), need: need})
		}
	}
	if len(s.winDebt) > 0 && s.winTimer == nil {
		s.winTimer = time.AfterFunc(time.Until(s.winDebt[0].due), s.windowDeadline)
	}
}

// windowDeadline checks the oldest debt when its deadline passed (timer
// goroutine). Unless the control loop is waiting for stream-0 data (so
// every frame that arrived has been handled), a status that pays the debt
// may be buffered unread: the check is repeated shortly after.
func (s *Session) windowDeadline() {
	s.mu.Lock()
	s.winTimer = nil
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	t := s.tr
	for len(s.winDebt) > 0 && s.winDebt[0].need <= t.rootResolutions {
		s.winDebt = s.winDebt[1:]
	}
	if len(s.winDebt) == 0 {
		s.mu.Unlock()
		return
	}
	if wait := time.Until(s.winDebt[0].due); wait > 0 || !s.ctrlWaiting.Load() {
		s.winTimer = time.AfterFunc(max(wait, windowRecheck), s.windowDeadline)
		s.mu.Unlock()
		return
	}
	n, w := t.unresolvedRoot, t.window
	s.mu.Unlock()
	s.closeFor(localErr(wire.CodeWindowExceeded,
		"%d root-scope entities unresolved, more than the window of %d, and no terminal status made room within %v", n, w, windowGrace))
}

// ctrlReader is stream 0 as the ControlReader reads it: it marks the
// time spent waiting for data (session.ctrlWaiting). The ControlReader
// reads only when it holds no complete frame, and the control loop asks
// for the next frame only after handling the last one.
type ctrlReader struct{ s *Session }

func (c ctrlReader) Read(p []byte) (int, error) {
	c.s.ctrlWaiting.Store(true)
	n, err := c.s.ctrl.Read(p)
	c.s.ctrlWaiting.Store(false)
	return n, err
}

// stopWindowTimer stops the deadline timer when the session ends.
func (s *Session) stopWindowTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.winTimer != nil {
		s.winTimer.Stop()
		s.winTimer = nil
	}
}
