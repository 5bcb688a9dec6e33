package quicpeer

import (
	"errors"
	"log/slog"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// resolved is a validated Config with every default filled in.
type resolved struct {
	Config
	offer wire.Capabilities // what goes on the wire in CAPABILITIES
}

func (l Limits) withDefaults() Limits {
	if l.MaxScopeDepth <= 0 || l.MaxScopeDepth > defaultMaxScopeDepth {
		l.MaxScopeDepth = defaultMaxScopeDepth
	}
	if l.MaxEntitiesPerScope == 0 || l.MaxEntitiesPerScope > defaultMaxEntitiesPerScope {
		l.MaxEntitiesPerScope = defaultMaxEntitiesPerScope
	}
	if l.MaxWindow == 0 || l.MaxWindow > wire.MaxSafeWindow {
		l.MaxWindow = wire.MaxSafeWindow
	}
	if l.CheckpointTimeout <= 0 {
		l.CheckpointTimeout = defaultCheckpointTimeout
	}
	if l.ClaimExpiry <= 0 {
		l.ClaimExpiry = defaultClaimExpiry
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = defaultMaxHeaderBytes
	}
	if l.MaxPayloadBytes == 0 {
		l.MaxPayloadBytes = defaultMaxPayloadBytes
	}
	if l.ChildrenPerMB <= 0 {
		l.ChildrenPerMB = defaultChildrenPerMB
	}
	if l.MaxIncomingStreams <= 0 {
		l.MaxIncomingStreams = defaultMaxIncomingStreams
	}
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = defaultHeaderTimeout
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = defaultMaxConnections
	}
	if l.ControlWriteTimeout <= 0 {
		l.ControlWriteTimeout = defaultControlWriteTimeout
	}
	return l
}

// resolve validates cfg (the one place options are checked) and builds the
// CAPABILITIES offer: the configured Offer, with Layer 0 always on and each
// limit lowered to the local Limits, so both ends compute the same minimum.
func resolve(cfg Config) (*resolved, error) {
	if cfg.Handler == nil {
		return nil, errors.New("quicpeer: Config.Handler is required")
	}
	t, err := secureTLS(cfg.TLS)
	if err != nil {
		return nil, err
	}
	cfg.TLS = t
	if cfg.Profile && cfg.Framing != FramingDraft04 {
		t.NextProtos = []string{ALPNProfile, ALPN}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = defaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	cfg.Limits = cfg.Limits.withDefaults()
	o := cfg.Offer
	o.Layer0Core = true
	// Depth 0 is a real offer (no nesting, Section 10.4), so an explicit
	// Offer.MaxScopeDepth of 0 counts; for the window and the per-scope
	// limit 0 would allow no entity at all and means "the limit".
	depth := uint64(cfg.Limits.MaxScopeDepth)
	if o.MaxScopeDepth != nil && *o.MaxScopeDepth < depth {
		depth = *o.MaxScopeDepth
	}
	o.MaxScopeDepth = &depth
	o.MaxEntitiesPerScope = minPtr(o.MaxEntitiesPerScope, cfg.Limits.MaxEntitiesPerScope)
	o.MaxWindowSize = minPtr(o.MaxWindowSize, uint64(cfg.Limits.MaxWindow))
	if o.SerializationFormat != nil && *o.SerializationFormat != wire.FormatCBOR && *o.SerializationFormat != wire.FormatProtobuf {
		return nil, errors.New("quicpeer: Config.Offer.SerializationFormat must be FormatCBOR or FormatProtobuf")
	}
	return &resolved{Config: cfg, offer: o}, nil
}

func minPtr(p *uint64, limit uint64) *uint64 {
	v := limit
	if p != nil && *p != 0 && *p < v {
		v = *p
	}
	return &v
}

// negotiate computes the common capabilities (Section 3.4,
// docs/profile.md section 1) with wire.Negotiate; both ends run it on the
// same two offers and get the same result.
func negotiate(local, peer wire.Capabilities) Negotiated {
	w := wire.Negotiate(&local, &peer)
	ka := min(w.KeepaliveMs, maxKeepaliveMs)
	return Negotiated{
		Layer1:      w.Layer1,
		Layer2:      w.Layer2,
		Format:      w.Format,
		MaxDepth:    int(w.MaxScopeDepth),
		MaxWindow:   w.MaxWindowSize,
		MaxPerScope: w.MaxEntitiesPerScope,
		Keepalive:   time.Duration(ka) * time.Millisecond,
		PeerOffer:   peer,
	}
}

// clientOffer is what a client sends: under draft-04 exactly the six Layer
// 0 members (the reference's CAPABILITIES map is closed), and under auto
// too whenever nothing is lost by it (the other members are the draft
// defaults), so that a first contact with a draft-04 peer succeeds and its
// framing can be detected on receipt.
func clientOffer(cfg *resolved) wire.Capabilities {
	if cfg.Framing == FramingDraft04 || (cfg.Framing == FramingAuto && wire.Layer0Lossless(&cfg.offer)) {
		return wire.Layer0Only(cfg.offer)
	}
	return cfg.offer
}

// serverReply is what a server answers to the client's CAPABILITIES c:
// the negotiated set (wire.Answer: common layers only, the smaller window,
// keepalive and limits), as the draft-04 reference server answers, so the
// answer never exceeds the offer (the reference client refuses one that
// does). It has exactly the six Layer 0 members for a draft-04 client, or
// for any client that sent only those when nothing is lost by it (the
// depth and per-scope limits are the draft defaults; a draft-04 client in
// auto mode looks like that; a draft-02 client takes absent members as the
// defaults).
func serverReply(cfg *resolved, c *wire.Capabilities) wire.Capabilities {
	a := wire.Answer(&cfg.offer, c)
	six := wire.OnlyLayer0Members(c) && wire.Layer0Lossless(&a)
	if cfg.Framing == FramingDraft04 || (cfg.Framing == FramingAuto && six) {
		return wire.Layer0Only(a)
	}
	return a
}
