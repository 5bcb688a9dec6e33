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

// Negotiated is the outcome of a capabilities exchange (Section 3.4, 3.5,
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
