package bridge

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// clearedBodyHash is bodyHash as every stored document's was computed: the
// options cloned, the request id cleared, encoded deterministically.
func clearedBodyHash(o *gatewayv1.SubmitOptions, contentSum [32]byte) []byte {
	c := proto.Clone(o).(*gatewayv1.SubmitOptions)
	c.RequestId = ""
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	h := sha256.New()
	h.Write(b)
	h.Write(contentSum[:])
	return h.Sum(nil)
}

// TestBodyHashIsTheClearedEncoding: bodyHash, which cuts the request id's
// field out of the encoding, gives the hash of the options with the request
// id cleared, for generated options (every field set or not, metadata of
// several keys, unknown fields) and a seeded random request id: a stored
// document's idempotency hash matches a retry's after the change. The
// seed is printed on failure.
func TestBodyHashIsTheClearedEncoding(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	str := func(n int) string {
		b := make([]byte, r.IntN(n))
		for i := range b {
			b[i] = byte('a' + r.IntN(26))
		}
		return string(b)
	}
	for i := range 500 {
		o := &gatewayv1.SubmitOptions{}
		if r.IntN(2) == 0 {
			o.ContentType = "text/" + str(8)
		}
		if r.IntN(3) > 0 {
			o.RequestId = str(40)
		}
		if r.IntN(2) == 0 {
			o.Split = &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy(r.IntN(5)), ChunkBytes: r.Uint32N(1 << 20), Processor: str(10)}
		}
		if r.IntN(2) == 0 {
			o.CompletionPolicy = &gatewayv1.CompletionPolicy{MaxRetries: r.Uint32N(5), TimeoutMs: r.Uint32N(1e6)}
		}
		if k := r.IntN(4); k > 0 {
			o.Metadata = map[string]string{}
			for range k {
				o.Metadata[str(12)] = str(30)
			}
		}
		if r.IntN(2) == 0 {
			o.DisplayName = str(20)
		}
		if r.IntN(5) == 0 {
			// an unknown field (number 99, bytes), as from a newer client
			o.ProtoReflect().SetUnknown([]byte{0x9a, 0x06, 0x02, 'h', 'i'})
		}
		var sum [32]byte
		sum[0] = byte(i)
		got := (&plan{opts: o}).bodyHash(sum)
		if want := clearedBodyHash(o, sum); !bytes.Equal(got, want) {
			t.Fatalf("seed %d, case %d: bodyHash(%v) = %x, want the cleared encoding's %x", seed, i, o, got, want)
		}
	}
	o := &gatewayv1.SubmitOptions{RequestId: "r1", ContentType: "text/plain"}
	a := (&plan{opts: o}).bodyHash([32]byte{})
	o.RequestId = "r2"
	if b := (&plan{opts: o}).bodyHash([32]byte{}); !bytes.Equal(a, b) {
		t.Error("two request ids give two hashes; the request id must not count")
	}
	o.ContentType = "text/html"
	if b := (&plan{opts: o}).bodyHash([32]byte{}); bytes.Equal(a, b) {
		t.Errorf("another content type gives the same hash %x", b)
	}
}

// BenchmarkBodyHash: the idempotency hash of typical options (a request id,
// a split, two metadata keys), by clearing a clone (how it was computed
// before) and by cutting the field out of the encoding (bodyHash).
func BenchmarkBodyHash(b *testing.B) {
	o := &gatewayv1.SubmitOptions{
		ContentType: "text/plain", RequestId: "bench-0001",
		Split:    &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE, ChunkBytes: 1 << 20, Processor: "passthrough"},
		Metadata: map[string]string{"source": "crm", "owner": "alice"},
	}
	b.Run("path=clone", func(b *testing.B) {
		for b.Loop() {
			clearedBodyHash(o, [32]byte{})
		}
	})
	b.Run("path=cut", func(b *testing.B) {
		p := &plan{opts: o}
		for b.Loop() {
			p.bodyHash([32]byte{})
		}
	})
}
