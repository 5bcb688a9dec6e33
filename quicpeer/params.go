package quicpeer

import "time"

// DefaultIdleTimeout is a client session's QUIC idle timeout when
// Config.IdleTimeout is 0: a peer killed without CONNECTION_CLOSE (kill
// -9, a lost host) is noticed within 3 s and its documents re-dispatched
// (issue 22), while three PINGs a second apart leave room for a lost
// packet or two on a live path.
const DefaultIdleTimeout = 3 * time.Second

// Tunables of the session layer, each with the reason for its value. Limits
// that the draft names (Section 10.3) default to the draft's values.
const (
	// defaultMaxScopeDepth is the Resource Exhaustion default (8 levels, 0-7).
	defaultMaxScopeDepth = 7
	// defaultMaxEntitiesPerScope is the Resource Exhaustion default.
	defaultMaxEntitiesPerScope uint64 = 4_294_967_294
	// maxKeepaliveMs caps a negotiated keepalive (one day) so that the
	// millisecond value never overflows a time.Duration.
	maxKeepaliveMs = 86_400_000
	// maxLiveScopes bounds the Layer 1 scopes tracked at once per
	// connection; each costs a map, and a peer could open scopes forever.
	maxLiveScopes = 1 << 16
	// maxPendingCheckpoints bounds received CHECKPOINT requests awaiting
	// satisfaction; further requests are ignored (and time out at the peer).
	maxPendingCheckpoints = 1024
	// defaultCheckpointTimeout is the Resource Exhaustion default.
	defaultCheckpointTimeout = 30 * time.Second
	// defaultClaimExpiry is the Resource Exhaustion default (86400 s).
	defaultClaimExpiry = 24 * time.Hour
	// defaultMaxHeaderBytes caps a serialized EntityHeader: headers are small
	// maps; 64 KiB leaves room for generous metadata without letting a peer
	// make us buffer megabytes before the payload starts.
	defaultMaxHeaderBytes = 64 << 10
	// defaultMaxPayloadBytes caps one entity payload; documents beyond 1 GiB
	// are dehydrated into chunks by the gateway anyway.
	defaultMaxPayloadBytes uint64 = 1 << 30
	// defaultChildrenPerMB is the Amplification Attacks recommended ratio.
	defaultChildrenPerMB = 1000
	// defaultMaxIncomingStreams bounds concurrent peer-opened uni streams
	// (QUIC MAX_STREAMS); each one costs a goroutine and flow-control memory.
	defaultMaxIncomingStreams int64 = 1024
	// defaultHeaderTimeout bounds the arrival of one entity header: headers
	// are at most 64 KiB and sent in one write, so 10 s is generous on any
	// working path, while a stream that trickles its header (one octet per
	// stream, slowloris) holds a worker goroutine only this long.
	defaultHeaderTimeout = 10 * time.Second
	// defaultMaxConnections caps a listener's concurrent connections: a
	// peer serves a few gateways (one session each, plus redials while an
	// old session drains); 256 leaves ample room and bounds what a flood
	// of handshakes can pin.
	defaultMaxConnections = 256
	// defaultControlWriteTimeout bounds one stream-0 write (Limits.
	// ControlWriteTimeout): frames are at most a few KiB, so on a working
	// path a write completes within round trips; one that waits 10 s for
	// flow-control credit has a peer that stopped reading stream 0.
	defaultControlWriteTimeout = 10 * time.Second
	// defaultHandshakeTimeout bounds QUIC handshake plus CAPABILITIES exchange.
	defaultHandshakeTimeout = 10 * time.Second
	// maxCapabilitiesBytes caps the first CAPABILITIES body: the structure has
	// eight small members, so 4 KiB is generous, and the exchange happens
	// before any limit is negotiated.
	maxCapabilitiesBytes = 4 << 10
	// framingWait bounds how long a server in FramingAuto holds its first
	// fixed frame for the client's first STATUS (which shows its framing):
	// our clients and the reference send one right after CAPABILITIES, so
	// it arrives within a round trip; a draft-02 client that sends none
	// delays only the first status, by at most this.
	framingWait = 250 * time.Millisecond
	// cursorUpdateInterval coalesces connection-level cursor updates
	// (docs/profile.md section 2: at most one per 10 ms while the cursor moves).
	cursorUpdateInterval = 10 * time.Millisecond
	// copyBufferSize is the pooled buffer for streaming entity payloads: large
	// enough to amortize stream-write overhead, small enough to pool per stream.
	copyBufferSize = 64 << 10
	// minPayloadRead: writeEntity reads payload after the header in the
	// copy buffer only while at least this much room is left.
	minPayloadRead = 4 << 10
	// probesPerIdle: a client sends a QUIC PING every IdleTimeout /
	// probesPerIdle (otherwise half the keepalive, 15 s by default), so a
	// live but quiet peer ACKs several before the idle timeout while a
	// dead one is noticed within Config.IdleTimeout even when the gateway
	// has nothing to send (a bare PING is too small to draw a stateless
	// reset, RFC 9000 10.3). Transport liveness only (Section 5.1.4);
	// stream-0 silence is still judged by 3 x keepalive.
	probesPerIdle = 3
	// serverConnIDLen is the length of the connection IDs a listener
	// issues (quic-go's default is 4): quic-go answers only packets longer
	// than 42 octets with a stateless reset, and 4 more octets in every
	// client packet make a packet with a single STATUS frame long enough.
	serverConnIDLen = 8
	// idleFactor: stream-0 silence of idleFactor*keepalive may close the
	// connection with PIPESTREAM_IDLE_TIMEOUT (Section 5.1.4).
	idleFactor = 3
	// workerIdle is the period of the entity-stream workers' trim
	// (workers.go): a worker no stream needed for a whole period exits
	// within two; long enough to carry a burst, short enough that an idle
	// session holds no workers.
	workerIdle = time.Second
	// goawayLinger is how long a drained session waits before its
	// CONNECTION_CLOSE, which would discard stream data the peer has not
	// received yet (the last statuses and result streams); the peer
	// usually closes first.
	goawayLinger = 500 * time.Millisecond
	// windowGrace is how long the server lets its count of unresolved root
	// entities stay above the window before closing with 0x08: the excess
	// must be the client's own terminal statuses still in flight on stream
	// 0 (window.go), which QUIC delivers within an RTT plus loss recovery;
	// 2 s covers several lost-packet timeouts on a healthy path.
	windowGrace = 2 * time.Second
	// windowRecheck delays the window deadline while the control loop is
	// busy with a frame (unread stream-0 data may still make room).
	windowRecheck = 50 * time.Millisecond
	// closeDrainTimeout bounds how long a session waits for its internal
	// goroutines after the connection ended.
	closeDrainTimeout = 5 * time.Second
)
