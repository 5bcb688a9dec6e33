package wire

// Draft defaults for absent capabilities members (Section 3.4, 10.3).
const (
	DefaultMaxScopeDepth       = 7
	DefaultMaxEntitiesPerScope = 4_294_967_294
	DefaultKeepaliveMs         = 30_000
)

// ValidateCapabilities checks a received Capabilities (Section 3.4):
//   - layer0-core false -> *Error 0x0C (Layer 0 is mandatory, Section 3.1);
//   - max-scope-depth > 7 -> *Error 0x07 (CDDL uint .le 7);
//   - max-window-size > MaxSafeWindow (0x7FFFFFFE) -> *Error 0x06: a larger
//     window cannot be ordered by is_before (Section 9.3); the draft's
//     2^31 default is replaced by MaxSafeWindow (docs/conformance.md).
//   - max-window-size 0 or max-entities-per-scope 0 -> *Error 0x05 (no
//     entity could ever be sent).
//
// layer2 without layer1 is not an error: negotiation disables Layer 2.
func ValidateCapabilities(c *Capabilities) error {
	switch {
	case !c.Layer0Core:
		return Errorf(CodeLayerUnsupported, "capabilities: layer0-core is false; Layer 0 is mandatory")
	case c.MaxScopeDepth != nil && *c.MaxScopeDepth > MaxScopeDepth:
		return Errorf(CodeDepthExceeded, "capabilities: max-scope-depth %d exceeds %d", *c.MaxScopeDepth, MaxScopeDepth)
	case c.MaxWindowSize != nil && *c.MaxWindowSize > uint64(MaxSafeWindow):
		return Errorf(CodeEntityTooLarge, "capabilities: max-window-size %d exceeds %d (half the circular ID space)", *c.MaxWindowSize, MaxSafeWindow)
	case c.MaxWindowSize != nil && *c.MaxWindowSize == 0:
		return Errorf(CodeEntityInvalid, "capabilities: max-window-size 0")
	case c.MaxEntitiesPerScope != nil && *c.MaxEntitiesPerScope == 0:
		return Errorf(CodeEntityInvalid, "capabilities: max-entities-per-scope 0")
	}
	return nil
}

// Negotiated is the outcome of a capabilities exchange (Section 3.4,
// docs/profile.md 1).
type Negotiated struct {
	Layer1, Layer2      bool
	Format              Format
	MaxScopeDepth       uint64
	MaxEntitiesPerScope uint64
	MaxWindowSize       uint32
	KeepaliveMs         uint64
}

// Negotiate combines two validated Capabilities: a layer is on only if both
// offer it, Layer 2 needs Layer 1, the format is Protobuf only if both
// prefer it (else CBOR), and limits are the minimum of both (draft defaults
// for absent members).
func Negotiate(local, remote *Capabilities) Negotiated {
	n := Negotiated{
		Layer1:              local.Layer1Recursive && remote.Layer1Recursive,
		MaxScopeDepth:       min(orDefault(local.MaxScopeDepth, DefaultMaxScopeDepth), orDefault(remote.MaxScopeDepth, DefaultMaxScopeDepth)),
		MaxEntitiesPerScope: min(orDefault(local.MaxEntitiesPerScope, DefaultMaxEntitiesPerScope), orDefault(remote.MaxEntitiesPerScope, DefaultMaxEntitiesPerScope)),
		MaxWindowSize:       uint32(min(orDefault(local.MaxWindowSize, uint64(MaxSafeWindow)), orDefault(remote.MaxWindowSize, uint64(MaxSafeWindow)), uint64(MaxSafeWindow))),
		KeepaliveMs:         min(orDefault(local.KeepaliveTimeoutMs, DefaultKeepaliveMs), orDefault(remote.KeepaliveTimeoutMs, DefaultKeepaliveMs)),
	}
	n.Layer2 = n.Layer1 && local.Layer2Resilience && remote.Layer2Resilience
	if fmtOf(local) == FormatProtobuf && fmtOf(remote) == FormatProtobuf {
		n.Format = FormatProtobuf
	}
	return n
}

func orDefault(p *uint64, d uint64) uint64 {
	if p == nil {
		return d
	}
	return *p
}

func fmtOf(c *Capabilities) Format {
	if c.SerializationFormat == nil {
		return FormatCBOR
	}
	return *c.SerializationFormat
}

// Layer0Only returns c restricted to the six members the draft-04
// reference suite knows (its CAPABILITIES map is closed): layer0-core,
// layer1-recursive, layer2-resilience, max-window-size,
// keepalive-timeout-ms and serialization-format, each present (absent ones
// get the draft defaults), so the encoding is the reference's canonical
// one (valid-capabilities-default.bin for the reference's defaults).
func Layer0Only(c Capabilities) Capabilities {
	w := min(orDefault(c.MaxWindowSize, uint64(MaxSafeWindow)), uint64(MaxSafeWindow))
	ka := orDefault(c.KeepaliveTimeoutMs, DefaultKeepaliveMs)
	f := fmtOf(&c)
	return Capabilities{
		Layer0Core: c.Layer0Core, Layer1Recursive: c.Layer1Recursive, Layer2Resilience: c.Layer2Resilience,
		MaxWindowSize: &w, KeepaliveTimeoutMs: &ka, SerializationFormat: &f,
	}
}

// Layer0Lossless reports whether Layer0Only(c) means the same as c: every
// member it drops is absent or the draft default.
func Layer0Lossless(c *Capabilities) bool {
	return orDefault(c.MaxScopeDepth, DefaultMaxScopeDepth) == DefaultMaxScopeDepth &&
		orDefault(c.MaxEntitiesPerScope, DefaultMaxEntitiesPerScope) == DefaultMaxEntitiesPerScope
}

// OnlyLayer0Members reports whether a received Capabilities carried none
// of the members outside Layer0Only's six (what a draft-04 endpoint sends;
// a minimal draft-02 one may too).
func OnlyLayer0Members(c *Capabilities) bool {
	return c.MaxScopeDepth == nil && c.MaxEntitiesPerScope == nil
}
