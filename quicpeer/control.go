package quicpeer

import (
	"errors"
	"io"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// controlLoop reads stream 0 (Section 5.1, 6.1) and dispatches each frame
// after validating it; Handler callbacks run here, in stream order.
func (s *Session) controlLoop() {
	defer s.loops.Done()
	for {
		f, err := s.cr.Next()
		if err != nil {
			s.controlFailed(err)
			return
		}
		s.lastRecv.Store(time.Now().UnixNano())
		s.noteDetectedFraming()
		if err := s.dispatch(&f); err != nil {
			s.closeFor(err)
			return
		}
	}
}

// controlFailed maps a stream-0 read error (Section 5.3): a protocol error
// closes with its code; a reset or closed stream 0 is
// PIPESTREAM_CONTROL_RESET; a dead connection is already handled by watch.
func (s *Session) controlFailed(err error) {
	if s.conn.Context().Err() != nil {
		return
	}
	var pe *wire.Error
	switch {
	case errors.As(err, &pe):
		s.closeFor(err)
	case errors.Is(err, io.EOF) && s.goawayReceived():
		// The draft-04 conversation ends with the server finishing stream
		// 0 after its GOAWAY echo: a graceful end.
		_ = s.CloseWithError(wire.CodeNoError, "peer finished stream 0 after GOAWAY")
	case errors.Is(err, io.EOF):
		_ = s.CloseWithError(wire.CodeControlReset, "peer closed stream 0")
	default:
		if code, _, ok := streamAbort(err); ok {
			_ = s.CloseWithError(wire.CodeControlReset, "stream 0 was reset with "+code.String())
		}
		// Anything else is the connection ending (CONNECTION_CLOSE, idle
		// timeout); watch reports it, possibly a moment after this read.
	}
}

// dispatch validates one frame and hands it to the Handler. A returned
// error closes the connection with its code.
func (s *Session) dispatch(f *wire.Frame) error {
	switch f.Type {
	case wire.FrameStatus:
		return s.recvStatus(&f.Status)
	case wire.FrameScopeDigest:
		if err := s.checkScopeFrame("SCOPE_DIGEST", f.ScopeDigest.ScopeID); err != nil {
			return err
		}
		s.mu.Lock()
		s.tr.forgetScope(f.ScopeDigest.ScopeID)
		s.mu.Unlock()
		s.handler.HandleScopeDigest(s, f.ScopeDigest)
	case wire.FrameBarrier:
		if err := s.checkScopeFrame("BARRIER", f.Barrier.ScopeID); err != nil {
			return err
		}
		s.handler.HandleBarrier(s, f.Barrier)
	case wire.FrameGoAway:
		return s.recvGoAway(f.GoAway)
	case wire.FrameCheckpoint:
		return s.recvCheckpoint(f.Body)
	case wire.FrameCapabilities:
		// Draft-02 defines one exchange per connection; a later
		// CAPABILITIES has no defined meaning and is ignored.
		s.log.Warn("ignoring CAPABILITIES after the capability exchange")
	default:
		// Unknown variable frames are skipped by the ControlReader.
	}
	return nil
}

// checkScopeFrame gates Layer 1 frames: Layer 1 must be negotiated (0x0C)
// and scope 0 is the root scope, never a child scope (0x09, Section 9.4).
func (s *Session) checkScopeFrame(name string, scope uint32) error {
	if !s.negotiated.Layer1 {
		return localErr(wire.CodeLayerUnsupported, "%s needs Layer 1, which was not negotiated", name)
	}
	if scope == 0 {
		return localErr(wire.CodeScopeInvalid, "%s for scope 0, the root scope", name)
	}
	return nil
}

// recvStatus validates a received STATUS against the entity state and
// delivers it. Connection-level frames (entity 0xFFFFFFFF) are heartbeats
// (consumed here) or cursor updates (applied, then delivered).
func (s *Session) recvStatus(f *wire.StatusFrame) error {
	if f.EntityID == wire.ConnectionEntity {
		if err := wire.CheckStatusFrame(f, s.negotiated.Layer1, s.negotiated.Layer2); err != nil {
			return err
		}
		if !f.HasCursor {
			return nil // heartbeat (Section 5.1.4)
		}
		if s.role == RoleClient {
			s.log.Warn("ignoring a cursor update from the server; the client owns the root ID space", "cursor", f.Cursor)
			return nil
		}
		s.mu.Lock()
		if s.tr.applyPeerCursor(f.Cursor) {
			s.afterChangeLocked()
		}
		s.mu.Unlock()
		s.flushCheckpoints()
		s.handler.HandleStatus(s, *f)
		return nil
	}
	s.mu.Lock()
	if f.Status == wire.StatusPending && f.ScopeID == 0 && s.role == RoleServer && s.framing.Load() == framingIs04 {
		s.tr.anchorPeerCursor(f.EntityID)
	}
	v, resolvedNow, err := s.tr.apply(f, false)
	if err == nil && resolvedNow {
		s.resolvedLocked(f.ScopeID, f.EntityID)
	}
	if err == nil && f.ScopeID == 0 {
		s.noteWindowLocked()
	}
	s.mu.Unlock()
	switch {
	case err != nil:
		return err
	case v == ignoredStale:
		s.log.Debug("ignoring a status for an entity behind the cursor", "entity", f.EntityID, "status", f.Status.String())
		return nil
	case v == ignoredLatePending:
		s.log.Debug("ignoring a PENDING announcement that arrived after the entity moved on", "entity", f.EntityID, "scope", f.ScopeID)
		return nil
	case v == ignoredRace:
		s.log.Info("ignoring a status for an entity this endpoint already ended (race)", "entity", f.EntityID, "scope", f.ScopeID, "status", f.Status.String())
		return nil
	}
	if f.HasCursor && s.role == RoleServer {
		// Draft-02 lets any STATUS carry a cursor (C=1, Section 6.2.4);
		// the profile sends it on 0xFFFFFFFF, but a piggybacked one counts.
		s.mu.Lock()
		if s.tr.applyPeerCursor(f.Cursor) {
			s.afterChangeLocked()
			resolvedNow = true
		}
		s.mu.Unlock()
	}
	if resolvedNow {
		s.flushCheckpoints()
	}
	s.handler.HandleStatus(s, *f)
	return nil
}

// resolvedLocked reacts to an entity that just became resolved: the client
// advances its cursor (and schedules a cursor update); waiters are woken.
func (s *Session) resolvedLocked(scope, id uint32) {
	if s.role == RoleClient && scope == 0 {
		if c, adv := s.tr.resolveRoot(id); adv {
			s.cursorTo = c
			select {
			case s.cursorKick <- struct{}{}:
			default:
			}
		}
	}
	s.afterChangeLocked()
}

// afterChangeLocked wakes waiters and marks pending checkpoints for
// re-evaluation.
func (s *Session) afterChangeLocked() {
	s.notifyLocked()
}
