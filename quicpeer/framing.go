package quicpeer

import (
	"errors"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Framing chooses the layout of fixed control frames on a connection
// (docs/profile.md 1.2). ALPN and the STATUS version are the same under
// draft-02 and draft-04, so the choice is per connection.
type Framing int

const (
	// FramingAuto: a client sends draft-02 and follows a draft-04 server
	// once its first STATUS shows it; a server answers in the framing of
	// the client's first STATUS (a draft-04 STATUS starts 0x50 0x00), or
	// draft-02 when the client sends an entity and no STATUS within
	// framingWait.
	FramingAuto Framing = iota
	// FramingDraft02 fixes draft-krickert-pipestream-02 framing.
	FramingDraft02
	// FramingDraft04 fixes the reference suite's draft-04 framing and its
	// Layer 0 conversation: CAPABILITIES with exactly the six Layer 0
	// members, a heartbeat after CAPABILITIES, STATUS PENDING before a
	// client's entity stream, entity headers of at most the six Layer 0
	// members, and a GOAWAY echo.
	FramingDraft04
)

func (f Framing) String() string {
	switch f {
	case FramingDraft02:
		return "draft-02"
	case FramingDraft04:
		return "draft-04"
	}
	return "auto"
}

// framing state of a session: undecided until configured or detected.
const (
	framingUndecided uint32 = iota
	framingIs02
	framingIs04
)

func framingState(f wire.Framing) uint32 {
	if f == wire.FramingDraft04 {
		return framingIs04
	}
	return framingIs02
}

// initFraming sets the session's framing from the configuration and
// prepares the control reader: fixed framings are decided at once, auto
// detects from the first STATUS received.
func (s *Session) initFraming(mode Framing) {
	s.framingSet = make(chan struct{})
	switch mode {
	case FramingDraft04:
		s.cr.SetFraming(wire.FramingDraft04, false)
		s.decideFraming(wire.FramingDraft04)
	case FramingDraft02:
		s.cr.SetFraming(wire.FramingDraft02, false)
		s.decideFraming(wire.FramingDraft02)
	default:
		s.cr.SetFraming(wire.FramingDraft02, true)
	}
}

// decideFraming records f once; it reports whether this call decided it.
func (s *Session) decideFraming(f wire.Framing) bool {
	if !s.framing.CompareAndSwap(framingUndecided, framingState(f)) {
		return false
	}
	close(s.framingSet)
	return true
}

// Framing in use on this connection: configured, or detected from the
// peer's first STATUS (draft-02 until then). Additive.
//
// Framing in use: draft-02 while undecided.
func (s *Session) Framing() wire.Framing {
	if s.framing.Load() == framingIs04 {
		return wire.FramingDraft04
	}
	return wire.FramingDraft02
}

// noteDetectedFraming runs on the control goroutine after each frame: the
// reader may have detected the peer's framing from a STATUS. A server that
// learns it talks to a draft-04 client sends the heartbeat the reference
// sends after CAPABILITIES.
func (s *Session) noteDetectedFraming() {
	if s.framing.Load() != framingUndecided && !s.framingMismatch() {
		return
	}
	f, decided := s.cr.Framing()
	if !decided {
		return
	}
	if !s.decideFraming(f) {
		s.log.Warn("the peer's framing differs from the one this endpoint chose without it; switching", "framing", f.String())
		s.framing.Store(framingState(f))
	}
	s.log.Debug("framing detected", "framing", f.String())
	if s.role == RoleServer {
		// The reference server's heartbeat after CAPABILITIES; it also
		// shows a FramingAuto client this server's framing at once.
		_ = s.sendHeartbeat()
	}
}

// settleClientFraming decides a FramingAuto client's framing before it
// sends any fixed frame (a draft-04 server would read a draft-02 STATUS's
// second octet as a Length and close): a server that selected ALPNProfile
// is this project's peer, which answers in the client's framing, so
// draft-02; otherwise the client waits up to framingWait for the
// server's first STATUS (the reference server sends a heartbeat right
// after CAPABILITIES), and without one takes the server for draft-02.
func (s *Session) settleClientFraming() {
	if s.framing.Load() != framingUndecided {
		return
	}
	if s.negotiated.Profile {
		s.decideFraming(wire.FramingDraft02)
		return
	}
	t := time.NewTimer(framingWait)
	defer t.Stop()
	select {
	case <-s.framingSet:
	case <-t.C:
		s.decideFraming(wire.FramingDraft02)
	case <-s.ctx.Done():
	}
}

// framingMismatch: the writer chose a framing (by timeout) before the
// reader detected a different one.
func (s *Session) framingMismatch() bool {
	f, decided := s.cr.Framing()
	return decided && framingState(f) != s.framing.Load()
}

// waitFramingLocked blocks a server's first fixed frame until the client's
// framing is known, at most framingWait; then it settles on draft-02. The
// caller holds wmu.
func (s *Session) waitFramingLocked() {
	if s.framing.Load() != framingUndecided {
		return
	}
	t := time.NewTimer(framingWait)
	defer t.Stop()
	select {
	case <-s.framingSet:
	case <-t.C:
		if s.decideFraming(wire.FramingDraft02) {
			s.log.Debug("no STATUS from the client yet; using draft-02 framing")
		}
	case <-s.ctx.Done():
	}
}

// sendHeartbeat writes a heartbeat STATUS (entity 0xFFFFFFFF, no cursor).
func (s *Session) sendHeartbeat() error {
	hb := wire.StatusFrame{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity}
	return s.writeFrame(hb.Append)
}

// layer0Header reports whether h has only the six members a draft-04
// Layer 0 entity header may carry (entity-id, parent-id, layer,
// content-type, payload-length, checksum).
func layer0Header(h *wire.EntityHeader) bool {
	return h.ScopeID == nil && len(h.Metadata) == 0 && h.ChunkInfo == nil && h.CompletionPolicy == nil
}

// announceDraft04 is the draft-04 client's part of the reference
// conversation before an entity stream: a root entity is announced with
// STATUS PENDING first (sendEntity has checked that the header is a Layer
// 0 one: the reference's entity header is a closed map). Under draft-02 it
// does nothing.
func (s *Session) announceDraft04(h *wire.EntityHeader) error {
	if s.framing.Load() != framingIs04 || s.role != RoleClient || headerScope(h) != 0 {
		return nil
	}
	return s.SendStatus(wire.StatusFrame{Status: wire.StatusPending, EntityID: h.EntityID})
}

// HandshakeRefused reports whether err, from Dial, means the peer closed the
// connection with an application error code during the capability exchange:
// it answered, but refused what it was offered (a draft-04 peer refuses a
// CAPABILITIES member it does not know with PIPESTREAM_FRAME_ERROR).
func HandshakeRefused(err error) bool {
	var ae *quic.ApplicationError
	return errors.As(err, &ae) && ae.Remote
}

// untrackedResultLocked reports whether h, received by a client, is a
// result entity a plain peer numbered itself: root scope, an ID the client
// never assigned, and a parent-id. The caller holds s.mu.
func (s *Session) untrackedResultLocked(h *wire.EntityHeader) bool {
	if s.role != RoleClient || headerScope(h) != 0 || h.ParentID == nil {
		return false
	}
	return !s.tr.ids.InFlight(h.EntityID) && !s.tr.stale(h.EntityID)
}

// validateAnswer refuses, under draft-04 framing (configured or detected),
// a server CAPABILITIES above the client's offer, as the reference client
// does (validate_response): the connection closes with
// PIPESTREAM_FRAME_ERROR (0x0D) and Dial fails. Under draft-02 each end
// sends its own capabilities and both take the minimum (Section 3.4), so
// an answer above the offer is normal there.
func (s *Session) validateAnswer(offer wire.Capabilities, answer *wire.Capabilities) error {
	if s.Framing() != wire.FramingDraft04 {
		return nil
	}
	err := wire.ValidateAnswer(&offer, answer)
	if err == nil {
		return nil
	}
	_ = s.CloseWithError(wire.CodeFrameError, err.Error())
	<-s.done
	return err
}
