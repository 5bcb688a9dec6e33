package wire_test

import (
	"bytes"
	"crypto/sha256"
	"io"
	"reflect"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

var formats = []wire.Format{wire.FormatCBOR, wire.FormatProtobuf}

// run runs f once per serialization format.
func run(t *testing.T, f func(t *testing.T, c wire.Codec)) {
	for _, fm := range formats {
		t.Run(fm.String(), func(t *testing.T) { f(t, wire.CodecFor(fm)) })
	}
}

func fullHeader() *wire.EntityHeader {
	sum := sha256.Sum256([]byte("hello"))
	return &wire.EntityHeader{
		EntityID: 42, ParentID: ptr(uint32(7)), ScopeID: ptr(uint32(0)), Layer: 2, ContentType: "text/plain",
		PayloadLength: 5, Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result", "b": ""},
		ChunkInfo: &wire.ChunkInfo{TotalChunks: 3, ChunkIndex: 1, ChunkOffset: 1 << 20},
		CompletionPolicy: &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum), MaxRetries: ptr(uint32(2)),
			RetryDelayMs: ptr(uint32(250)), TimeoutMs: ptr(uint32(30000)), MinSuccessRatio: ptr(float32(0.75)),
			OnTimeout: ptr(wire.ActionFail), OnFailure: ptr(wire.ActionRetry)},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	run(t, func(t *testing.T, c wire.Codec) {
		caps := []*wire.Capabilities{
			{Layer0Core: true},
			{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true, MaxScopeDepth: ptr(uint64(3)),
				MaxEntitiesPerScope: ptr(uint64(100)), MaxWindowSize: ptr(uint64(1 << 20)),
				SerializationFormat: ptr(wire.FormatProtobuf), KeepaliveTimeoutMs: ptr(uint64(5000))},
		}
		for _, in := range caps {
			b, err := c.MarshalCapabilities(in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.UnmarshalCapabilities(b)
			if err != nil || !reflect.DeepEqual(in, out) {
				t.Fatalf("%+v -> %+v (%v)", in, out, err)
			}
		}
		cps := []*wire.CheckpointFrame{
			{CheckpointID: "c", SequenceNumber: 1 << 40, CheckpointEntityID: 9},
			{CheckpointID: "", SequenceNumber: 0, CheckpointEntityID: 1, ScopeID: ptr(uint32(3)), Flags: ptr(uint64(1)), TimeoutMs: ptr(uint64(30000))},
		}
		for _, in := range cps {
			b, err := c.MarshalCheckpoint(in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.UnmarshalCheckpoint(b)
			if err != nil || !reflect.DeepEqual(in, out) {
				t.Fatalf("%+v -> %+v (%v)", in, out, err)
			}
		}
		hs := []*wire.EntityHeader{fullHeader(), {EntityID: 1, PayloadLength: 0}}
		for _, in := range hs {
			b, err := c.MarshalEntityHeader(in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.UnmarshalEntityHeader(b)
			if err != nil || !reflect.DeepEqual(in, out) {
				t.Fatalf("%+v -> %+v (%v)", in, out, err)
			}
		}
		docs := []*wire.PipeDoc{
			{DocID: "d-1", EntityID: 3},
			{DocID: "d-2", EntityID: 4, Blob: []byte{0, 1, 2}, Ownership: &wire.OwnershipContext{OwnerID: "tenant", GroupID: "g", Scopes: []string{"a", "b"}}},
		}
		for _, in := range docs {
			b, err := c.MarshalPipeDoc(in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.UnmarshalPipeDoc(b)
			if err != nil || !reflect.DeepEqual(in, out) {
				t.Fatalf("%+v -> %+v (%v)", in, out, err)
			}
		}
	})
}

func TestCodecRejects(t *testing.T) {
	run(t, func(t *testing.T, c wire.Codec) {
		enc := func(h *wire.EntityHeader) []byte {
			b, err := c.MarshalEntityHeader(h)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		cases := []struct {
			mod  func(h *wire.EntityHeader)
			code wire.ErrorCode
		}{
			{func(h *wire.EntityHeader) { h.EntityID = 0 }, wire.CodeEntityInvalid},
			{func(h *wire.EntityHeader) { h.ParentID = ptr(uint32(0)) }, wire.CodeEntityInvalid},
			{func(h *wire.EntityHeader) { h.Layer = 4 }, wire.CodeEntityInvalid},
			{func(h *wire.EntityHeader) { h.Checksum = make([]byte, 31) }, wire.CodeIntegrityError},
			{func(h *wire.EntityHeader) { h.Checksum = []byte{} }, wire.CodeIntegrityError},
			{func(h *wire.EntityHeader) { h.CompletionPolicy.Mode = ptr(wire.CompletionMode(9)) }, wire.CodeEntityInvalid},
			{func(h *wire.EntityHeader) { h.CompletionPolicy.MinSuccessRatio = ptr(float32(1.5)) }, wire.CodeEntityInvalid},
		}
		for i, tc := range cases {
			h := fullHeader()
			tc.mod(h)
			_, err := c.UnmarshalEntityHeader(enc(h))
			if c.Format() == wire.FormatCBOR && i == 4 {
				// omitempty drops an empty checksum; see TestCBOREmptyChecksum.
				continue
			}
			wantCode(t, err, tc.code)
			// The sender refuses too.
			if err := wire.WriteEntityHeader(io.Discard, c, h); err == nil && i != 4 {
				t.Fatalf("case %d: WriteEntityHeader sent an invalid header", i)
			}
		}
		// Garbage never panics and is 0x05.
		for _, b := range [][]byte{{0xFF}, {0xA1, 0x61}, bytes.Repeat([]byte{0x81}, 100), {}} {
			_, err := c.UnmarshalEntityHeader(b)
			wantCode(t, err, wire.CodeEntityInvalid)
			_, err = c.UnmarshalCapabilities(b)
			wantCode(t, err, wire.CodeEntityInvalid)
			_, err = c.UnmarshalCheckpoint(b)
			wantCode(t, err, wire.CodeEntityInvalid)
			_, err = c.UnmarshalPipeDoc(b)
			wantCode(t, err, wire.CodeEntityInvalid)
		}
	})
}

func TestCBOREmptyChecksum(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	b, _ := c.MarshalEntityHeader(&wire.EntityHeader{EntityID: 5, PayloadLength: 1})
	// Append "checksum": h'' to the map (a3 -> a4).
	b = append(b, 0x68, 'c', 'h', 'e', 'c', 'k', 's', 'u', 'm', 0x40)
	b[0]++
	_, err := c.UnmarshalEntityHeader(b)
	wantCode(t, err, wire.CodeIntegrityError)
}

func TestCBORDecodeLimits(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	// Nesting 20 levels deep inside an unknown member.
	deep := append([]byte{0xA1, 0x61, 'x'}, bytes.Repeat([]byte{0x81}, 20)...)
	deep = append(deep, 0x00)
	_, err := c.UnmarshalCapabilities(deep)
	wantCode(t, err, wire.CodeEntityInvalid)
	// Duplicate key.
	dup := []byte{0xA2, 0x65, 'l', 'a', 'y', 'e', 'r', 0x00, 0x65, 'l', 'a', 'y', 'e', 'r', 0x01}
	_, err = c.UnmarshalEntityHeader(dup)
	wantCode(t, err, wire.CodeEntityInvalid)
	// Case-sensitive member names: "Entity-Id" is unknown, so entity-id is missing.
	b, _ := c.MarshalEntityHeader(&wire.EntityHeader{EntityID: 5, PayloadLength: 1})
	b = bytes.Replace(b, []byte("entity-id"), []byte("Entity-id"), 1)
	_, err = c.UnmarshalEntityHeader(b)
	wantCode(t, err, wire.CodeEntityInvalid)
	// Huge declared array in an unknown member: rejected without allocating it.
	huge := []byte{0xA1, 0x61, 'x', 0x9B, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}
	_, err = c.UnmarshalCapabilities(huge)
	wantCode(t, err, wire.CodeEntityInvalid)
}

func TestCBORDeterministic(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	h := fullHeader()
	a, _ := c.MarshalEntityHeader(h)
	for range 20 {
		b, _ := c.MarshalEntityHeader(h) // metadata map iteration order varies
		if !bytes.Equal(a, b) {
			t.Fatal("non-deterministic encoding")
		}
	}
	// Shortest float: 0.75 encodes as half precision f9 3a00 (recursive vector).
	if !bytes.Contains(a, []byte{0xF9, 0x3A, 0x00}) {
		t.Fatalf("min-success-ratio not in half precision: %x", a)
	}
}

func TestEntityFrameRoundTrip(t *testing.T) {
	run(t, func(t *testing.T, c wire.Codec) {
		payload := []byte("hello")
		var buf bytes.Buffer
		if err := wire.WriteEntityHeader(&buf, c, fullHeader()); err != nil {
			t.Fatal(err)
		}
		buf.Write(payload)
		h, p, err := readEntity(c, buf.Bytes())
		if err != nil || !bytes.Equal(p, payload) || h.EntityID != 42 {
			t.Fatal(h, p, err)
		}
		// Longer payload than declared: 0x05; corrupted: 0x04; no checksum: ok.
		_, _, err = readEntity(c, append(bytes.Clone(buf.Bytes()), '!'))
		wantCode(t, err, wire.CodeEntityInvalid)
		bad := bytes.Clone(buf.Bytes())
		bad[len(bad)-1] ^= 1
		_, _, err = readEntity(c, bad)
		wantCode(t, err, wire.CodeIntegrityError)
		buf.Reset()
		if err := wire.WriteEntityHeader(&buf, c, &wire.EntityHeader{EntityID: 1, PayloadLength: 3}); err != nil {
			t.Fatal(err)
		}
		buf.WriteString("abc")
		pr := wire.NewPayloadReader(bytes.NewReader(buf.Bytes()[len(buf.Bytes())-3:]), &wire.EntityHeader{EntityID: 1, PayloadLength: 3})
		if _, err := io.ReadAll(pr); err != nil || pr.Sum() != sha256.Sum256([]byte("abc")) || pr.N() != 3 {
			t.Fatal(err)
		}
	})
}

func TestReadEntityHeaderLimits(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	var buf bytes.Buffer
	_ = wire.WriteEntityHeader(&buf, c, fullHeader())
	full := buf.Bytes()
	// Every truncation of the header is 0x05, never a header.
	hl := 4 + int(full[3]) | int(full[2])<<8
	for i := range hl {
		_, err := wire.ReadEntityHeader(bytes.NewReader(full[:i]), c, 0)
		wantCode(t, err, wire.CodeEntityInvalid)
	}
	_, err := wire.ReadEntityHeader(bytes.NewReader(full), c, 10)
	wantCode(t, err, wire.CodeEntityTooLarge)
	_, err = wire.ReadEntityHeader(bytes.NewReader([]byte{0, 0, 0, 0}), c, 0)
	wantCode(t, err, wire.CodeEntityInvalid)
	// A 4 GiB declared header is refused before anything is allocated.
	_, err = wire.ReadEntityHeader(bytes.NewReader([]byte{0xFF, 0xFF, 0xFF, 0xFF, 1}), c, 0)
	wantCode(t, err, wire.CodeEntityTooLarge)
}

func TestNegotiate(t *testing.T) {
	a := &wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true, SerializationFormat: ptr(wire.FormatProtobuf), MaxWindowSize: ptr(uint64(100))}
	b := &wire.Capabilities{Layer0Core: true, Layer1Recursive: false, Layer2Resilience: true, SerializationFormat: ptr(wire.FormatProtobuf), KeepaliveTimeoutMs: ptr(uint64(1000))}
	n := wire.Negotiate(a, b)
	if n.Layer1 || n.Layer2 || n.Format != wire.FormatProtobuf || n.MaxWindowSize != 100 || n.KeepaliveMs != 1000 || n.MaxScopeDepth != 7 {
		t.Fatalf("%+v", n)
	}
	b.SerializationFormat = nil // absent: prefers CBOR
	if wire.Negotiate(a, b).Format != wire.FormatCBOR {
		t.Fatal("format fallback")
	}
	if n := wire.Negotiate(&wire.Capabilities{Layer0Core: true}, &wire.Capabilities{Layer0Core: true}); n.MaxWindowSize != wire.MaxSafeWindow {
		t.Fatalf("default window %d", n.MaxWindowSize)
	}
	wantCode(t, wire.ValidateCapabilities(&wire.Capabilities{Layer0Core: true, MaxScopeDepth: ptr(uint64(8))}), wire.CodeDepthExceeded)
	wantCode(t, wire.ValidateCapabilities(&wire.Capabilities{Layer0Core: true, MaxWindowSize: ptr(uint64(1 << 31))}), wire.CodeEntityTooLarge)
	if err := wire.ValidateCapabilities(&wire.Capabilities{Layer0Core: true, MaxWindowSize: ptr(uint64(wire.MaxSafeWindow))}); err != nil {
		t.Fatal(err)
	}
}
