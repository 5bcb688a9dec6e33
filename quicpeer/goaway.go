package quicpeer

import (
	"context"
	"fmt"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// after reports a strictly after b in the circular order of Section 9.3.
func after(a, b uint32) bool { return a != b && wire.IsBefore(b, a) }

// AssignID allocates the next root-scope entity ID (Section 9.1), blocking
// while the window is full (backpressure) until the cursor advances or ctx
// ends. Client role only.
func (s *Session) AssignID(ctx context.Context) (uint32, error) {
	if s.role != RoleClient {
		return 0, ErrNotClient
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.ctx.Err() != nil {
			return 0, s.endedErr()
		}
		if s.goawaySent {
			return 0, fmt.Errorf("%w: this endpoint sent GOAWAY", ErrGoAway)
		}
		if next := wire.NextID(s.tr.ids.LastAssigned()); s.goawayRecv && after(next, s.recvLast) {
			return 0, fmt.Errorf("%w: peer GOAWAY Last Entity ID is %d", ErrGoAway, s.recvLast)
		}
		if id, ok := s.tr.ids.Assign(); ok {
			return id, nil
		}
		if err := s.waitLocked(ctx); err != nil {
			return 0, err
		}
	}
}

// recvGoAway applies a received GOAWAY (Section 6.5): Last may only stay or
// decrease; new entities above it are refused locally from now on.
func (s *Session) recvGoAway(g wire.GoAwayFrame) error {
	s.mu.Lock()
	if s.goawayRecv && after(g.LastEntityID, s.recvLast) {
		prev := s.recvLast
		s.mu.Unlock()
		return localErr(wire.CodeEntityInvalid, "GOAWAY Last Entity ID increased from %d to %d", prev, g.LastEntityID)
	}
	s.goawayRecv, s.recvLast = true, g.LastEntityID
	echo := s.role == RoleServer && !s.goawaySent && s.framing.Load() == framingIs04
	if echo {
		s.goawaySent, s.sentLast = true, g.LastEntityID
	}
	s.notifyLocked()
	s.mu.Unlock()
	if echo {
		// The reference's Layer 0 conversation answers a client's GOAWAY
		// with a GOAWAY of the same Last Entity ID (docs/profile.md 1.2).
		if err := s.writeFrame(g.Append); err != nil {
			return err
		}
	}
	s.handler.HandleGoAway(s, g)
	return nil
}

func (s *Session) goawayReceived() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goawayRecv
}

// GoAway starts graceful shutdown (Section 6.5): sends GOAWAY (client: last
// assigned ID; server: highest root ID seen; never above an earlier
// GOAWAY), refuses new entities above it (0x05 + FAILED), waits until every
// in-flight entity is resolved or ctx ends, then closes with 0x00. It
// returns nil when the drain completed (or the peer closed gracefully).
func (s *Session) GoAway(ctx context.Context) error {
	s.mu.Lock()
	last := s.maxSeenRoot
	if s.role == RoleClient {
		last = s.tr.ids.LastAssigned()
	}
	if s.goawaySent && after(last, s.sentLast) {
		last = s.sentLast
	}
	s.goawaySent, s.sentLast = true, last
	s.notifyLocked()
	s.mu.Unlock()
	g := wire.GoAwayFrame{LastEntityID: last}
	s.wmu.Lock()
	s.wbuf = g.Append(s.wbuf[:0])
	err := s.writeLocked()
	s.wmu.Unlock()
	if err != nil {
		if s.ctx.Err() != nil {
			return s.Err()
		}
		return err
	}
	s.mu.Lock()
	for !s.tr.drained() {
		if err := s.waitLocked(ctx); err != nil {
			s.mu.Unlock()
			if s.ctx.Err() != nil {
				return s.Err() // the peer closed first: nil if gracefully
			}
			_ = s.CloseWithError(wire.CodeNoError, "GOAWAY drain deadline passed")
			return err
		}
	}
	s.mu.Unlock()
	if s.draft04EchoWithin(ctx, goawayLinger) {
		return s.CloseWithError(wire.CodeNoError, "draft-04 conversation complete")
	}
	// CONNECTION_CLOSE discards stream data the peer has not received yet
	// (the last statuses and result streams): linger until the peer closes,
	// goawayLinger passes, or ctx ends.
	t := time.NewTimer(goawayLinger)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return s.Err()
	case <-t.C:
	case <-ctx.Done():
	}
	return s.CloseWithError(wire.CodeNoError, "graceful shutdown")
}

// draft04EchoWithin waits, on a draft-04 client, up to d for the server's
// GOAWAY echo, the last frame of the reference conversation: the server
// has then read everything this client sent, and the client needs
// nothing more from it, so the connection can close at once instead of
// lingering (a peer that serves one connection at a time takes the next
// one sooner). It reports whether the echo arrived; other sessions do
// not wait.
func (s *Session) draft04EchoWithin(ctx context.Context, d time.Duration) bool {
	if s.role != RoleClient || s.framing.Load() != framingIs04 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.goawayRecv {
		if s.waitLocked(ctx) != nil {
			return false
		}
	}
	return true
}

// SetDetached excludes (on = true) or re-includes an entity that has no
// terminal status from the GOAWAY drain: GoAway does not wait for a
// detached entity. The processing peer detaches a DEFERRED entity whose
// claim check is persisted (it outlives the session, docs/profile.md 6) and
// a document root that waits only for such entities. Any later status of
// the entity re-includes it. Added by the peer helper (additive).
func (s *Session) SetDetached(scope, id uint32, on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.tr.scopes[scope][id]
	if !ok {
		return localErr(wire.CodeEntityInvalid, "entity %d scope %d is not tracked on this session", id, scope)
	}
	e.detached = on
	s.tr.scopes[scope][id] = e
	s.notifyLocked()
	return nil
}

// cursorLoop sends connection-level cursor updates (client role,
// docs/profile.md section 2), coalesced to one per cursorUpdateInterval.
func (s *Session) cursorLoop() {
	defer s.loops.Done()
	t := time.NewTimer(cursorUpdateInterval)
	t.Stop()
	for {
		select {
		case <-s.cursorKick:
		case <-s.ctx.Done():
			return
		}
		s.mu.Lock()
		f := wire.StatusFrame{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity, HasCursor: true, Cursor: s.cursorTo}
		s.mu.Unlock()
		s.wmu.Lock()
		s.wbuf = f.Append(s.wbuf[:0])
		err := s.writeLocked()
		s.wmu.Unlock()
		if err != nil {
			return
		}
		t.Reset(cursorUpdateInterval)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
	}
}

// keepaliveLoop sends heartbeats after a keepalive of stream-0 silence and
// closes with PIPESTREAM_IDLE_TIMEOUT after 3 x keepalive without any frame
// received on stream 0 (Section 5.1.4). It runs only with Config.Heartbeat.
func (s *Session) keepaliveLoop() {
	defer s.loops.Done()
	ka := s.negotiated.Keepalive
	tick := time.NewTicker(max(ka/4, time.Millisecond))
	defer tick.Stop()
	hb := wire.StatusFrame{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity}
	for {
		select {
		case <-tick.C:
		case <-s.ctx.Done():
			return
		}
		now := time.Now().UnixNano()
		if time.Duration(now-s.lastRecv.Load()) >= idleFactor*ka {
			_ = s.CloseWithError(wire.CodeIdleTimeout, fmt.Sprintf("no frame on stream 0 for %v (3 x keepalive)", idleFactor*ka))
			return
		}
		if time.Duration(now-s.lastSent.Load()) >= ka {
			s.wmu.Lock()
			s.wbuf = hb.Append(s.wbuf[:0])
			err := s.writeLocked()
			s.wmu.Unlock()
			if err != nil {
				return
			}
		}
	}
}
