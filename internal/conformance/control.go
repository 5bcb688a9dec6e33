package conformance

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Limits of the reference implementation (src/lib.rs), used as defaults.
const (
	// DefaultMaxPayload is the largest entity payload accepted or sent
	// (the reference's MAX_PAYLOAD, 64 MiB).
	DefaultMaxPayload = 64 << 20
	// DefaultTimeout bounds one connection's whole conversation.
	DefaultTimeout = 2 * time.Minute

	maxControlFrame = 1 << 20 // MAX_CONTROL_FRAME
	maxEntityHeader = 1 << 16 // MAX_ENTITY_HEADER
	maxEntityID     = 0xFFFFFFFC
	// offerWindow and offerKeepaliveMs are the reference's
	// Capabilities::default(): Layer 0 only, window 1024, 30 s.
	offerWindow      = 1024
	offerKeepaliveMs = 30_000
	checkpointAck    = 1
	alpn             = "pipestream/1"
)

// perr is a refusal with the draft's error code (a *wire.Error); the
// connection is closed with that code.
func perr(code wire.ErrorCode, format string, a ...any) error {
	return wire.Errorf(code, format, a...)
}

// offer is the CAPABILITIES this endpoint sends as a client and negotiates
// against as a server: the reference's defaults, six members.
func offer() wire.Capabilities {
	w, ka := uint64(offerWindow), uint64(offerKeepaliveMs)
	return wire.Layer0Only(wire.Capabilities{Layer0Core: true, MaxWindowSize: &w, KeepaliveTimeoutMs: &ka})
}

// negotiated is the server's answer: the common layers (none above Layer 0
// here), the smaller window and keepalive, CBOR; the same six members.
func negotiated(peer *wire.Capabilities) wire.Capabilities {
	own := offer()
	n := wire.Negotiate(&own, peer)
	w, ka := uint64(n.MaxWindowSize), n.KeepaliveMs
	return wire.Layer0Only(wire.Capabilities{Layer0Core: true, Layer1Recursive: n.Layer1, Layer2Resilience: n.Layer2,
		MaxWindowSize: &w, KeepaliveTimeoutMs: &ka})
}

// checkAnswer refuses a server's CAPABILITIES that grants more than the
// offer (a layer not offered, a larger window or keepalive, another
// format), as the reference client does (PIPESTREAM_FRAME_ERROR).
func checkAnswer(c *wire.Capabilities) error {
	if err := wire.ValidateCapabilities(c); err != nil {
		return err
	}
	o := offer()
	switch {
	case c.Layer1Recursive || c.Layer2Resilience:
		return perr(wire.CodeFrameError, "server CAPABILITIES grants layer1-recursive=%v layer2-resilience=%v; only Layer 0 was offered", c.Layer1Recursive, c.Layer2Resilience)
	case c.MaxWindowSize != nil && *c.MaxWindowSize > *o.MaxWindowSize:
		return perr(wire.CodeFrameError, "server CAPABILITIES max-window-size %d exceeds the offered %d", *c.MaxWindowSize, *o.MaxWindowSize)
	case c.KeepaliveTimeoutMs != nil && *c.KeepaliveTimeoutMs > *o.KeepaliveTimeoutMs:
		return perr(wire.CodeFrameError, "server CAPABILITIES keepalive-timeout-ms %d exceeds the offered %d", *c.KeepaliveTimeoutMs, *o.KeepaliveTimeoutMs)
	case c.SerializationFormat != nil && *c.SerializationFormat != wire.FormatCBOR:
		return perr(wire.CodeFrameError, "server CAPABILITIES serialization-format %d; only CBOR (0) was offered", *c.SerializationFormat)
	}
	return nil
}

// nextEntityID is the ID after id in the root scope (Section 9.1; the
// reference's next_entity_id). id must be 1..0xFFFFFFFC.
func nextEntityID(id uint32) uint32 { return wire.NextID(id) }

// validEntityID reports whether id may name an entity (not NULL, not one
// of the three reserved values at the top of the ID space).
func validEntityID(id uint32) bool { return id != wire.NullEntity && id <= maxEntityID }

// control is stream 0 under draft-04 framing.
type control struct {
	s  *quic.Stream
	cr *wire.ControlReader
	// eofOK: a clean end of stream 0 is returned as io.EOF (the graceful
	// end of a conversation) instead of PIPESTREAM_FRAME_ERROR.
	eofOK bool
}

func newControl(s *quic.Stream) *control {
	cr := wire.NewControlReader(s, maxControlFrame)
	cr.SetFraming(wire.FramingDraft04, false)
	return &control{s: s, cr: cr}
}

// next reads the next frame, skipping connection-level heartbeats (STATUS
// UNSPECIFIED for entity 0xFFFFFFFF without a cursor). A STATUS outside
// Layer 0 (scope, depth, Layer 2 state, extension) is refused.
func (c *control) next(what string) (wire.Frame, error) {
	for {
		f, err := c.cr.Next()
		if c.eofOK && (err == io.EOF || closedByPeerWithNoError(err)) {
			return f, err
		}
		if err != nil {
			return f, readErr(what, err)
		}
		if f.Type != wire.FrameStatus {
			return f, nil
		}
		if err := checkLayer0Status(&f.Status); err != nil {
			return f, err
		}
		if !isHeartbeat(&f.Status) {
			return f, nil
		}
	}
}

// readErr names what was awaited; a stream 0 that ends is
// PIPESTREAM_FRAME_ERROR, as in the reference.
func readErr(what string, err error) error {
	var we *wire.Error
	if errors.As(err, &we) {
		return err
	}
	return perr(wire.CodeFrameError, "stream 0 ended while waiting for %s: %v", what, err)
}

// closedByPeerWithNoError reports whether err is the peer's
// CONNECTION_CLOSE with PIPESTREAM_NO_ERROR (0x00).
func closedByPeerWithNoError(err error) bool {
	var ae *quic.ApplicationError
	return errors.As(err, &ae) && ae.Remote && ae.ErrorCode == quic.ApplicationErrorCode(wire.CodeNoError)
}

func isHeartbeat(s *wire.StatusFrame) bool {
	return s.Status == wire.StatusUnspecified && s.EntityID == wire.ConnectionEntity && !s.HasCursor
}

// checkLayer0Status applies the frame-local rules with Layer 0 negotiated
// (a scope, a depth or a Layer 2 state is 0x0C).
func checkLayer0Status(s *wire.StatusFrame) error { return wire.CheckStatusFrame(s, false, false) }

// status reads the next frame and requires a STATUS.
func (c *control) status(what string) (wire.StatusFrame, error) {
	f, err := c.next(what)
	if err != nil {
		return wire.StatusFrame{}, err
	}
	if f.Type != wire.FrameStatus {
		return wire.StatusFrame{}, perr(wire.CodeFrameError, "%s: got frame 0x%02X, want STATUS", what, byte(f.Type))
	}
	return f.Status, nil
}

func (c *control) write(b []byte) error {
	if _, err := c.s.Write(b); err != nil {
		return fmt.Errorf("write stream 0: %w", err)
	}
	return nil
}

func (c *control) writeStatus(st wire.Status, id uint32) error {
	f := wire.StatusFrame{Status: st, EntityID: id}
	return c.write(wire.AppendDraft04(nil, f.Append(nil)))
}

func (c *control) writeHeartbeat() error {
	return c.writeStatus(wire.StatusUnspecified, wire.ConnectionEntity)
}

func (c *control) writeCursor(cursor uint32) error {
	f := wire.StatusFrame{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity, HasCursor: true, Cursor: cursor}
	return c.write(wire.AppendDraft04(nil, f.Append(nil)))
}

func (c *control) writeGoAway(last uint32) error {
	f := wire.GoAwayFrame{LastEntityID: last}
	return c.write(wire.AppendDraft04(nil, f.Append(nil)))
}

func (c *control) writeCapabilities(caps wire.Capabilities) error {
	b, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(&caps)
	if err != nil {
		return err
	}
	return c.write(wire.AppendVariable(nil, wire.FrameCapabilities, b))
}

func (c *control) writeCheckpoint(cp *wire.CheckpointFrame) error {
	b, err := wire.CodecFor(wire.FormatCBOR).MarshalCheckpoint(cp)
	if err != nil {
		return err
	}
	return c.write(wire.AppendVariable(nil, wire.FrameCheckpoint, b))
}

// quicConfig mirrors the reference's transport: one bidirectional stream
// (stream 0), 128 unidirectional, 30 s idle timeout.
func quicConfig() *quic.Config {
	return &quic.Config{
		MaxIdleTimeout: 30 * time.Second, HandshakeIdleTimeout: 10 * time.Second,
		MaxIncomingStreams: 1, MaxIncomingUniStreams: 128, KeepAlivePeriod: 10 * time.Second,
	}
}

func tlsBase() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{alpn}}
}

// closeWith closes conn with err's PipeStream code (0x01 when err has none).
func closeWith(conn *quic.Conn, err error) {
	_ = conn.CloseWithError(quic.ApplicationErrorCode(wire.CodeOf(err)), truncate(err.Error(), 256))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
