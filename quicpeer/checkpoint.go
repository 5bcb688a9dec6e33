package quicpeer

import (
	"context"
	"fmt"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Checkpoint flags (Section 9.3 "flags"; the reference vectors use 0 for a
// request and 1 for the acknowledgement that it is satisfied).
const (
	checkpointRequest   uint64 = 0
	checkpointSatisfied uint64 = 1
)

type cpKey struct {
	id  string
	seq uint64
}

type pendingCheckpoint struct {
	f        wire.CheckpointFrame
	scope    uint32
	deadline time.Time
}

func scopeOf(p *uint32) uint32 {
	if p == nil {
		return 0
	}
	return *p
}

// SendCheckpoint writes a CHECKPOINT frame on stream 0 (a request or an
// acknowledgement) in the negotiated format, without waiting; Checkpoint
// waits for the answer.
func (s *Session) SendCheckpoint(f *wire.CheckpointFrame) error {
	if f == nil {
		return localErr(wire.CodeEntityInvalid, "nil CHECKPOINT")
	}
	if scopeOf(f.ScopeID) != 0 && !s.negotiated.Layer1 {
		return localErr(wire.CodeLayerUnsupported, "CHECKPOINT for scope %d needs Layer 1, which was not negotiated", *f.ScopeID)
	}
	body, err := s.codec.MarshalCheckpoint(f)
	if err != nil {
		return err
	}
	if len(body) > wire.MaxVariableLength {
		return localErr(wire.CodeEntityTooLarge, "CHECKPOINT body is %d octets, more than %d", len(body), wire.MaxVariableLength)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wbuf = wire.AppendVariable(s.wbuf[:0], wire.FrameCheckpoint, body)
	return s.writeLocked()
}

// Checkpoint sends a CHECKPOINT request (flags 0) and waits for the peer's
// acknowledgement (flags 1, sent once every entity of the scope before
// f.CheckpointEntityID is terminal, Section 9.3), or its timeout:
// f.TimeoutMs capped by Limits.CheckpointTimeout -> ErrCheckpointTimeout.
func (s *Session) Checkpoint(ctx context.Context, f *wire.CheckpointFrame) error {
	if f == nil {
		return localErr(wire.CodeEntityInvalid, "nil CHECKPOINT")
	}
	req := *f
	flags := checkpointRequest
	req.Flags = &flags
	timeout := s.cfg.Limits.CheckpointTimeout
	if f.TimeoutMs != nil && *f.TimeoutMs > 0 {
		timeout = min(timeout, time.Duration(min(*f.TimeoutMs, maxKeepaliveMs))*time.Millisecond)
	}
	key := cpKey{req.CheckpointID, req.SequenceNumber}
	ch := make(chan struct{})
	s.mu.Lock()
	if _, dup := s.cpWait[key]; dup {
		s.mu.Unlock()
		return fmt.Errorf("quicpeer: checkpoint %q sequence %d is already pending", key.id, key.seq)
	}
	s.cpWait[key] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.cpWait, key)
		s.mu.Unlock()
	}()
	if err := s.SendCheckpoint(&req); err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: %q sequence %d after %v", ErrCheckpointTimeout, key.id, key.seq, timeout)
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return s.endedErr()
	}
}

// recvCheckpoint handles a CHECKPOINT: an acknowledgement completes a
// pending Checkpoint call; a request is delivered to the Handler and
// acknowledged once satisfied (Section 9.3 condition 1), or dropped at its
// timeout.
func (s *Session) recvCheckpoint(body []byte) error {
	f, err := s.codec.UnmarshalCheckpoint(body)
	if err != nil {
		if _, ok := err.(*wire.Error); ok {
			return err
		}
		return localErr(wire.CodeEntityInvalid, "undecodable CHECKPOINT: %v", err)
	}
	scope := scopeOf(f.ScopeID)
	if scope != 0 && !s.negotiated.Layer1 {
		return localErr(wire.CodeLayerUnsupported, "CHECKPOINT for scope %d needs Layer 1, which was not negotiated", scope)
	}
	if f.Flags != nil && *f.Flags&checkpointSatisfied != 0 {
		s.mu.Lock()
		if ch, ok := s.cpWait[cpKey{f.CheckpointID, f.SequenceNumber}]; ok {
			close(ch)
			delete(s.cpWait, cpKey{f.CheckpointID, f.SequenceNumber})
		}
		s.mu.Unlock()
		s.handler.HandleCheckpoint(s, f)
		return nil
	}
	s.handler.HandleCheckpoint(s, f)
	timeout := s.cfg.Limits.CheckpointTimeout
	if f.TimeoutMs != nil && *f.TimeoutMs > 0 {
		timeout = min(timeout, time.Duration(min(*f.TimeoutMs, maxKeepaliveMs))*time.Millisecond)
	}
	s.mu.Lock()
	if len(s.cpPending) >= maxPendingCheckpoints {
		s.mu.Unlock()
		s.log.Warn("too many pending checkpoints; ignoring one", "checkpoint", f.CheckpointID)
		return nil
	}
	s.cpPending = append(s.cpPending, pendingCheckpoint{f: *f, scope: scope, deadline: time.Now().Add(timeout)})
	s.mu.Unlock()
	s.flushCheckpoints()
	return nil
}

// flushCheckpoints acknowledges every pending checkpoint that is satisfied
// and drops the expired ones.
func (s *Session) flushCheckpoints() {
	s.mu.Lock()
	if len(s.cpPending) == 0 {
		s.mu.Unlock()
		return
	}
	var acks []wire.CheckpointFrame
	now := time.Now()
	keep := s.cpPending[:0]
	for _, p := range s.cpPending {
		switch {
		case s.tr.checkpointSatisfied(p.scope, p.f.CheckpointEntityID):
			acks = append(acks, p.f)
		case now.After(p.deadline):
			s.log.Warn("checkpoint timed out before it was satisfied", "checkpoint", p.f.CheckpointID, "entity", p.f.CheckpointEntityID)
		default:
			keep = append(keep, p)
		}
	}
	clear(s.cpPending[len(keep):])
	s.cpPending = keep
	s.mu.Unlock()
	for i := range acks {
		flags := checkpointSatisfied
		acks[i].Flags = &flags
		if err := s.SendCheckpoint(&acks[i]); err != nil {
			s.log.Debug("cannot acknowledge checkpoint", "err", err)
			return
		}
	}
}
