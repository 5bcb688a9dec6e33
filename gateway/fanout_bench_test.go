package gateway_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fxamacker/cbor/v2"
	"golang.org/x/sync/errgroup"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// BenchmarkWebSocketFanout is the issue's "fan-out to 1,000 WebSocket
// subscribers" at the transport level: a real gateway over the real bridge
// (SQLite store, event log; no peer, so each submission is one #document
// event, and every pending document gets another one each time the
// bridge's dispatcher gives up on the unreachable peer, ~2 s and ~10 s
// after submission) and 1,000 real WebSocket clients on loopback, live on
// /v1/events/ws. Each iteration submits one document through the bridge and
// waits until every client has read a frame with that document's seq or a
// later one; every frame a client reads counts as a delivery.
//
// It waits by seq, not by a count of frames per submission: the
// dispatcher's events come whenever its retry timer fires, so a count
// ("one frame per submission") was overtaken by the first of them
// whenever the timed loop ran past ~2 s, and the benchmark then waited for
// a count its clients had already passed ("not every subscriber got its
// frame within 30s").
//
// Reported per delivery (one event frame read by one subscriber):
// ns/delivery (wall), cpu-us/delivery (getrusage user+system of the whole
// process: the gateway AND the 1,000 in-process clients reading frames, so
// an upper bound on the gateway's share; `gateway bench --only fanout`
// measures the gateway process alone). Per subscriber: heap-B/sub and
// stack-B/sub (after GC, connected and idle, again server and client side
// together) and goroutines/sub.
func BenchmarkWebSocketFanout(b *testing.B) {
	const subs = 1000
	br, err := bridge.New(context.Background(), bridge.Options{
		DataDir: b.TempDir(), PeerAddr: "127.0.0.1:9", PeerCAPEM: selfSignedPEM(b),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := gateway.New(gateway.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Bridge: br, Logger: slog.New(slog.DiscardHandler),
		RateLimit: -1, MaxSubscribersPerTenant: -1, MaxConnsPerIP: -1, MaxConcurrentStreams: 4 * subs,
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx) // closes the bridge
	}()
	url := "ws://" + srv.HTTPAddr() + "/v1/events/ws"

	fc := newFanoutClients(subs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var readers sync.WaitGroup
	dial := func() (*websocket.Conn, error) {
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		defer dcancel()
		c, _, err := websocket.Dial(dctx, url, nil)
		return c, err
	}
	// One warm-up subscriber so the REST proxy's gRPC connection exists
	// before the baseline.
	warm, err := dial()
	if err != nil {
		b.Fatal(err)
	}
	defer warm.CloseNow()
	g0 := runtime.NumGoroutine()
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)

	conns := make([]*websocket.Conn, subs)
	var eg errgroup.Group
	eg.SetLimit(32)
	for i := range conns {
		eg.Go(func() error {
			c, err := dial()
			if err != nil {
				return fmt.Errorf("subscriber %d: %w", i, err)
			}
			conns[i] = c
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		b.Fatal(err)
	}
	for i, c := range conns {
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer c.CloseNow()
			for {
				_, msg, err := c.Read(ctx)
				if err != nil {
					return
				}
				seq, err := frameSeq(msg)
				if err != nil {
					b.Errorf("subscriber %d: %v", i, err)
					return
				}
				fc.read(i, seq)
			}
		}()
	}
	// Measure once every upgrade's subscription runs (the warm-up's too):
	// a subscriber in its run loop has fixed its starting seq, so the
	// first submission below reaches it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, _ := goroutinesIn("eventlog.(*subscriber).run(")
		if n >= subs+1 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d subscriptions running within 30 s", n, subs+1)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	gPer := float64(runtime.NumGoroutine()-g0) / subs
	heapPer := float64(int64(ms1.HeapAlloc)-int64(ms0.HeapAlloc)) / subs
	stackPer := float64(int64(ms1.StackInuse)-int64(ms0.StackInuse)) / subs

	// submit commits one document and returns the newest seq after it
	// (its #document event's, or a dispatcher event's that came since).
	submit := func() uint64 {
		if _, err := br.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: []byte("hello"), ContentType: "text/plain"}); err != nil {
			b.Fatal(err)
		}
		w, err := br.Events().Window(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return w.GetLatestSeq()
	}
	b.ReportAllocs()
	frames0 := fc.frames.Load()
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		done := fc.expect()
		fc.setTarget(submit())
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.Fatalf("%d of %d subscribers did not read seq %d within 30 s", fc.remaining.Load(), subs, fc.target.Load())
		}
	}
	b.StopTimer()
	delivered := float64(fc.frames.Load() - frames0)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/delivered, "ns/delivery")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/delivered, "cpu-us/delivery")
	b.ReportMetric(heapPer, "heap-B/sub")
	b.ReportMetric(stackPer, "stack-B/sub")
	b.ReportMetric(gPer, "goroutines/sub")
	cancel()
	readers.Wait()
}

// fanoutClients is what BenchmarkWebSocketFanout's clients read: each
// one's highest seq, and one wait per submission until every client has
// read its target seq (or a later one). A client is counted once per
// target whether its reader or setTarget sees it first (acked, by
// compare-and-swap).
type fanoutClients struct {
	seen      []atomic.Uint64 // highest seq client i read
	acked     []atomic.Uint64 // highest target client i was counted for
	target    atomic.Uint64
	remaining atomic.Int64
	done      atomic.Pointer[chan struct{}] // closed when remaining reaches 0
	frames    atomic.Int64                  // frames read by every client
}

func newFanoutClients(n int) *fanoutClients {
	return &fanoutClients{seen: make([]atomic.Uint64, n), acked: make([]atomic.Uint64, n)}
}

// expect starts a wait for every client: the returned channel closes
// once each has reached the target setTarget sets next.
func (f *fanoutClients) expect() <-chan struct{} {
	done := make(chan struct{})
	f.remaining.Store(int64(len(f.seen)))
	f.done.Store(&done)
	return done
}

// setTarget sets the seq every client must reach, counting those already
// past it.
func (f *fanoutClients) setTarget(seq uint64) {
	f.target.Store(seq)
	for i := range f.seen {
		f.check(i)
	}
}

// read records that client i read a frame with seq (0: an #info frame).
func (f *fanoutClients) read(i int, seq uint64) {
	f.frames.Add(1)
	if seq > f.seen[i].Load() {
		f.seen[i].Store(seq)
	}
	f.check(i)
}

// check counts client i if it reached the current target and was not
// counted for it yet.
func (f *fanoutClients) check(i int) {
	t := f.target.Load()
	if t == 0 || f.seen[i].Load() < t {
		return
	}
	if a := f.acked[i].Load(); a < t && f.acked[i].CompareAndSwap(a, t) {
		if f.remaining.Add(-1) == 0 {
			close(*f.done.Load())
		}
	}
}

// frameSeq is the seq of an event message frame (header {op, t}, then
// the payload with seq; draft-holmgren-at-synchronization-00).
func frameSeq(msg []byte) (uint64, error) {
	var hdr struct {
		Op int `cbor:"op"`
	}
	rest, err := cbor.UnmarshalFirst(msg, &hdr)
	if err != nil || hdr.Op != 1 {
		return 0, fmt.Errorf("not a message frame (op %d): %v", hdr.Op, err)
	}
	var p struct {
		Seq uint64 `cbor:"seq"`
	}
	if err := cbor.Unmarshal(rest, &p); err != nil {
		return 0, fmt.Errorf("frame payload: %w", err)
	}
	return p.Seq, nil
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
