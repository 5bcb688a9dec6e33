// CONTRACT FILE: gateway/ codes against the exported surface below. Keep
// signatures stable; document changes. API messages are the generated
// gatewayv1 types so that no translation layer sits between gateway and
// bridge. The package doc is in doc.go.

package bridge

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
)

// Tenant identifies the caller; "" is the single tenant of an
// unauthenticated deployment. Every lookup is filtered by tenant, and another
// tenant's ids answer ErrNotFound.
type Tenant string

// Errors. The gateway maps them to gRPC codes; each carries a message that
// says what to fix (wrap with fmt.Errorf("...: %w", ErrX)).
var (
	ErrNotFound           = errorString("not found")                               // codes.NotFound
	ErrInvalid            = errorString("invalid argument")                        // codes.InvalidArgument
	ErrConflict           = errorString("request id reused with a different body") // codes.AlreadyExists
	ErrFailedPrecondition = errorString("failed precondition")                     // codes.FailedPrecondition
	ErrClaimRedeemed      = errorString("claim already redeemed")                  // codes.FailedPrecondition, reason CLAIM_ALREADY_REDEEMED
	ErrClaimExpired       = errorString("claim expired")                           // codes.FailedPrecondition, reason CLAIM_EXPIRED
	ErrClaimCancelled     = errorString("claim cancelled")                         // codes.FailedPrecondition, reason CLAIM_CANCELLED
	ErrTooLarge           = errorString("too large")                               // codes.InvalidArgument / HTTP 413
	ErrUnavailable        = errorString("unavailable")                             // codes.Unavailable (shutting down)
	// ErrPeerUnavailable: the claim's entity waits at a peer whose session
	// ended, and no other attempt of the document runs yet (Redeem).
	ErrPeerUnavailable   = errorString("peer unavailable")   // codes.Unavailable, reason PEER_UNAVAILABLE
	ErrResourceExhausted = errorString("resource exhausted") // codes.ResourceExhausted
	// ErrResultAbsent: the document SUCCEEDED but the peer returned no
	// result (a plain peer may not; docs/profile.md 9).
	ErrResultAbsent = errorString("result absent") // codes.NotFound, reason RESULT_ABSENT
)

type errorString string

func (e errorString) Error() string { return string(e) }

// Service is what the gateway calls. *Bridge implements it.
type Service interface {
	// Submit stores the document durably, then dispatches it; it returns
	// once the submission is durable (state PENDING or later).
	Submit(ctx context.Context, t Tenant, req *gatewayv1.SubmitDocumentRequest) (*gatewayv1.Document, error)
	// Upload streams content from r (never buffering it whole) into the
	// store and the peer. opts comes from the first message / query params.
	Upload(ctx context.Context, t Tenant, opts *gatewayv1.SubmitOptions, r io.Reader) (*gatewayv1.Document, error)
	GetDocument(ctx context.Context, t Tenant, id string, withEntities bool) (*gatewayv1.Document, error)
	ListDocuments(ctx context.Context, t Tenant, req *gatewayv1.ListDocumentsRequest) (*gatewayv1.ListDocumentsResponse, error)
	// Result opens the rehydrated output; ErrFailedPrecondition when the
	// document is not SUCCEEDED/PARTIALLY_SUCCEEDED yet.
	Result(ctx context.Context, t Tenant, id string) (contentType string, size int64, rc io.ReadCloser, err error)
	Cancel(ctx context.Context, t Tenant, id string) (*gatewayv1.Document, error)
	GetClaim(ctx context.Context, t Tenant, claimID string) (*gatewayv1.ClaimCheck, error)
	Redeem(ctx context.Context, t Tenant, claimID string) (*gatewayv1.ClaimCheck, error)
	// Watch streams the document's events from cursor (0 = current state
	// first), calling send for each, until the document is terminal or ctx
	// ends. It calls SubscriptionStarted(ctx) once the document was found
	// and the cursor accepted, before the first send.
	Watch(ctx context.Context, t Tenant, id string, cursor uint64, send func(*gatewayv1.WatchDocumentResponse) error) error
	// Events gives access to the event log (subscribe, window, snapshot).
	Events() EventLog
	// Ready reports whether a peer session is up (for /healthz).
	Ready() error
	// Close stops intake, sends GOAWAY, drains within ctx, closes the store.
	Close(ctx context.Context) error
}

// EventLog is the sequenced, resumable log (docs/architecture.md).
type EventLog interface {
	// Subscribe follows the log with AT-sync cursor rules. cursor == nil:
	// live only. It calls send for every event (including the #info
	// OutdatedCursor event) until ctx ends or an error: ErrFutureCursor,
	// ErrConsumerTooSlow. It calls SubscriptionStarted(ctx) once the cursor
	// is accepted, before the first send. clientKey identifies the client for retention
	// tracking (it is hashed with a rotating salt before use).
	Subscribe(ctx context.Context, t Tenant, clientKey string, cursor *uint64, filter EventFilter, send func(*gatewayv1.Event) error) error
	Window(ctx context.Context) (*gatewayv1.EventWindow, error)
	Snapshot(ctx context.Context, t Tenant) (*gatewayv1.Snapshot, error)
	// StreamSnapshot sends t's documents in chunks of at most pageSize
	// (0: DefaultSnapshotPage) with the seq they are all consistent with
	// (one store read transaction), then a final chunk with Last and
	// TotalDocuments. Memory is one chunk whatever the store's size.
	StreamSnapshot(ctx context.Context, t Tenant, pageSize int, send func(*gatewayv1.SnapshotChunk) error) error
	// StreamSnapshotEncoded is StreamSnapshot with every chunk in protobuf
	// wire form, assembled from the stored document bytes without decoding
	// them (the gRPC stream passes it through), in the store's order (the
	// SQLite table's: close to, not exactly, create time), from after the
	// position after on (the zero position: the whole snapshot; the REST
	// page form resumes after a page's last document, the next position
	// send is given); the chunk is valid only during send.
	StreamSnapshotEncoded(ctx context.Context, t Tenant, pageSize int, after SnapshotPosition, send func(chunk []byte, next SnapshotPosition) error) error
}

// WithStartHook returns a context for EventLog.Subscribe and Service.Watch
// that makes them call f once the subscription started: the cursor was
// accepted (no FutureCursor) and nothing has been sent yet. Transports send
// their response headers from f, so that an idle stream answers at once
// while a refused cursor still fails the call before any header
// (package gateway doc, "Streams"). Implementations call SubscriptionStarted.
func WithStartHook(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, startHookKey{}, f)
}

// SubscriptionStarted calls the WithStartHook function of ctx, if any.
// Implementations of EventLog.Subscribe and Service.Watch call it once,
// after the cursor was accepted and before the first send.
func SubscriptionStarted(ctx context.Context) {
	if f, ok := ctx.Value(startHookKey{}).(func()); ok && f != nil {
		f()
	}
}

type startHookKey struct{}

// EventFilter narrows a subscription.
type EventFilter struct {
	Kinds      []string
	DocumentID string
}

// Event log errors.
var (
	ErrFutureCursor    = errorString("FutureCursor: cursor is ahead of the latest event")
	ErrConsumerTooSlow = errorString("ConsumerTooSlow: subscriber fell too far behind")
)

// PeerEndpoint is one PipeStream peer of Options.Peers.
type PeerEndpoint struct {
	// Addr is the UDP host:port of the peer.
	Addr string
	// CAPEM verifies the peer's certificate (a CA bundle or its pinned
	// certificate). Required.
	CAPEM []byte
	// ServerName overrides the TLS server name (default: host of Addr).
	ServerName string
	// Framing toward this peer: FramingDraft02 or FramingDraft04; the
	// zero value (FramingAuto) takes Options.PeerFraming.
	Framing quicpeer.Framing
	// CAFile, when set, is the file CAPEM was read from: it is read again
	// before every dial (a peer restarted with a new certificate is
	// reached without restarting the gateway) and by ReloadPeerCAs.
	CAFile string
}

// Options configure a Bridge (validated in New; zero values take defaults).
//
//	func New(ctx context.Context, opts Options) (*Bridge, error)
//
// New opens the store in DataDir, recovers non-terminal documents, and starts
// the peer connection manager (dial PeerAddr with backoff). *Bridge
// implements Service.
type Options struct {
	DataDir string // the SQLite store with its spool and results (unless Store is set), and scratch files
	// Store is the durable store (nil: the SQLite backend, opened in
	// DataDir). The bridge owns it: Close closes it, also when New fails.
	// DataDir is still required: plain chunk results are spooled there.
	Store Store
	// PeerAddr is the UDP host:port of the PipeStream peer (one peer; for
	// several use Peers and leave PeerAddr, PeerCAPEM and PeerServerName
	// empty).
	PeerAddr string
	// PeerCAPEM verifies the peer's certificate (a CA bundle or the embedded
	// peer's self-signed certificate, pinned). Required.
	PeerCAPEM []byte
	// PeerServerName overrides the TLS server name (default: host of PeerAddr).
	PeerServerName string
	// PeerCAFile is PeerEndpoint.CAFile of the single peer.
	PeerCAFile string
	// Peers are several PipeStream peers (docs/scale-out.md, "Many
	// peers"): each gets its own connection, framing detection and health,
	// and new documents go to the least-loaded healthy one. Empty: the one
	// peer of PeerAddr.
	Peers []PeerEndpoint
	// PeerClientCert enables mutual TLS toward the peer(s) (optional).
	PeerClientCertPEM, PeerClientKeyPEM []byte
	// PreferProtobuf offers the Protobuf serialization format.
	PreferProtobuf bool
	// PeerFraming: quicpeer.FramingAuto (default: draft-02, and draft-04
	// after a peer refuses the draft-02 handshake or its first STATUS shows
	// draft-04), FramingDraft02 or FramingDraft04 (docs/profile.md 1.2).
	PeerFraming quicpeer.Framing
	// PeerProfile: whether documents use this project's profile toward the
	// peer (docs/profile.md 1.1): ProfileAuto (default: when the peer
	// answers the discovery member), ProfileOn, ProfileOff (plain entities,
	// docs/profile.md 9).
	PeerProfile ProfileMode
	// PeerWait bounds how long a document may wait for a peer session
	// before it fails (default 5 minutes).
	PeerWait time.Duration
	// PeerIdleTimeout: a peer session that hears nothing from the peer,
	// not even ACKs of the QUIC PINGs sent every third of it, for this
	// long has lost its peer; its documents are re-dispatched (default
	// quicpeer.DefaultIdleTimeout, 3 s; --peer-idle-timeout).
	PeerIdleTimeout time.Duration
	// PeerDraft04Conns bounds the connections open at once to one draft-04
	// peer (one document per connection, the reference conversation;
	// default 4, --peer-draft04-conns). A peer that serves one connection at
	// a time answers the next one's CAPABILITIES as soon as the previous
	// conversation ends, so the handshakes overlap its work.
	PeerDraft04Conns int
	// CreateHold: a small document sent whole (no request id) is
	// dispatched before its creation commits, and its creation waits up to
	// this long to commit together with its result: one commit instead of
	// two (ridecreate.go, docs/performance.md). Submit answers after that
	// commit. Default (0) 20 ms, at most 5 s; negative: the creation
	// commits first, then the document is dispatched.
	CreateHold time.Duration
	// InlineThreshold: documents up to this size with no split strategy are
	// sent whole (default 1 MiB).
	InlineThreshold int64
	// MaxDocumentBytes caps one document (default 4 GiB).
	MaxDocumentBytes int64
	// MaxDispatchAttempts before a document fails (default 5).
	MaxDispatchAttempts int
	// Logger for structured logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer for Prometheus metrics (nil: none).
	Registerer prometheus.Registerer
	// EventLog tunes the event log's tail and retention (docs/retention.md;
	// zero values take the drafts' defaults). Logger and Registerer, when
	// nil, are the ones above.
	EventLog eventlog.Options
}
