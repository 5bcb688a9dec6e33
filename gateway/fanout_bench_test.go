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
	"golang.org/x/sync/errgroup"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// BenchmarkWebSocketFanout is the issue's "fan-out to 1,000 WebSocket
// subscribers" at the transport level: a real gateway over the real bridge
// (SQLite store, event log; no peer, so each submission is one #document
// event) and 1,000 real WebSocket clients on loopback, live on
// /v1/events/ws. Each iteration submits one document through the bridge and
// waits until every client has read its event frames.
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

	var (
		target atomic.Int64 // frames each client must have read
		wg     sync.WaitGroup
	)
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
	for _, c := range conns {
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer c.CloseNow()
			var n int64
			for {
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
				if n++; n == target.Load() {
					wg.Done()
				}
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

	submit := func() int64 {
		before, err := br.Events().Window(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := br.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: []byte("hello"), ContentType: "text/plain"}); err != nil {
			b.Fatal(err)
		}
		after, err := br.Events().Window(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return int64(after.GetLatestSeq() - before.GetLatestSeq())
	}
	b.ReportAllocs()
	var frames int64
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		wg.Add(subs)
		// Events per submission are counted after the fact; the clients
		// compare against target only once it covers them, so set it to
		// what the submission will have produced (one #document event
		// without a peer) and check below.
		target.Store(frames + 1)
		n := submit()
		if n != 1 {
			b.Fatalf("a submission without a peer made %d events; this benchmark expects 1", n)
		}
		frames++
		waitOrFail(b, &wg, 30*time.Second)
	}
	b.StopTimer()
	delivered := float64(frames) * subs
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/delivered, "ns/delivery")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/delivered, "cpu-us/delivery")
	b.ReportMetric(heapPer, "heap-B/sub")
	b.ReportMetric(stackPer, "stack-B/sub")
	b.ReportMetric(gPer, "goroutines/sub")
	cancel()
	readers.Wait()
}

// waitOrFail waits for wg, failing the benchmark after d (a lost frame).
func waitOrFail(b *testing.B, wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		b.Fatalf("not every subscriber got its frame within %v", d)
	}
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
