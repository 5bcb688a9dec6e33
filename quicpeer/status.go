package quicpeer

import (
	"github.com/pipestream/gateway/quicpeer/wire"
)

// SendStatus writes a STATUS frame on stream 0 after checking it against the
// local view of that entity (transition table, layer gating, depth); on a
// failed check nothing is sent and the error carries the code a receiver
// would close with. Writes are serialized; for an entity already tracked it
// does not allocate. Terminal root-scope statuses advance the client's
// cursor (cursor updates are coalesced and sent by the session;
// connection-level frames cannot be sent here).
func (s *Session) SendStatus(f wire.StatusFrame) error {
	if f.EntityID == wire.ConnectionEntity {
		return localErr(wire.CodeEntityInvalid, "connection-level STATUS frames (heartbeats, cursor updates) are sent by the session itself")
	}
	if s.ctx.Err() != nil {
		return s.endedErr()
	}
	s.wmu.Lock()
	s.mu.Lock()
	_, resolvedNow, err := s.tr.apply(&f, true)
	if err == nil && resolvedNow {
		s.resolvedLocked(f.ScopeID, f.EntityID)
	}
	flush := resolvedNow && len(s.cpPending) > 0
	s.mu.Unlock()
	if err != nil {
		s.wmu.Unlock()
		return err
	}
	s.wbuf = f.Append(s.wbuf[:0])
	err = s.writeLocked()
	s.wmu.Unlock()
	if flush {
		s.flushCheckpoints()
	}
	return err
}

// failEntity reports FAILED for an entity whose stream was aborted (Section
// 5.3 Transport Error Mapping). It sends nothing when the entity already
// reached a state FAILED cannot follow (e.g. COMPLETE, or a cancel that
// crossed the abort) or lies behind the cursor.
func (s *Session) failEntity(scope, id uint32, why string) {
	if s.ctx.Err() != nil || id == wire.NullEntity {
		return
	}
	s.mu.Lock()
	depth := s.tr.depthOf(scope)
	s.mu.Unlock()
	f := wire.StatusFrame{Status: wire.StatusFailed, EntityID: id, ScopeID: scope, Depth: depth}
	if err := s.SendStatus(f); err != nil {
		s.log.Debug("not reporting FAILED for an aborted entity stream", "entity", id, "scope", scope, "why", why, "err", err)
		return
	}
	s.log.Info("entity failed", "entity", id, "scope", scope, "why", why)
}

// SendScopeDigest writes a SCOPE_DIGEST frame (Layer 1) on stream 0 and
// forgets the scope's state: the scope is complete.
func (s *Session) SendScopeDigest(f wire.ScopeDigestFrame) error {
	if err := s.checkScopeFrame("SCOPE_DIGEST", f.ScopeID); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	s.tr.forgetScope(f.ScopeID)
	s.mu.Unlock()
	s.wbuf = f.Append(s.wbuf[:0])
	return s.writeLocked()
}

// SendBarrier writes a BARRIER frame (Layer 1) on stream 0.
func (s *Session) SendBarrier(f wire.BarrierFrame) error {
	if err := s.checkScopeFrame("BARRIER", f.ScopeID); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wbuf = f.Append(s.wbuf[:0])
	return s.writeLocked()
}
