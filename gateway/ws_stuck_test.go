package gateway_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestWebSocketStuckConsumerIsClosed: a WebSocket consumer that stops
// reading holds no unbounded queue anywhere (the pipeline stops taking
// events after a bounded number of bytes: socket buffers and flow-control
// windows), and the server ends the connection within the write deadline
// (shortened here to 1 s; 30 s in production), with the ConsumerTooSlow
// error frame if it can still write one, else by closing the socket. The
// connection's goroutines are gone afterwards.
func TestWebSocketStuckConsumerIsClosed(t *testing.T) {
	const writeTimeout = time.Second
	h := start(t, func(c *gateway.Config) { c.StreamWriteTimeout = writeTimeout })
	// Warm up the REST proxy's gRPC connection (its goroutines stay), then
	// count: only the stuck connection's goroutines may come on top.
	warm := dialWS(t, h, "?cursor=20")
	if _, err := readFrame(t, warm); err != nil {
		t.Fatal(err)
	}
	warm.Close(websocket.StatusNormalClosure, "")
	// Count once the warm-up connection's server side is gone: its
	// WebSocket handler and the event stream behind it have returned.
	waitGoroutines(t, "gateway.(*Server).handleEventsWS", stuckPollLimit)
	waitGoroutines(t, "gateway.(*eventService).SubscribeEvents", stuckPollLimit)
	base := runtime.NumGoroutine()
	c := dialWS(t, h, "") // live only; this client never reads until the end
	c.SetReadLimit(1 << 20)

	payload := strings.Repeat("x", 64<<10)
	const maxPush = 64 << 20 // far beyond any socket buffer or HTTP/2 window
	pushed := 0
	for stuck := false; !stuck; {
		ev := &gatewayv1.Event{Seq: uint64(21 + pushed/len(payload)), Time: timestamppb.Now(), Kind: "#status",
			DocumentId: "doc-1", Message: payload}
		select {
		case h.fake.log.live <- ev:
			pushed += len(payload)
			if pushed > maxPush {
				t.Fatalf("the server took %d MiB for a consumer that reads nothing: an unbounded queue", pushed>>20)
			}
		case <-time.After(2 * time.Second): // a stall, not a busy machine's pause
			stuck = true
		}
	}
	stuckAt := time.Now()
	t.Logf("pipeline stopped taking events after %.1f MiB (socket buffers, HTTP/2 windows)", float64(pushed)/(1<<20))

	// Wait for the server's verdict before reading: it must not depend on
	// the consumer coming back. The WebSocket handler writes the frames
	// itself, so the verdict is its return (the goroutine count of the
	// whole process does not move with one in-process subscription).
	waitGoroutines(t, "gateway.(*Server).handleEventsWS", writeTimeout+stuckPollLimit)
	if n := runtime.NumGoroutine(); n > base+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines %v after the consumer got stuck (before it: %d): the stuck connection is still held\n%s",
			n, time.Since(stuckAt).Round(time.Millisecond), base, buf[:runtime.Stack(buf, true)])
	}
	closedAfter := time.Since(stuckAt)

	// The client drains what reached it, then finds the connection closed.
	var last wsFrame
	frames := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("connection still open %v after the consumer got stuck", time.Since(stuckAt))
			}
			if last.Op == -1 {
				if last.Payload["error"] != "ConsumerTooSlow" {
					t.Errorf("error frame %v, want ConsumerTooSlow", last.Payload)
				}
				t.Logf("closed with the ConsumerTooSlow error frame after %d frames (%v): %v", frames, closedAfter, err)
			} else {
				t.Logf("socket closed without an error frame after %d frames (%v; the frame could not be written): %v",
					frames, closedAfter, err)
			}
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				t.Errorf("normal closure for a stuck consumer: %v", err)
			}
			break
		}
		last = decodeFrame(t, msg)
		frames++
	}
}
