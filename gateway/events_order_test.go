package gateway_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestSubscribeEventsRefusesOutOfOrderSeq: a seq at or below one already
// sent is never put on the wire (a consumer that skips by seq would lose
// events): the stream ends with INTERNAL naming the cursor to resume from.
// NDJSON and WebSocket are clients of this stream.
func TestSubscribeEventsRefusesOutOfOrderSeq(t *testing.T) {
	h := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the subscription to wait for live events", func() bool { return h.fake.log.waiting.Load() == 1 })
	h.fake.log.live <- h.fake.log.event(21)
	h.fake.log.live <- h.fake.log.event(20)
	if ev, err := s.Recv(); err != nil || ev.GetSeq() != 21 {
		t.Fatalf("first: %v %v, want seq 21", ev, err)
	}
	ev, err := s.Recv()
	if status.Code(err) != codes.Internal {
		t.Fatalf("after seq 21, seq 20 came as %v %v; want the stream ended with INTERNAL", ev, err)
	}
	t.Logf("%v", err)
}
