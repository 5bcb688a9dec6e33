package wire

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// sameAsGeneric checks that UnmarshalEntityHeader (fast path first) gives
// exactly what the generic cbor/v2 decoder gives for b: an equal header, or
// an error with the same code and message.
func sameAsGeneric(t *testing.T, b []byte) (fast bool) {
	t.Helper()
	want, werr := decodeCBORHeaderGeneric(b)
	got, gerr := cborCodec{}.UnmarshalEntityHeader(b)
	if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
		t.Fatalf("% x: error %v, generic decoder says %v", b, gerr, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("% x: decoded %+v, generic decoder gives %+v", b, got, want)
	}
	_, fast = decodeCBORHeaderFast(b)
	return fast
}

func manyMeta(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m["key-"+strconv.Itoa(i)] = strconv.Itoa(i)
	}
	return m
}

func cborHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The fast CBOR header decoder and encoder agree with the generic cbor/v2
// modes: on the encodings of varied headers (both directions, byte for
// byte) and on inputs the fast path must hand to the generic decoder
// (which then accepts or rejects them as before).
func TestCBORHeaderFastPathMatchesGeneric(t *testing.T) {
	sum := bytes.Repeat([]byte{0xAB}, 32)
	p, sc := uint32(7), uint32(70000)
	mr := uint32(2)
	headers := []*EntityHeader{
		{EntityID: 1, Layer: 0, PayloadLength: 0},
		{EntityID: 0xFFFFFFFC, Layer: 3, PayloadLength: 1 << 40, Checksum: sum},
		{EntityID: 23, ParentID: &p, ScopeID: &sc, Layer: 1, ContentType: "application/x-protobuf", PayloadLength: 24, Checksum: sum},
		{EntityID: 24, ParentID: &p, Layer: 2, ContentType: "é", PayloadLength: 255},
		{EntityID: 256, Layer: 0, PayloadLength: 65536, Metadata: map[string]string{"a": "b", "tenant": "t1", "": "", "b": "x", "aa": "y", "zz": "", "pipestream-processor": "upper"}},
		{EntityID: 257, ParentID: &p, ScopeID: &sc, Layer: 1, ContentType: "text/plain", PayloadLength: 3, Checksum: sum, Metadata: map[string]string{strings.Repeat("k", 300): strings.Repeat("v", 70000)}},
		{EntityID: 258, PayloadLength: 1, Metadata: manyMeta(maxFastMetadata + 1)},
		{EntityID: 9, Layer: 0, PayloadLength: 1, ChunkInfo: &ChunkInfo{TotalChunks: 2, ChunkIndex: 1, ChunkOffset: 5}},
		{EntityID: 9, Layer: 0, PayloadLength: 1, ChunkInfo: &ChunkInfo{TotalChunks: 1 << 33, ChunkIndex: 300, ChunkOffset: 1 << 20}, Metadata: map[string]string{"x": "y"}},
		{EntityID: 9, Layer: 0, PayloadLength: 1, CompletionPolicy: &CompletionPolicy{MaxRetries: &mr}},
	}
	for _, h := range headers {
		want, err := cborEnc.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cborCodec{}.MarshalEntityHeader(h)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%+v: encoded % x (%v), generic encoder gives % x", h, got, err, want)
		}
		fast := sameAsGeneric(t, want)
		if common := h.CompletionPolicy == nil; fast != common {
			t.Errorf("%+v: fast path used = %t, want %t", h, fast, common)
		}
	}
	// Other encodings: the fast path decodes only the plain shapes and
	// leaves the rest to the generic decoder, which accepts or rejects
	// them as before.
	for i, c := range []struct {
		hex               string
		genericOK, fastOK bool
	}{
		{"a369656e746974792d69641a00000001656c61796572006e7061796c6f61642d6c656e67746800", true, true},                         // non-shortest entity-id
		{"a3656c6179657200" + "6e7061796c6f61642d6c656e67746800" + "69656e746974792d696401", true, true},                       // other key order
		{"bf69656e746974792d696401656c61796572006e7061796c6f61642d6c656e67746800ff", true, false},                              // indefinite map
		{"a469656e746974792d696401656c61796572006e7061796c6f61642d6c656e677468006378797a01", true, false},                      // unknown member
		{"a369656e746974792d6964d81801656c61796572006e7061796c6f61642d6c656e67746800", true, false},                            // tagged value
		{"a469656e746974792d696401656c61796572006e7061796c6f61642d6c656e6774680069656e746974792d696402", false, false},         // duplicate key
		{"a369656e746974792d696401656c61796572006e7061796c6f61642d6c656e6774680000", false, false},                             // trailing octet
		{"a369656e746974792d69641b0000000100000000656c61796572006e7061796c6f61642d6c656e67746800", false, false},               // entity-id > 32 bits
		{"a469656e746974792d696401656c61796572006e7061796c6f61642d6c656e677468006c636f6e74656e742d7479706561ff", false, false}, // invalid UTF-8
		{"a469656e746974792d696401656c61796572006e7061796c6f61642d6c656e677468006869636865636b73756d4101", false, false},       // 1-octet checksum
		{"a469656e746974792d696401656c61796572006e7061796c6f61642d6c656e6774680069706172656e742d6964f6", true, false},          // null parent-id
		{"a269656e746974792d696401656c6179657200", false, false},                                                               // payload-length missing
		{"a369656e746974792d696401656c6179657200", false, false},                                                               // truncated
		{"", false, false},
	} {
		b := cborHex(t, c.hex)
		if _, err := decodeCBORHeaderGeneric(b); (err == nil) != c.genericOK {
			t.Fatalf("input %d % x: generic decoder error %v; the test input is not what it claims", i, b, err)
		}
		if fast := sameAsGeneric(t, b); fast != c.fastOK {
			t.Errorf("input %d % x: decoded by the fast path = %t, want %t", i, b, fast, c.fastOK)
		}
	}
}

func FuzzCBORHeaderFastPath(f *testing.F) {
	sum := bytes.Repeat([]byte{1}, 32)
	p := uint32(3)
	for _, h := range []*EntityHeader{
		{EntityID: 1, PayloadLength: 64, Checksum: sum},
		{EntityID: 2, ParentID: &p, ScopeID: &p, Layer: 1, ContentType: "x", PayloadLength: 1, Metadata: map[string]string{"k": "v"}},
		{EntityID: 3, PayloadLength: 9, ChunkInfo: &ChunkInfo{TotalChunks: 4, ChunkIndex: 2, ChunkOffset: 300}},
	} {
		b, _ := cborEnc.Marshal(h)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sameAsGeneric(t, b)
		h, ok := decodeCBORHeaderFast(b)
		if !ok {
			return
		}
		want, err := cborEnc.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := appendCBORHeaderFast(nil, h); ok && !bytes.Equal(got, want) {
			t.Fatalf("%+v: encoded % x, generic encoder gives % x", h, got, want)
		}
	})
}

// appendEntityFrameHeader appends after what b holds, and the appended octets
// are exactly what WriteEntityHeader writes, for both built-in codecs.
func TestEntityFrameHeaderAppendAfterPrefix(t *testing.T) {
	h := &EntityHeader{EntityID: 5, PayloadLength: 3, Checksum: bytes.Repeat([]byte{2}, 32)}
	for _, c := range []Codec{CodecFor(FormatCBOR), CodecFor(FormatProtobuf)} {
		var w bytes.Buffer
		if err := WriteEntityHeader(&w, c, h); err != nil {
			t.Fatal(err)
		}
		got, err := appendEntityFrameHeader([]byte("xyz"), c, h)
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:3]) != "xyz" || !bytes.Equal(got[3:], w.Bytes()) {
			t.Fatalf("%v: appended % x, WriteEntityHeader wrote % x", c.Format(), got, w.Bytes())
		}
		back, err := ReadEntityHeader(bytes.NewReader(got[3:]), c, 0)
		if err != nil || !reflect.DeepEqual(back, h) {
			t.Fatalf("%v: read back %+v, %v", c.Format(), back, err)
		}
	}
	if _, err := appendEntityFrameHeader(nil, CodecFor(FormatCBOR), &EntityHeader{}); CodeOf(err) != CodeEntityInvalid {
		t.Fatalf("entity-id 0: got %v, want 0x05", err)
	}
}

// samePipeDocAsGeneric checks that UnmarshalPipeDoc (fast path first)
// gives exactly what the generic cbor/v2 decoder gives for b.
func samePipeDocAsGeneric(t *testing.T, b []byte) (fast bool) {
	t.Helper()
	want, werr := decodeCBORPipeDocGeneric(b)
	got, gerr := cborCodec{}.UnmarshalPipeDoc(b)
	if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
		t.Fatalf("% x: error %v, generic decoder says %v", b, gerr, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("% x: decoded %+v, generic decoder gives %+v", b, got, want)
	}
	if got != nil && len(b) > 0 && len(got.Blob) > 0 && &got.Blob[0] == &b[len(b)-len(got.Blob)] {
		t.Fatalf("% x: the blob aliases the input", b)
	}
	_, fast = decodeCBORPipeDocFast(b, false)
	// The shared decode makes the same checks and gives the same envelope;
	// on the fast path its blob is the input's own bytes.
	shared, serr := UnmarshalPipeDocShared(cborCodec{}, b)
	if (werr == nil) != (serr == nil) || (werr != nil && werr.Error() != serr.Error()) {
		t.Fatalf("% x: shared decode error %v, generic decoder says %v", b, serr, werr)
	}
	if !reflect.DeepEqual(shared, want) {
		t.Fatalf("% x: shared decode %+v, generic decoder gives %+v", b, shared, want)
	}
	if fast && want != nil && len(want.Blob) > 0 && !within(shared.Blob, b) {
		t.Fatalf("% x: the fast path's shared blob is a copy", b)
	}
	return fast
}

// The fast pipe-doc decoder and encoder agree with the generic cbor/v2
// modes: byte for byte on the encodings of varied envelopes, and on inputs
// the fast path must leave to the generic decoder.
func TestCBORPipeDocFastPathMatchesGeneric(t *testing.T) {
	docs := []*PipeDoc{
		{DocID: "d", EntityID: 1},
		{DocID: "", EntityID: 0xFFFFFFFC, Blob: []byte("hello")},
		{DocID: "doc-é", EntityID: 24, Blob: bytes.Repeat([]byte{7}, 70000)},
		{DocID: "bench-1", EntityID: 1, Blob: []byte{}},
		{DocID: "owned", EntityID: 2, Blob: []byte("x"), Ownership: &OwnershipContext{OwnerID: "t", Scopes: []string{"a"}}},
		{DocID: "tenant", EntityID: 5, Blob: []byte("x"), Ownership: &OwnershipContext{OwnerID: "t1"}},
		{DocID: "group", EntityID: 6, Ownership: &OwnershipContext{OwnerID: "", GroupID: "g"}},
		{DocID: "bad-owner", EntityID: 7, Ownership: &OwnershipContext{OwnerID: "\xfe"}},
		{DocID: "bad\xff", EntityID: 3},
	}
	for _, d := range docs {
		want, err := cborEnc.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cborCodec{}.MarshalPipeDoc(d)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%+v: encoded % x (%v), generic encoder gives % x", d, got, err, want)
		}
		fast := samePipeDocAsGeneric(t, want)
		if common := (d.Ownership == nil || (len(d.Ownership.Scopes) == 0 && !strings.Contains(d.Ownership.OwnerID, "\xfe"))) && !strings.Contains(d.DocID, "\xff"); fast != common {
			t.Errorf("%+v: fast path used = %t, want %t", d, fast, common)
		}
	}
	for i, c := range []struct {
		hex               string
		genericOK, fastOK bool
	}{
		{"a266646f632d6964616469656e746974792d69641a00000001", true, true},                                                      // non-shortest entity-id
		{"a269656e746974792d69640166646f632d69646164", true, true},                                                              // other key order
		{"a366646f632d6964616469656e746974792d69640164626c6f6240", true, true},                                                  // empty blob present
		{"bf66646f632d6964616469656e746974792d696401ff", true, false},                                                           // indefinite map
		{"a366646f632d6964616469656e746974792d6964016178f6", true, false},                                                       // unknown member
		{"a266646f632d6964616469656e746974792d6964d81801", true, false},                                                         // tagged value
		{"a366646f632d6964616469656e746974792d69640166646f632d69646165", false, false},                                          // duplicate key
		{"a266646f632d6964616469656e746974792d69640100", false, false},                                                          // trailing octet
		{"a266646f632d6964616469656e746974792d69641b0000000100000000", false, false},                                            // entity-id > 32 bits
		{"a266646f632d696461ff69656e746974792d696401", false, false},                                                            // invalid UTF-8
		{"a266646f632d6964616469656e746974792d696400", false, true},                                                             // entity-id 0 (NULL): decoded, then refused
		{"a166646f632d69646164", false, false},                                                                                  // entity-id missing
		{"a366646f632d6964616469656e746974792d69640164626c6f62f6", true, false},                                                 // null blob
		{"a366646f632d6964616469656e746974792d696401696f776e657273686970a0", false, false},                                      // ownership without owner-id
		{"a366646f632d6964616469656e746974792d696401696f776e657273686970f6", true, false},                                       // null ownership
		{"a366646f632d6964616469656e746974792d696401696f776e657273686970a1686f776e65722d69646174", true, true},                  // ownership with owner-id
		{"a366646f632d6964616469656e746974792d696401696f776e657273686970a26673636f70657380686f776e65722d69646174", true, false}, // ownership with scopes
		{"", false, false},
	} {
		b := cborHex(t, c.hex)
		if _, err := decodeCBORPipeDocGeneric(b); (err == nil) != c.genericOK {
			t.Fatalf("input %d % x: generic decoder error %v; the test input is not what it claims", i, b, err)
		}
		if fast := samePipeDocAsGeneric(t, b); fast != c.fastOK {
			t.Errorf("input %d % x: decoded by the fast path = %t, want %t", i, b, fast, c.fastOK)
		}
	}
}

func FuzzCBORPipeDocFastPath(f *testing.F) {
	for _, d := range []*PipeDoc{{DocID: "d", EntityID: 1, Blob: []byte("abc")}, {DocID: "", EntityID: 7},
		{DocID: "o", EntityID: 9, Ownership: &OwnershipContext{OwnerID: "t", GroupID: "g"}}} {
		b, _ := cborEnc.Marshal(d)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		samePipeDocAsGeneric(t, b)
		d, ok := decodeCBORPipeDocFast(b, false)
		if !ok {
			return
		}
		want, err := cborEnc.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := appendCBORPipeDocFast(nil, d); ok && !bytes.Equal(got, want) {
			t.Fatalf("%+v: encoded % x, generic encoder gives % x", d, got, want)
		}
	})
}

// within reports whether a's first octet lies in b.
func within(a, b []byte) bool {
	for i := range b {
		if &b[i] == &a[0] {
			return true
		}
	}
	return false
}
