package eventlog_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAppend measures events appended per second through Append
// (store group commit, SQLite synchronous=FULL, then publication to the
// tail), one event per batch, from 1 and from 64 concurrent writers.
func BenchmarkAppend(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		b.Run("serial/"+sync, func(b *testing.B) {
			e := openSync(b, b.TempDir(), eventlog.Options{}, sync)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.log.Append(context.Background(), batch("t", eventlog.KindStatus, "doc-1", time.Now(), 1)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
		b.Run("parallel64/"+sync, func(b *testing.B) {
			e := openSync(b, b.TempDir(), eventlog.Options{}, sync)
			b.ReportAllocs()
			b.SetParallelism(32) // 64 writers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := e.log.Append(context.Background(), batch("t", eventlog.KindStatus, "doc-1", time.Now(), 1)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkFanout measures delivery from the shared tail to 1,000
// in-process live subscribers: each iteration appends one batch of
// perBatch events and waits until every subscriber has received all of
// them. batch=100 is the per-event cost; batch=1 is the cost of a wake-up
// (every subscriber woken, reading one event and going back to wait),
// which is what a commit costs the log at 1,000 subscribers.
// Reported: wall ns and CPU ns per delivered event, and the memory each
// idle subscriber costs (heap: the log's subscriber and tracker state;
// stack: the subscribing goroutine, which the transport owns).
//
// push=1 serves the caught-up subscribers by the log's fan-out workers
// (WithPush, as the WebSocket route does) instead of waking each
// subscriber's goroutine.
func BenchmarkFanout(b *testing.B) {
	for _, perBatch := range []int{100, 1} {
		for _, push := range []bool{false, true} {
			name := fmt.Sprintf("batch=%d", perBatch)
			if push {
				name += "/push=1"
			}
			b.Run(name, func(b *testing.B) { benchFanout(b, perBatch, push) })
		}
	}
}

// nopPush is a Push whose writes always complete.
type nopPush struct{}

func (nopPush) Pushable() bool       { return true }
func (nopPush) Begin()               {}
func (nopPush) Flush() (bool, error) { return true, nil }

func benchFanout(b *testing.B, perBatch int, push bool) {
	const subs = 1000
	e := open(b, b.TempDir(), eventlog.Options{})
	var target atomic.Uint64
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	for i := range subs {
		done.Add(1)
		go func() {
			defer done.Done()
			sctx := ctx
			if push {
				sctx = eventlog.WithPush(eventlog.WithIdle(ctx, func() error { return nil }), nopPush{})
			}
			_ = e.log.Subscribe(sctx, "t", "client-"+string(rune('A'+i%26))+string(rune(i)), nil, eventlog.Filter{}, func(ev *gatewayv1.Event) error {
				if ev.GetSeq() == target.Load() {
					wg.Done()
				}
				return nil
			})
		}()
	}
	for e.log.Subscribers() < subs {
		time.Sleep(time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	heapPer := float64(int64(ms1.HeapAlloc)-int64(ms0.HeapAlloc)) / subs
	stackPer := float64(int64(ms1.StackInuse)-int64(ms0.StackInuse)) / subs
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		wg.Add(subs)
		target.Store(e.log.Latest() + uint64(perBatch))
		if _, err := e.log.Append(context.Background(), batch("t", eventlog.KindStatus, "doc-1", time.Now(), perBatch)); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
	}
	delivered := float64(b.N) * subs * float64(perBatch)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/delivered, "ns/delivered")
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/delivered, "cpu-ns/delivered")
	b.ReportMetric(heapPer, "heap-B/sub")
	b.ReportMetric(stackPer, "stack-B/sub")
	cancel()
	done.Wait()
}
