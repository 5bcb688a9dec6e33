package quicpeer

import (
	"context"
	"fmt"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// after reports a strictly after b in the circular order of Section 9.3.
func after(a, b uint32) bool { return a != b && wire.IsBefore(b, a) }

// assignID allocates the next root-scope ID (Section 9.1), waiting while
// the window is full. It never bypasses backpressure.
func (s *session) assignID(ctx context.Context) (uint32, error) {
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
func (s *session) recvGoAway(g wire.GoAwayFrame) error {
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
	s.handler.HandleGoAway(s.pub, g)
	return nil
}

func (s *session) goawayReceived() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goawayRecv
}

// goAway sends GOAWAY (the last assigned root ID for the client, the
// highest root ID seen for the server; never higher than an earlier
// GOAWAY), waits until every in-flight entity is resolved or ctx ends, and
// closes with PIPESTREAM_NO_ERROR (Section 6.5.1).
func (s *session) goAway(ctx context.Context) error {
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
			return s.err()
		}
		return err
	}
	s.mu.Lock()
	for !s.tr.drained() {
		if err := s.waitLocked(ctx); err != nil {
			s.mu.Unlock()
			if s.ctx.Err() != nil {
				return s.err() // the peer closed first: nil if gracefully
			}
			_ = s.closeWithError(wire.CodeNoError, "GOAWAY drain deadline passed")
			return err
		}
	}
	s.mu.Unlock()
	// CONNECTION_CLOSE discards stream data the peer has not received yet
	// (the last statuses and result streams): linger until the peer closes,
	// goawayLinger passes, or ctx ends.
	t := time.NewTimer(goawayLinger)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return s.err()
	case <-t.C:
	case <-ctx.Done():
	}
	return s.closeWithError(wire.CodeNoError, "graceful shutdown")
}

// setDetached excludes (on) or re-includes (scope, id) from the GOAWAY
// drain (Session.SetDetached). Any later status of the entity re-includes it.
func (s *session) setDetached(scope, id uint32, on bool) error {
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
func (s *session) cursorLoop() {
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
func (s *session) keepaliveLoop() {
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
			_ = s.closeWithError(wire.CodeIdleTimeout, fmt.Sprintf("no frame on stream 0 for %v (3 x keepalive)", idleFactor*ka))
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
