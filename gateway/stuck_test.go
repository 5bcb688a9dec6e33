package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// stuckWriteTimeout is Config.StreamWriteTimeout in these tests (30 s in
// production).
const stuckWriteTimeout = time.Second

// startBigLog runs a server whose event log holds a million 16 KiB events
// (far more than any window or socket buffer) and whose document "huge"
// has a 1 GiB result, with the write timeout shortened.
func startBigLog(t *testing.T) *harness {
	return start(t, func(c *gateway.Config) {
		c.StreamWriteTimeout = stuckWriteTimeout
		f := c.Bridge.(*fakeBridge)
		f.log.latest = 1_000_000
		f.log.payload = strings.Repeat("x", 16<<10)
		f.result = func(id string) (string, int64, io.ReadCloser, bool) {
			if id != "huge" {
				return "", 0, nil, false
			}
			return "application/octet-stream", -1, io.NopCloser(io.LimitReader(zeros{}, 1<<30)), true
		}
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// goroutinesIn counts the goroutines whose stack contains fn.
func goroutinesIn(fn string) (int, string) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			count++
		}
	}
	return count, string(buf)
}

// waitGoroutines waits until no goroutine runs fn, failing after limit.
func waitGoroutines(t *testing.T, fn string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		n, stacks := goroutinesIn(fn)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still in %s %v later: the stuck consumer still holds them\n%s", n, fn, limit, stacks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stuckPollLimit bounds the polls below. They return as soon as their
// condition holds, so the limit costs nothing when the code is right and
// only has to be far above what a busy machine needs.
const stuckPollLimit = 20 * time.Second

// serverGoroutines counts the goroutines that run the gateway's own code
// (runsServerCode). Client goroutines (grpc-go's, net/http's) never run it, so
// the count does not move with the client side's connection state, which
// the old whole-process count did (issue 21: a slack of 1 flaked).
func serverGoroutines() (int, string) {
	_, all := goroutinesIn("")
	n := 0
	for g := range strings.SplitSeq(all, "\n\n") {
		if runsServerCode(g) {
			n++
		}
	}
	return n, all
}

// runsServerCode reports whether the goroutine's stack g has a frame of
// this module's non-test code and is not a test's own goroutine (those run
// under testing.tRunner or TestMain). A connection's reader (grpc-go's
// transport reading through h2guard.Conn) is per connection, not per
// stream, and does not count: a connection the server opens to itself
// (the REST proxy's loopback, dialled lazily) may appear at any moment.
func runsServerCode(g string) bool {
	if strings.Contains(g, "testing.tRunner") || strings.Contains(g, "_test.TestMain") {
		return false
	}
	for line := range strings.SplitSeq(g, "\n") {
		if strings.HasPrefix(line, "github.com/pipestream/gateway/") && !strings.Contains(line, "_test.") &&
			!strings.HasPrefix(line, "github.com/pipestream/gateway/gateway/h2guard.(*Conn).Read(") {
			return true
		}
	}
	return false
}

// waitServerGoroutines waits until at most want server goroutines run
// (polling the stacks: a condition, not a fixed sleep).
func waitServerGoroutines(t *testing.T, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(stuckPollLimit)
	for {
		n, stacks := serverGoroutines()
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d server goroutines after %s, want at most %d\n%s", n, what, want, stacks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGRPCStuckConsumerIsCut: a gRPC client that opens a server stream
// with far more data pending than the flow-control windows hold and never
// reads. Its Send blocks; within the write timeout the server ends the
// stream with ResourceExhausted / ConsumerTooSlow and the handler's
// goroutine returns, without the client reading or leaving. The client
// sees the status once it reads again.
func TestGRPCStuckConsumerIsCut(t *testing.T) {
	h := startBigLog(t)
	cases := []struct {
		name, handler string
		open          func(context.Context) (func() error, error)
	}{
		{"SubscribeEvents", "(*eventService).SubscribeEvents", func(ctx context.Context) (func() error, error) {
			s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{Cursor: proto.Uint64(0)})
			return func() error { _, err := s.Recv(); return err }, err
		}},
		{"GetDocumentResult", "(*documentService).GetDocumentResult", func(ctx context.Context) (func() error, error) {
			s, err := h.docs.GetDocumentResult(ctx, &gatewayv1.GetDocumentResultRequest{Id: "huge"})
			return func() error { _, err := s.Recv(); return err }, err
		}},
	}
	// Warm up the client connection (its goroutines stay), then count.
	if _, err := h.events.GetEventWindow(context.Background(), &gatewayv1.GetEventWindowRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base, _ := serverGoroutines()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opened := time.Now()
			recv, err := tc.open(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The handler runs, fills the windows, then blocks in Send.
			for deadline := time.Now().Add(stuckPollLimit); ; time.Sleep(5 * time.Millisecond) {
				if n, _ := goroutinesIn(tc.handler); n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the handler never ran")
				}
			}
			waitGoroutines(t, tc.handler, stuckWriteTimeout+10*time.Second)
			took := time.Since(opened)
			if took < stuckWriteTimeout {
				t.Errorf("stream cut %v after it opened, before the %v write timeout could pass", took, stuckWriteTimeout)
			}
			// No goroutine of the server's is left from the stream.
			waitServerGoroutines(t, base, "the server cut the stream")
			t.Logf("handler released %v after the stream opened", took.Round(time.Millisecond))

			// Reading again drains what was in flight, then the status.
			n := 0
			for err = recv(); err == nil; err = recv() {
				n++
			}
			if status.Code(err) != codes.ResourceExhausted || reasonOf(err) != "ConsumerTooSlow" {
				t.Fatalf("after %d messages: %v, want ResourceExhausted with reason ConsumerTooSlow", n, err)
			}
			if !strings.Contains(status.Convert(err).Message(), "--stream-write-timeout") {
				t.Errorf("message %q does not name --stream-write-timeout", status.Convert(err).Message())
			}
			t.Logf("client read %d messages, then %v", n, err)
		})
	}
}

// TestNDJSONStuckConsumerIsCut: an HTTP/1 client over raw TCP subscribes
// to the event log with cursor=0, reads the status line and stops reading.
// The server's writes block once the socket buffers fill; within the write
// timeout the connection is closed, the REST proxy's handler returns and
// cancels its internal gRPC stream, so no goroutine of the request
// remains. The client then finds a cut chunked body (no terminating chunk).
func TestNDJSONStuckConsumerIsCut(t *testing.T) {
	h := startBigLog(t)
	// Warm up the tenant's REST proxy lane, a gRPC connection whose
	// goroutines stay: a watch of an unknown document ends at once.
	if code, _, body := h.do("GET", "/v1/documents/nope:watch", nil); code != 404 {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	h.http.CloseIdleConnections()
	base, _ := serverGoroutines()

	conn, err := net.Dial("tcp", h.srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	opened := time.Now()
	if _, err := io.WriteString(conn, "GET /v1/events:subscribe?cursor=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 4096)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("status line %q, %v", line, err)
	}
	// Stop reading. The server's handlers must end on their own.
	for _, fn := range []string{"(*eventService).SubscribeEvents", "runtime.ForwardResponseStream"} {
		waitGoroutines(t, fn, stuckWriteTimeout+10*time.Second)
	}
	took := time.Since(opened)
	if took < stuckWriteTimeout {
		t.Errorf("response cut %v after the request, before the %v write timeout could pass", took, stuckWriteTimeout)
	}
	waitServerGoroutines(t, base, "the server cut the response")
	t.Logf("handlers released %v after the request", took.Round(time.Millisecond))

	// The client drains what reached it and finds the body cut short.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	tail := make([]byte, 0, 64)
	n := 0
	buf := make([]byte, 64<<10)
	for {
		k, err := br.Read(buf)
		n += k
		tail = append(tail, buf[:k]...)
		if len(tail) > 32 {
			tail = append(tail[:0], tail[len(tail)-32:]...)
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("connection still open 10 s after the server cut the stream (read %d bytes)", n)
			}
			break
		}
	}
	if strings.HasSuffix(string(tail), "\r\n0\r\n\r\n") {
		t.Errorf("the body ended with the terminating chunk after %d bytes: a completed response, not a cut one", n)
	}
	t.Logf("client read %d more bytes, then the connection closed", n)
}

// TestIdleStreamsOutliveWriteTimeout: the write timeout bounds pending
// writes only. A gRPC and an NDJSON subscription with nothing to send stay
// open for several timeouts and still deliver the next live event.
func TestIdleStreamsOutliveWriteTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	h := start(t, func(c *gateway.Config) { c.StreamWriteTimeout = timeout })
	waitSubscribed := func(want int32) {
		for deadline := time.Now().Add(stuckPollLimit); h.fake.log.waiting.Load() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d subscriptions waiting for live events, want %d", h.fake.log.waiting.Load(), want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*stuckPollLimit)
	defer cancel()

	t.Run("gRPC", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		waitSubscribed(1)
		time.Sleep(4 * timeout) // the subject: idle for several write timeouts
		h.fake.log.live <- h.fake.log.event(21)
		ev, err := s.Recv()
		if err != nil || ev.GetSeq() != 21 {
			t.Fatalf("after an idle %v: %v, %v; want event 21", 4*timeout, ev, err)
		}
		cancel()
		waitSubscribed(0)
	})
	t.Run("NDJSON", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/events:subscribe", nil)
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("HTTP %d", resp.StatusCode)
		}
		waitSubscribed(1)
		time.Sleep(4 * timeout) // the subject: idle for several write timeouts
		h.fake.log.live <- h.fake.log.event(22)
		sc := bufio.NewScanner(resp.Body)
		if !sc.Scan() {
			t.Fatalf("after an idle %v the stream ended: %v", 4*timeout, sc.Err())
		}
		var l struct {
			Result struct {
				Seq string `json:"seq"`
			} `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Result.Seq != "22" {
			t.Fatalf("line %q, want event 22", sc.Text())
		}
	})
}
