package bridge_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func bigReq() *gatewayv1.SubmitDocumentRequest {
	return &gatewayv1.SubmitDocumentRequest{Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 64 << 10}}
}

// A document accepted while no peer is reachable is durable and finishes
// after a bridge restart once the peer is back.
func TestBridgeRestartRecovers(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := pseudoRandom(6<<20, 3)
	e.stopPeer()
	doc := e.submit(content, bigReq()) // spooled, no session
	up, err := e.b.Upload(context.Background(), "", &gatewayv1.SubmitOptions{Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 64 << 10}},
		bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	e.closeBridge()
	e.startPeer()
	e.startBridge()
	for _, id := range []string{doc.Id, up.Id} {
		got := e.wait(id, 30*time.Second)
		if got.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("state %s error %q", got.State, got.Error)
		}
		if res := e.result(id); !bytes.Equal(res, content) {
			t.Fatal("result differs after restart")
		}
	}
}

// A document in flight when the bridge stops is re-dispatched by New.
func TestBridgeRestartMidFlight(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := pseudoRandom(8<<20, 5)
	doc := e.submit(content, bigReq())
	e.waitFor(doc.Id, 10*time.Second, "running", func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_RUNNING })
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	_ = e.b.Close(ctx)
	cancel()
	e.b = nil
	e.startBridge()
	got := e.wait(doc.Id, 30*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, content) {
		t.Fatal("result differs after restart")
	}
}

// The peer goes away mid-document; the bridge reconnects and re-dispatches.
func TestPeerRestartMidDocument(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := pseudoRandom(8<<20, 9)
	// Chunk 3's first attempt never finishes (retried after 300 ms): the
	// document is still in flight when the peer goes, however fast the
	// rest is (results stream while children complete, profile 4.3.1).
	req := bigReq()
	req.Split.Processor = "fault"
	req.Metadata = map[string]string{"pipestream.fault": "timeout-once", "pipestream.fault-chunks": "3"}
	req.CompletionPolicy = &gatewayv1.CompletionPolicy{MaxRetries: 2, TimeoutMs: 300, OnTimeout: gatewayv1.CompletionPolicy_RETRY}
	doc := e.submit(content, req)
	e.waitFor(doc.Id, 10*time.Second, "running", func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_RUNNING })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no drain: the session ends with work in flight
	_ = e.peer.Shutdown(ctx)
	e.peer = nil
	e.startPeer()
	got := e.wait(doc.Id, 40*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, content) {
		t.Fatal("result differs after peer restart")
	}
	if c := e.metric("pipestream_bridge_session_connects_total"); c < 2 {
		t.Fatalf("session connects %v, want a reconnect", c)
	}
	if r := e.metric("pipestream_bridge_dispatch_retries_total"); r < 1 {
		t.Fatalf("dispatch retries %v, want the document re-dispatched", r)
	}
}
