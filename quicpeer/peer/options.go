package peer

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Options configure a processing peer. The zero value of each field takes
// its default; Start validates them in one place.
type Options struct {
	// Framing of the control stream: quicpeer.FramingAuto (default:
	// answer each client in its own framing), FramingDraft02 or
	// FramingDraft04 (docs/profile.md 1.2).
	Framing quicpeer.Framing
	// ListenAddr is the UDP address (default "127.0.0.1:0": loopback, any port).
	ListenAddr string
	// CertFile and KeyFile are PEM files of the server certificate; both or
	// neither. Without them the peer reuses <DataDir>/peer-cert.pem and
	// peer-key.pem, or creates a self-signed certificate there (key 0600)
	// for clients to pin.
	CertFile, KeyFile string
	// ClientCAs, when set, turns on mutual TLS: every client must present
	// a certificate that chains to one of these CAs or the handshake fails
	// (docs/architecture.md, "Security and limits"). nil accepts any client (the default).
	ClientCAs *x509.CertPool
	// CertHosts are the DNS names / IPs of a generated certificate
	// (default localhost, 127.0.0.1, ::1).
	CertHosts []string
	// DataDir holds the claim-check store, the generated certificate, the
	// QUIC stateless reset key (peer-reset.key, reused across restarts) and
	// work/, the spool of child outputs of documents being rehydrated
	// (emptied on start). Required.
	DataDir string
	Logger  *slog.Logger
	// Limits are the draft-02 Section 10.3 limits (zero = draft default);
	// ChildrenPerMB is the Section 10.4 amplification ratio.
	Limits quicpeer.Limits
	// Offer is the CAPABILITIES the peer advertises. Nil offers Layers 0-2
	// and CBOR; set SerializationFormat to FormatProtobuf to prefer Protobuf.
	Offer *wire.Capabilities
	// DrainTimeout bounds the GOAWAY drain on shutdown (default 15 s).
	DrainTimeout time.Duration
	// Workers bounds concurrent processor calls (default GOMAXPROCS, min 2).
	Workers int
	// MaxEntityBytes caps a whole document's payload (its PipeDoc envelope),
	// which the peer buffers (default 64 MiB, never above
	// Limits.MaxPayloadBytes when that is set).
	MaxEntityBytes int64
	// MaxChunkBytes caps one dehydration child's payload (default 16 MiB,
	// never above MaxEntityBytes).
	MaxChunkBytes int64
	// PayloadBudget bounds the payload bytes held in memory across all
	// entities being read or processed (default 16 MiB); an entity larger
	// than the budget runs alone. Child outputs are spooled to
	// <DataDir>/work and never count.
	PayloadBudget int64
	// OrphanDocs and OrphanChildren bound documents known only through
	// their children and those children, per session (default 256 / 4096).
	OrphanDocs, OrphanChildren int
	// Processors replaces the built-in processor set (nil: DefaultProcessors).
	Processors Processors
	// NoStreamResults turns streamed results off (docs/profile.md 4.3.1):
	// every result goes as one stream after the last child finished. For
	// comparisons and for gateways that predate streamed results.
	NoStreamResults bool
}

// resolvedLimits are the engine's local limits.
type resolvedLimits struct {
	maxEntityBytes int64
	maxChunkBytes  int64
	payloadBudget  int64
	orphanDocs     int
	orphanChildren int
	childrenPerMB  int
	claimExpiry    time.Duration
	// noStreamResults: Options.NoStreamResults.
	noStreamResults bool
}

// DefaultOffer is the capabilities offer used when Options.Offer is nil.
func DefaultOffer(preferProtobuf bool) wire.Capabilities {
	o := wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}
	if preferProtobuf {
		f := wire.FormatProtobuf
		o.SerializationFormat = &f
	}
	return o
}

func (o Options) resolve() (Options, resolvedLimits, error) {
	if o.DataDir == "" {
		return o, resolvedLimits{}, errors.New("peer: Options.DataDir is required (claims and the generated certificate live there)")
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return o, resolvedLimits{}, errors.New("peer: set both --cert and --key, or neither (a self-signed certificate is made in the data dir)")
	}
	if o.ListenAddr == "" {
		o.ListenAddr = "127.0.0.1:0"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Offer == nil {
		off := DefaultOffer(false)
		o.Offer = &off
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = defaultDrainTimeout
	}
	if o.Workers <= 0 {
		o.Workers = max(runtime.GOMAXPROCS(0), 2)
	}
	if o.MaxEntityBytes <= 0 {
		o.MaxEntityBytes = defaultMaxEntityBytes
	}
	if o.Limits.MaxPayloadBytes > 0 && uint64(o.MaxEntityBytes) > o.Limits.MaxPayloadBytes {
		o.MaxEntityBytes = int64(o.Limits.MaxPayloadBytes)
	}
	if o.MaxChunkBytes <= 0 {
		o.MaxChunkBytes = defaultMaxChunkBytes
	}
	o.MaxChunkBytes = min(o.MaxChunkBytes, o.MaxEntityBytes)
	if o.PayloadBudget <= 0 {
		o.PayloadBudget = defaultPayloadBudget
	}
	if o.OrphanDocs <= 0 {
		o.OrphanDocs = defaultOrphanDocs
	}
	if o.OrphanChildren <= 0 {
		o.OrphanChildren = defaultOrphanChildren
	}
	if o.Processors == nil {
		o.Processors = DefaultProcessors()
	}
	if o.Limits.MaxScopeDepth > wire.MaxScopeDepth {
		return o, resolvedLimits{}, fmt.Errorf("peer: Limits.MaxScopeDepth %d exceeds the draft maximum %d", o.Limits.MaxScopeDepth, wire.MaxScopeDepth)
	}
	lim := resolvedLimits{maxEntityBytes: o.MaxEntityBytes, maxChunkBytes: o.MaxChunkBytes, payloadBudget: o.PayloadBudget, orphanDocs: o.OrphanDocs, orphanChildren: o.OrphanChildren,
		childrenPerMB: o.Limits.ChildrenPerMB, claimExpiry: o.Limits.ClaimExpiry, noStreamResults: o.NoStreamResults}
	if lim.childrenPerMB <= 0 {
		lim.childrenPerMB = defaultChildrenPerMB
	}
	if lim.claimExpiry <= 0 {
		lim.claimExpiry = 24 * time.Hour // Section 10.3 claim check expiry
	}
	return o, lim, nil
}
