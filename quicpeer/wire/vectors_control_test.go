package wire_test

import (
	"bytes"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

func readOneFrame(t *testing.T, b []byte) (wire.Frame, error) {
	t.Helper()
	return wire.NewControlReader(bytes.NewReader(b), 0).Next()
}

func ptr[T any](v T) *T { return &v }

// defaultCaps is the content of valid-capabilities-default.bin.
func defaultCaps() *wire.Capabilities {
	return &wire.Capabilities{
		Layer0Core: true, MaxWindowSize: ptr(uint64(1024)), KeepaliveTimeoutMs: ptr(uint64(30000)),
		SerializationFormat: ptr(wire.FormatCBOR),
	}
}

func TestVectorsCapabilitiesDefault(t *testing.T) {
	b := readVec(t, "control-cbor/valid-capabilities-default.bin")
	f, err := readOneFrame(t, b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Type != wire.FrameCapabilities {
		t.Fatalf("type %v", f.Type)
	}
	c := wire.CodecFor(wire.FormatCBOR)
	caps, err := c.UnmarshalCapabilities(f.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.ValidateCapabilities(caps); err != nil {
		t.Fatal(err)
	}
	if !caps.Layer0Core || caps.Layer1Recursive || caps.Layer2Resilience || *caps.MaxWindowSize != 1024 ||
		*caps.KeepaliveTimeoutMs != 30000 || *caps.SerializationFormat != wire.FormatCBOR || caps.MaxScopeDepth != nil {
		t.Fatalf("caps %+v", caps)
	}
	// Deterministic encoding: byte for byte, frame included.
	body, err := c.MarshalCapabilities(defaultCaps())
	if err != nil {
		t.Fatal(err)
	}
	if got := wire.AppendVariable(nil, wire.FrameCapabilities, body); !bytes.Equal(got, b) {
		t.Fatalf("encoded\n%x\nwant\n%x", got, b)
	}
}

func TestVectorsControlCBOR(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	type want struct {
		decodeErr   wire.ErrorCode // from ControlReader or Unmarshal; 0 = decodes
		validateErr wire.ErrorCode // from ValidateCapabilities; 0 = valid
	}
	cases := map[string]want{
		"valid-checkpoint-ack.bin":     {},
		"valid-checkpoint-request.bin": {},
		// Decisions (docs/conformance.md): unknown keys tolerated,
		// non-deterministic order accepted, flags have no draft-02 meaning.
		"invalid-capabilities-unknown-field.bin":      {},
		"invalid-cbor-nondeterministic-map-order.bin": {},
		"invalid-checkpoint-bad-flags.bin":            {},
		"invalid-checkpoint-unknown-field.bin":        {},
		"invalid-capabilities-layer0-false.bin":       {validateErr: wire.CodeLayerUnsupported},
		"invalid-capabilities-window-overflow.bin":    {validateErr: wire.CodeEntityTooLarge},
		"invalid-cbor-indefinite-map.bin":             {decodeErr: wire.CodeEntityInvalid}, // empty map: required members missing
		"invalid-ucf-length-mismatch.bin":             {decodeErr: wire.CodeEntityInvalid}, // stream ends inside the body
		"invalid-ucf-truncated.bin":                   {decodeErr: wire.CodeEntityInvalid},
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			f, err := readOneFrame(t, readVec(t, "control-cbor/"+name))
			if err == nil {
				switch f.Type {
				case wire.FrameCapabilities:
					var caps *wire.Capabilities
					caps, err = c.UnmarshalCapabilities(f.Body)
					if err == nil {
						if verr := wire.ValidateCapabilities(caps); w.validateErr != 0 {
							wantCode(t, verr, w.validateErr)
						} else if verr != nil {
							t.Fatal(verr)
						}
					}
				case wire.FrameCheckpoint:
					var cp *wire.CheckpointFrame
					cp, err = c.UnmarshalCheckpoint(f.Body)
					if err == nil && (cp.CheckpointID != "entity-7" || cp.SequenceNumber != 1 || cp.CheckpointEntityID != 8 || (cp.Flags == nil) != (name == "invalid-checkpoint-unknown-field.bin")) {
						t.Fatalf("checkpoint %+v", cp)
					}
				default:
					t.Fatalf("type %v", f.Type)
				}
			}
			if w.decodeErr != 0 {
				wantCode(t, err, w.decodeErr)
			} else if err != nil {
				t.Fatal(err)
			}
		})
	}
}
