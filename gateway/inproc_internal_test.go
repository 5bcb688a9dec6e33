package gateway

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// moveInto hands over the same message proto.Merge would build (scalars,
// bytes, maps, sub-messages, repeated fields, unknown fields), without
// copying the content.
func TestMoveIntoEqualsMerge(t *testing.T) {
	req := &gatewayv1.SubmitDocumentRequest{Content: bytes.Repeat([]byte("x"), 4096), ContentType: "text/plain",
		RequestId: "r-1", DisplayName: "a.txt", Metadata: map[string]string{"k": "v", "k2": "v2"},
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 4096}}
	req.ProtoReflect().SetUnknown([]byte{0xf8, 0x07, 0x01}) // field 127, varint 1
	doc := &gatewayv1.Document{Id: "d", State: gatewayv1.State_RUNNING, CreateTime: timestamppb.Now(),
		ClaimChecks: []*gatewayv1.ClaimCheck{{Name: "claims/1"}, {ClaimId: "2"}}, Entities: []*gatewayv1.Entity{{EntityId: 1}, {EntityId: 2}}}
	for _, src := range []proto.Message{req, doc} {
		want := src.ProtoReflect().New().Interface()
		proto.Merge(want, src)
		got := src.ProtoReflect().New().Interface()
		moveInto(got, src)
		if !proto.Equal(got, want) {
			t.Errorf("moveInto(%T) = %v, want %v", src, got, want)
		}
	}
	got := &gatewayv1.SubmitDocumentRequest{}
	moveInto(got, req)
	if &got.Content[0] != &req.Content[0] {
		t.Error("moveInto copied the content instead of handing it over")
	}
}

// byteQueue is a FIFO: whatever the order of writes and reads, the bytes
// come out as they went in, and an emptied queue starts over in place.
func TestByteQueueFIFO(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	var q byteQueue
	var ref []byte
	next := byte(0)
	for i := range 20000 {
		if r.IntN(2) == 0 {
			p := make([]byte, r.IntN(3000))
			for j := range p {
				p[j] = next
				next++
			}
			q.write(p)
			ref = append(ref, p...)
		} else if q.len() > 0 {
			n := 1 + r.IntN(q.len())
			if !bytes.Equal(q.bytes()[:n], ref[:n]) {
				t.Fatalf("seed %d step %d: queue gave other bytes than went in", seed, i)
			}
			q.consume(n)
			ref = ref[n:]
		}
		if q.len() != len(ref) {
			t.Fatalf("seed %d step %d: len %d, want %d", seed, i, q.len(), len(ref))
		}
	}
	q.write([]byte("ab"))
	before := cap(q.b)
	q.consume(q.len())
	q.write([]byte("c"))
	if q.r != 0 || cap(q.b) != before && before <= byteQueueKeep {
		t.Errorf("an emptied queue did not start over in place (r %d, cap %d -> %d)", q.r, before, cap(q.b))
	}
	// A large buffer is let go once emptied; drop always lets it go.
	q.consume(q.len())
	q.write(make([]byte, 2*byteQueueKeep))
	q.consume(q.len())
	if cap(q.b) > byteQueueKeep {
		t.Errorf("an emptied queue keeps %d octets of storage, more than %d", cap(q.b), byteQueueKeep)
	}
	q.write([]byte("x"))
	q.drop()
	if q.len() != 0 || cap(q.b) != 0 {
		t.Errorf("after drop: len %d cap %d, want nothing held", q.len(), cap(q.b))
	}
}
