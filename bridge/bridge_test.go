package bridge_test

import (
	"bytes"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestSmallDocumentPassthrough(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := []byte("hello, pipestream\n")
	doc := e.submit(content, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain"})
	// The creation may commit with the result (Options.CreateHold): then
	// Submit answers SUCCEEDED at once.
	if doc.State != gatewayv1.State_PENDING && doc.State != gatewayv1.State_RUNNING && doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state after submit %s", doc.State)
	}
	got := e.wait(doc.Id, 10*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, content) {
		t.Fatalf("result %q, want %q", res, content)
	}
}

func forFormats(t *testing.T, f func(t *testing.T, opts ...envOpt)) {
	t.Run("cbor", func(t *testing.T) { f(t) })
	t.Run("protobuf", func(t *testing.T) { f(t, withProtobuf()) })
}

func pseudoRandom(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func TestLargeDocumentDehydrated(t *testing.T) {
	forFormats(t, func(t *testing.T, opts ...envOpt) {
		e := newEnv(t, opts...)
		e.waitReady()
		content := pseudoRandom(8<<20, 7)
		doc := e.submit(content, &gatewayv1.SubmitDocumentRequest{
			Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 256 << 10}})
		got := e.wait(doc.Id, 30*time.Second)
		if got.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("state %s error %q counts %v", got.State, got.Error, got.EntityCounts)
		}
		if got.EntityCounts.Complete != 33 || got.EntityCounts.Total != 33 {
			t.Fatalf("counts %v, want 32 chunks + root complete", got.EntityCounts)
		}
		if res := e.result(doc.Id); !bytes.Equal(res, content) {
			t.Fatalf("result differs: %d bytes vs %d", len(res), len(content))
		}
		// The bridge says it takes streamed results; the peer streamed one
		// part per chunk (profile 4.3.1).
		if parts := e.metric("pipestream_bridge_result_parts_total"); parts != 32 {
			t.Fatalf("%v result parts appended, want the 32 chunks streamed", parts)
		}
		if e.opts.PreferProtobuf {
			// nothing else to check; the format was negotiated by both sides
		}
	})
}
