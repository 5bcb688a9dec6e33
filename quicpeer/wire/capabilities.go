package wire

import "fmt"

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

// Answer is the CAPABILITIES a server sends back to an offer: the
// negotiated set (Negotiate of its own offer and the client's), so that
// the answer never exceeds what the client offered (the draft-04
// reference client refuses one that does, ValidateAnswer). A draft-02
// client that takes the minimum of its offer and the answer computes the
// same result. Layer0Only drops the depth and per-scope members for a
// draft-04 client.
func Answer(local, remote *Capabilities) Capabilities {
	n := Negotiate(local, remote)
	w, ka, f := uint64(n.MaxWindowSize), n.KeepaliveMs, n.Format
	d, e := n.MaxScopeDepth, n.MaxEntitiesPerScope
	return Capabilities{Layer0Core: true, Layer1Recursive: n.Layer1, Layer2Resilience: n.Layer2,
		MaxWindowSize: &w, KeepaliveTimeoutMs: &ka, SerializationFormat: &f,
		MaxScopeDepth: &d, MaxEntitiesPerScope: &e}
}

// ValidateAnswer is the draft-04 reference client's check of the server's
// CAPABILITIES (validate_response): the answer may not exceed the offer.
// A layer the client did not offer, Layer 2 without Layer 1, a window of 0
// or above the offered one, a keepalive above the offered one, deeper
// scopes or more entities per scope than offered (with Layer 1), or a
// serialization format the client did not offer is PIPESTREAM_FRAME_ERROR
// (0x0D), the reference's code.
func ValidateAnswer(offer, answer *Capabilities) error {
	why := ""
	switch {
	case !answer.Layer0Core:
		why = "layer0-core is false"
	case answer.Layer1Recursive && !offer.Layer1Recursive:
		why = "layer1-recursive was not offered"
	case answer.Layer2Resilience && (!offer.Layer2Resilience || !answer.Layer1Recursive):
		why = "layer2-resilience was not offered or comes without layer1-recursive"
	case answer.MaxWindowSize != nil && (*answer.MaxWindowSize == 0 || *answer.MaxWindowSize > orDefault(offer.MaxWindowSize, uint64(MaxSafeWindow))):
		why = fmt.Sprintf("max-window-size %d is 0 or above the offered %d", *answer.MaxWindowSize, orDefault(offer.MaxWindowSize, uint64(MaxSafeWindow)))
	case orDefault(answer.KeepaliveTimeoutMs, DefaultKeepaliveMs) > orDefault(offer.KeepaliveTimeoutMs, DefaultKeepaliveMs):
		why = fmt.Sprintf("keepalive-timeout-ms %d is above the offered %d", orDefault(answer.KeepaliveTimeoutMs, DefaultKeepaliveMs), orDefault(offer.KeepaliveTimeoutMs, DefaultKeepaliveMs))
	case answer.Layer1Recursive && orDefault(answer.MaxScopeDepth, DefaultMaxScopeDepth) > orDefault(offer.MaxScopeDepth, DefaultMaxScopeDepth):
		why = "max-scope-depth is above the offered one"
	case answer.Layer1Recursive && orDefault(answer.MaxEntitiesPerScope, DefaultMaxEntitiesPerScope) > orDefault(offer.MaxEntitiesPerScope, DefaultMaxEntitiesPerScope):
		why = "max-entities-per-scope is above the offered one"
	case fmtOf(answer) != FormatCBOR && fmtOf(answer) != fmtOf(offer):
		why = fmt.Sprintf("serialization-format %d was not offered", fmtOf(answer))
	}
	if why == "" {
		return nil
	}
	return Errorf(CodeFrameError, "the server's CAPABILITIES exceeds the offer: %s", why)
}
