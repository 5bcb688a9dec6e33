package wire_test

import (
	"testing"

	"github.com/fxamacker/cbor/v2"
	"google.golang.org/protobuf/proto"

	protocolv1 "github.com/pipestream/gateway/gen/pipestream/protocol/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestPipeDocRequiredFields: Section 7 marks doc_id and entity_id REQUIRED.
// A PipeDoc lacking either is refused with PIPESTREAM_ENTITY_INVALID (0x05)
// in both serialization formats; the minimal valid one (both present)
// decodes. The bodies are built without the codec's Marshal, which would
// always write both members.
func TestPipeDocRequiredFields(t *testing.T) {
	cborBody := func(t *testing.T, m map[string]any) []byte {
		b, err := cbor.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pbBody := func(t *testing.T, m *protocolv1.PipeDoc) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name  string
		cbor  map[string]any
		pb    *protocolv1.PipeDoc
		valid bool
	}{
		{"both present", map[string]any{"doc-id": "d", "entity-id": 7}, &protocolv1.PipeDoc{DocId: proto.String("d"), EntityId: proto.Uint32(7)}, true},
		{"doc-id missing", map[string]any{"entity-id": 7}, &protocolv1.PipeDoc{EntityId: proto.Uint32(7)}, false},
		{"entity-id missing", map[string]any{"doc-id": "d"}, &protocolv1.PipeDoc{DocId: proto.String("d")}, false},
		{"both missing", map[string]any{"blob": []byte("x")}, &protocolv1.PipeDoc{Blob: []byte("x")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bodies := map[wire.Format][]byte{wire.FormatCBOR: cborBody(t, tc.cbor), wire.FormatProtobuf: pbBody(t, tc.pb)}
			for fm, b := range bodies {
				d, err := wire.CodecFor(fm).UnmarshalPipeDoc(b)
				if tc.valid {
					if err != nil || d.DocID != "d" || d.EntityID != 7 {
						t.Fatalf("%s: %+v, %v", fm, d, err)
					}
					continue
				}
				if got := wire.CodeOf(err); err == nil || got != wire.CodeEntityInvalid {
					t.Fatalf("%s: err %v (code %v), want %v", fm, err, got, wire.CodeEntityInvalid)
				}
			}
		})
	}
}

// TestEntityHeaderFourLayers: Section 4.1.6 requires four data
// representation layers. The EntityHeader layer member carries each of
// 0-3 intact through both formats; a received 4 is 0x05 (see also
// TestCodecRejects, which also checks that WriteEntityHeader refuses it).
func TestEntityHeaderFourLayers(t *testing.T) {
	run(t, func(t *testing.T, c wire.Codec) {
		for layer := range uint8(4) {
			b, err := c.MarshalEntityHeader(&wire.EntityHeader{EntityID: 1, Layer: layer, PayloadLength: 1})
			if err != nil {
				t.Fatalf("layer %d: %v", layer, err)
			}
			h, err := c.UnmarshalEntityHeader(b)
			if err != nil || h.Layer != layer {
				t.Fatalf("layer %d: got %+v, %v", layer, h, err)
			}
		}
		b, err := c.MarshalEntityHeader(&wire.EntityHeader{EntityID: 1, Layer: 4, PayloadLength: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.UnmarshalEntityHeader(b); wire.CodeOf(err) != wire.CodeEntityInvalid {
			t.Fatalf("layer 4 accepted: %v", err)
		}
	})
}
