package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	gwruntime "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// burstStream is a grpc.ClientStream whose n events are all ready at
// once (a commit's burst already in the log), then io.EOF.
type burstStream struct {
	grpc.ClientStream
	n, sent int
}

func (b *burstStream) RecvMsg(m any) error {
	if b.sent == b.n {
		return io.EOF
	}
	b.sent++
	m.(*gatewayv1.Event).Seq = uint64(b.sent)
	return nil
}

// An SSE stream writes a burst its receiver has ready in few writes: the
// pump flushes only when no next message is waiting, after letting the
// receiving goroutine run once (nextWaiting); every event still reaches
// the connection, the stream's end flushed last. Before, every event was
// flushed on its own. One P, as TestNDJSONFlushCoalescesAReadyBurst.
func TestSSEFlushCoalescesAReadyBurst(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 1000
	s := &Server{cfg: Config{SSEKeepAlive: time.Hour}, gwMux: gwruntime.NewServeMux()}
	call := streamCall{first: 1,
		newMsg: func() proto.Message { return &gatewayv1.Event{} },
		seqOf:  func(m proto.Message) uint64 { return m.(*gatewayv1.Event).GetSeq() }}
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodGet, "/v1/events:subscribe", nil)
	s.pumpSSE(context.Background(), rec, r, call, &burstStream{n: n}, 0, 0)
	body := rec.Body.String()
	if got := strings.Count(body, "\nid: ") + strings.Count(body[:min(4, len(body))], "id: "); got != n {
		t.Errorf("%d events with an id in the stream, want %d", got, n)
	}
	if !strings.HasSuffix(body, "event: end\ndata: {}\n\n") {
		t.Errorf("the stream does not end with the end event: ...%q", body[max(0, len(body)-60):])
	}
	if rec.flushed != rec.Body.Len() {
		t.Errorf("%d bytes written and never flushed", rec.Body.Len()-rec.flushed)
	}
	if rec.flushes > n/20 {
		t.Errorf("%d flushes for a ready burst of %d events, want at most %d", rec.flushes, n, n/20)
	}
	t.Logf("%d flushes for %d events", rec.flushes, n)
}
