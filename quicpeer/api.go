// Package quicpeer is a draft-krickert-pipestream-02 endpoint over quic-go,
// in both roles: the gateway dials peers as a client (and owns the root
// entity-ID space of the connection), the processing peer listens as a
// server. See docs/profile.md for who sends what.
//
// CONTRACT FILE: the exported surface below is what bridge/ and
// quicpeer/peer code against. Keep signatures stable; document changes.
package quicpeer

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// ALPN is the draft-02 ALPN identifier (Section 11.1).
const ALPN = "pipestream/1"

// Role of the endpoint on a connection.
type Role int

const (
	RoleClient Role = iota // dials; owns the root entity-ID space
	RoleServer             // accepts
)

// Config configures an endpoint. The zero value of each limit means the
// draft default (Section 10.3 Resource Exhaustion table).
type Config struct {
	// TLS is required. quicpeer forces MinVersion TLS 1.3 and NextProtos =
	// [ALPN]; there is no way to disable encryption.
	TLS *tls.Config
	// Offer is what this endpoint advertises in CAPABILITIES
	// (layers, format preference, limits, keepalive).
	Offer  wire.Capabilities
	Limits Limits
	// Handler receives what the peer sends. Required.
	Handler Handler
	Logger  *slog.Logger
	// Heartbeat enables optional heartbeat STATUS frames every keepalive
	// interval of control-stream silence.
	Heartbeat bool
	// HandshakeTimeout bounds QUIC handshake + capability exchange (default 10s).
	HandshakeTimeout time.Duration
}

// Limits are the Resource Exhaustion limits (Section 10.3) plus local caps.
type Limits struct {
	MaxScopeDepth       int           // default 7
	MaxEntitiesPerScope uint64        // default 4,294,967,294
	MaxWindow           uint32        // default 2^31 (in-flight entities)
	CheckpointTimeout   time.Duration // default 30s
	ClaimExpiry         time.Duration // default 86400s
	MaxHeaderBytes      int           // cap on a serialized EntityHeader (default 64 KiB)
	MaxPayloadBytes     uint64        // cap on one entity payload (default 1 GiB)
	ChildrenPerMB       int           // amplification ratio (default 1000)
	MaxIncomingStreams  int64         // concurrent uni streams the peer may open (default 1024)
}

// Negotiated is the outcome of the capability exchange (Section 3.4-3.5).
type Negotiated struct {
	Layer1      bool
	Layer2      bool
	Format      wire.Format
	MaxDepth    int
	MaxWindow   uint32
	MaxPerScope uint64
	Keepalive   time.Duration
	PeerOffer   wire.Capabilities
}

// Handler receives everything the remote endpoint sends. Control-frame
// callbacks run on the session's control goroutine in stream-0 order after
// the session validated them (transition table, layer gating, depth); they
// must not block for long. HandleEntity runs on its own goroutine per
// entity stream.
type Handler interface {
	HandleStatus(s *Session, f wire.StatusFrame)
	HandleScopeDigest(s *Session, f wire.ScopeDigestFrame)
	HandleBarrier(s *Session, f wire.BarrierFrame)
	HandleCheckpoint(s *Session, f *wire.CheckpointFrame)
	HandleGoAway(s *Session, f wire.GoAwayFrame)
	// HandleEntity gets an incoming entity stream whose header is decoded.
	// Read e.Payload to EOF: a checksum or length mismatch surfaces as a
	// *wire.Error from Read (the session aborts the stream with 0x04/0x05
	// and reports FAILED on stream 0).
	HandleEntity(s *Session, e *IncomingEntity)
	// HandleClose is called once when the session ends; err is nil on a
	// graceful close, else a *wire.Error or transport error. Entities
	// without a terminal status are to be treated as failed (Section 5.3).
	HandleClose(s *Session, err error)
}

// IncomingEntity is one received entity stream.
type IncomingEntity struct {
	Header  *wire.EntityHeader
	Payload io.Reader // streamed; verifies length and SHA-256 at EOF
	// Abort stops the stream with a PipeStream error code (RESET/STOP_SENDING).
	Abort func(code wire.ErrorCode)
}

// Session is one PipeStream connection.
type Session struct{ impl *session }

// Dial opens a client session: QUIC handshake, stream 0, capability
// exchange. It returns once the exchange completed.
func Dial(ctx context.Context, addr string, cfg Config) (*Session, error) {
	return dial(ctx, addr, cfg)
}

// Listener accepts server sessions.
type Listener struct{ impl *listener }

// Listen starts a server endpoint on a UDP address ("127.0.0.1:0" picks a port).
func Listen(addr string, cfg Config) (*Listener, error) { return listen(addr, cfg) }

// Accept returns the next session whose capability exchange completed.
func (l *Listener) Accept(ctx context.Context) (*Session, error) { return l.impl.accept(ctx) }

// Addr is the bound UDP address.
func (l *Listener) Addr() net.Addr { return l.impl.addr() }

// Close stops accepting and closes all sessions with PIPESTREAM_NO_ERROR.
func (l *Listener) Close() error { return l.impl.close() }

// Role of this endpoint.
func (s *Session) Role() Role { return s.impl.role }

// Negotiated capabilities.
func (s *Session) Negotiated() Negotiated { return s.impl.negotiated }

// ID is a stable random session identifier (binds yield tokens).
func (s *Session) ID() string { return s.impl.id }

// AssignID allocates the next root-scope entity ID (Section 9.1), blocking
// while the window is full (backpressure) until the cursor advances or ctx
// ends. Client role only.
func (s *Session) AssignID(ctx context.Context) (uint32, error) { return s.impl.assignID(ctx) }

// SendEntity opens a unidirectional stream, writes the entity header and
// streams payload until EOF, then closes the stream (FIN). h.PayloadLength
// must be the exact payload size; h.Checksum, if set, must be its SHA-256.
// A short or long payload aborts the stream with 0x05.
func (s *Session) SendEntity(ctx context.Context, h *wire.EntityHeader, payload io.Reader) error {
	return s.impl.sendEntity(ctx, h, payload)
}

// SendStatus writes a STATUS frame on stream 0 after checking it against the
// local view of that entity (transition table, layer gating, depth).
func (s *Session) SendStatus(f wire.StatusFrame) error { return s.impl.sendStatus(f) }

// SendScopeDigest, SendBarrier, SendCheckpoint write those frames on stream 0.
func (s *Session) SendScopeDigest(f wire.ScopeDigestFrame) error { return s.impl.sendScopeDigest(f) }
func (s *Session) SendBarrier(f wire.BarrierFrame) error         { return s.impl.sendBarrier(f) }
func (s *Session) SendCheckpoint(f *wire.CheckpointFrame) error  { return s.impl.sendCheckpoint(f) }

// Checkpoint sends a CHECKPOINT request and waits until it is satisfied
// (Section 9.3) or its timeout passes.
func (s *Session) Checkpoint(ctx context.Context, f *wire.CheckpointFrame) error {
	return s.impl.checkpoint(ctx, f)
}

// GoAway starts graceful shutdown (Section 6.5): sends GOAWAY, waits until
// every in-flight entity is terminal or ctx ends, then closes with 0x00.
func (s *Session) GoAway(ctx context.Context) error { return s.impl.goAway(ctx) }

// SetDetached excludes (on = true) or re-includes an entity that has no
// terminal status from the GOAWAY drain: GoAway does not wait for a
// detached entity. The processing peer detaches a DEFERRED entity whose
// claim check is persisted (it outlives the session, docs/profile.md 6) and
// a document root that waits only for such entities. Any later status of
// the entity re-includes it. Added by the peer helper (additive).
func (s *Session) SetDetached(scope, id uint32, on bool) error {
	return s.impl.setDetached(scope, id, on)
}

// CloseWithError closes the connection with a PipeStream error code.
func (s *Session) CloseWithError(code wire.ErrorCode, msg string) error {
	return s.impl.closeWithError(code, msg)
}

// Done is closed when the session has ended; Err then tells why.
func (s *Session) Done() <-chan struct{} { return s.impl.done }
func (s *Session) Err() error            { return s.impl.err() }

// SetPolicy records the completion policy that governs root entity id and,
// through their parent-id, its children, before any of their streams are
// sent (a dehydrated document's root header travels last). The session
// needs it to know whether a FAILED entity may still be RETRYING (Layer 2)
// and so whether FAILED resolves its ID (Section 9.1). A header sent with
// SendEntity that carries a completion-policy registers it too.
func (s *Session) SetPolicy(id uint32, p *wire.CompletionPolicy) error {
	return s.impl.setPolicy(id, p)
}
