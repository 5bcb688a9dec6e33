// Package quicpeer is a draft-krickert-pipestream-02 endpoint over quic-go,
// in both roles: the gateway dials peers as a client (and owns the root
// entity-ID space of the connection), the processing peer listens as a
// server. See docs/profile.md for who sends what.
//
// CONTRACT FILE: the types below, Dial and Listen (handshake.go) and the
// methods of Session (session.go, entity.go, status.go, checkpoint.go,
// goaway.go, framing.go) are what bridge/ and quicpeer/peer code against.
// Keep signatures stable; document changes.
package quicpeer

import (
	"crypto/tls"
	"io"
	"log/slog"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// ALPN is the draft-02 ALPN identifier (Section 11.1).
const ALPN = "pipestream/1"

// ALPNProfile is offered ahead of ALPN by an endpoint that speaks this
// project's profile (Config.Profile, docs/profile.md 1.1): a server that
// knows it selects it, any other selects ALPN (RFC 7301), so offering it
// cannot break a peer. The wire is pipestream/1 either way.
const ALPNProfile = "pipestream-profile/1"

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
	// (layers, format preference, limits, keepalive). Each limit is
	// lowered to Limits; Offer.MaxScopeDepth pointing at 0 offers depth 0
	// (no nested scope; Limits.MaxScopeDepth 0 means the default 7), while
	// 0 for max-window-size or max-entities-per-scope means "use Limits".
	// A client sends it; a server answers the negotiated set of it and the
	// client's (wire.Answer), never more than the client offered.
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
	// IdleTimeout is a client session's QUIC idle timeout (transport
	// liveness, Section 5.1.4): the session ends when the peer sent
	// nothing, not even an ACK of the PINGs sent every IdleTimeout/3, for
	// this long, so a peer killed without CONNECTION_CLOSE is noticed
	// within it. 0: DefaultIdleTimeout (3 s); never above 3 x keepalive.
	// QUIC takes the smaller of both ends' values, so the server side of
	// the connection gets it too. Listeners ignore it.
	IdleTimeout time.Duration
	// StatelessResetKey, when set, makes a listening endpoint answer
	// packets of connections it does not know with a QUIC stateless reset
	// (RFC 9000 Section 10.3), and derives the reset tokens it hands out
	// from it. Give a restarted server the same key and its clients' old
	// sessions end at their next packet instead of after the idle timeout
	// (3 x keepalive). Keep it secret and stable per listening address
	// (the processing peer persists one in <data-dir>/peer-reset.key).
	// nil: no stateless resets are sent. Listen uses it; Dial ignores it
	// (a restarted client gets a new UDP port, which no old packet reaches).
	// Added for peer restarts (additive).
	StatelessResetKey *[32]byte
	// Framing of fixed control frames: FramingAuto (default), draft-02 or
	// draft-04 (docs/profile.md 1.2). Added for interoperability
	// (additive).
	Framing Framing
	// Profile offers this project's profile through ALPN (ALPNProfile);
	// Negotiated.Profile says whether the other end selected it. Never
	// under FramingDraft04. Additive.
	Profile bool
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
	// HeaderTimeout bounds how long an incoming entity stream may take to
	// deliver its whole entity header (default 10 s); a slower one is
	// stopped with 0x05 (STOP_SENDING) and its goroutine freed (slowloris).
	// Added for the adversary tests (additive).
	HeaderTimeout time.Duration
	// MaxConnections caps the QUIC connections a listener holds at once
	// (default 256); each costs a session, its goroutines and flow-control
	// memory. One beyond it is closed right after the QUIC handshake with
	// PIPESTREAM_INTERNAL_ERROR (0x01) and a reason naming the limit.
	// Ignored by Dial. Added for the adversary tests (additive).
	MaxConnections int
	// ControlWriteTimeout bounds one write on stream 0 (default 10 s): a
	// peer that stops reading its control stream fills its flow-control
	// window, and a write that cannot complete within this ends the
	// session with PIPESTREAM_IDLE_TIMEOUT (0x02; a partly written frame
	// cannot be taken back), so no caller (a Handler callback, the
	// gateway's document code) waits on such a peer longer than this.
	// Added for issue 21 (additive).
	ControlWriteTimeout time.Duration
	// InlineResultBytes is the most extension octets of a received
	// COMPLETE status the session keeps for HandleStatus: an endpoint
	// that offers inline results (docs/profile.md 4.3.2) sets its offer
	// here. A longer extension is skipped as it arrives, never buffered,
	// and delivered with f.Ext nil and f.ExtSkipped its length (draft-02
	// Section 6.6.1: a receiver skips an extension it does not take;
	// wire.StatusFrame.InlineResult then fails with 0x06). 0 (default):
	// every COMPLETE extension is skipped. Draft-02 framing only (a
	// draft-04 frame's Length bounds it as before). Added for issue 25
	// (additive).
	InlineResultBytes int
}

// Negotiated is the outcome of the capability exchange (Section 3.4).
type Negotiated struct {
	Layer1      bool
	Layer2      bool
	Format      wire.Format
	MaxDepth    int
	MaxWindow   uint32
	MaxPerScope uint64
	Keepalive   time.Duration
	PeerOffer   wire.Capabilities
	// Profile: both ends offered the profile (ALPN ALPNProfile was
	// selected, docs/profile.md 1.1). Additive.
	Profile bool
}

// Handler receives everything the remote endpoint sends.
//
// Threading: the control-frame callbacks (HandleStatus, HandleScopeDigest,
// HandleBarrier, HandleCheckpoint, HandleGoAway) run one at a time on the
// session's control goroutine, in stream-0 order, after the session
// validated the frame (transition table, layer gating, depth, scope 0,
// GOAWAY monotonicity). While one runs, stream 0 is not read: they must not
// block for long. They may call any Session method (SendStatus etc.),
// except waiting ones (Checkpoint, GoAway, a full-window AssignID), which
// would wait for frames this goroutine has to read. HandleEntity runs on
// its own goroutine per entity stream, concurrently with everything else.
// HandleClose runs once, last, after the control goroutine has stopped.
type Handler interface {
	// HandleStatus gets every accepted entity STATUS. f.Ext aliases the
	// session's read buffer and is valid only until the callback returns:
	// copy it to keep it (wire.StatusFrame.Yield/ClaimCheck/InlineResult
	// alias it too). A COMPLETE extension above Limits.InlineResultBytes
	// arrives skipped: f.Ext nil, f.ExtSkipped its length.
	// Statuses ignored under the race rule or for entities behind the
	// cursor are not delivered. Heartbeats are consumed by the session; on
	// the server, the client's cursor updates (entity 0xFFFFFFFF, C=1) are
	// delivered after the session applied them.
	HandleStatus(s *Session, f wire.StatusFrame)
	HandleScopeDigest(s *Session, f wire.ScopeDigestFrame)
	HandleBarrier(s *Session, f wire.BarrierFrame)
	// HandleCheckpoint gets both requests (flags 0; the session itself
	// answers with flags=1 once Section 9.3 condition 1 holds) and
	// acknowledgements (flags 1; a pending Checkpoint call returns). f is
	// freshly decoded and may be kept.
	HandleCheckpoint(s *Session, f *wire.CheckpointFrame)
	// HandleGoAway: from now on AssignID and SendEntity above
	// f.LastEntityID fail with ErrGoAway; dial a new session for new work.
	HandleGoAway(s *Session, f wire.GoAwayFrame)
	// HandleEntity gets an incoming entity stream whose header is decoded
	// (e.Header is the caller's to keep). Read e.Payload to io.EOF before
	// committing a result (Section 10.2): a checksum or length mismatch
	// surfaces as a *wire.Error from Read, the session then aborts the
	// stream with 0x04/0x05 and reports FAILED on stream 0; a stream the
	// sender reset is reported FAILED too. When HandleEntity returns
	// without reading to EOF, the rest of the stream is discarded
	// (STOP_SENDING 0x00) and no status is sent for it.
	HandleEntity(s *Session, e *IncomingEntity)
	// HandleClose is called once when the session ends; err is nil on a
	// graceful close (PIPESTREAM_NO_ERROR by either side), a *CloseError
	// for other PipeStream codes (wire.CodeOf works), else the transport
	// error (e.g. idle timeout). Entities without a terminal status are to
	// be treated as failed (Section 5.3).
	HandleClose(s *Session, err error)
}

// IncomingEntity is one received entity stream.
type IncomingEntity struct {
	Header  *wire.EntityHeader
	Payload io.Reader // streamed; verifies length and SHA-256 at EOF
	// Abort stops the stream with a PipeStream error code (STOP_SENDING),
	// e.g. 0x0A/0x0B for a claim redemption. The caller reports the
	// entity's status itself.
	Abort func(code wire.ErrorCode)
}
