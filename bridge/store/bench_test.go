package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
)

// BenchmarkAppendEvents measures event appends through group commit with W
// concurrent writers, each committing one single-event batch per round.
// ns/op is per round of W events; ns/event and events/s are reported.
func BenchmarkAppendEvents(b *testing.B) {
	for _, c := range []struct {
		w    int
		sync string
	}{{1, "FULL"}, {16, "FULL"}, {128, "FULL"}, {1, "NORMAL"}, {128, "NORMAL"}} {
		w := c.w
		b.Run(fmt.Sprintf("sync=%s/writers=%d", c.sync, w), func(b *testing.B) {
			s := openStore(b, b.TempDir(), store.Options{Synchronous: c.sync})
			ctx := context.Background()
			jobs := make(chan struct{})
			var round sync.WaitGroup
			var workers sync.WaitGroup
			for range w {
				workers.Go(func() {
					for range jobs {
						if _, err := s.Commit(ctx, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#status", "doc-1", 2)}}}); err != nil {
							b.Error(err)
						}
						round.Done()
					}
				})
			}
			b.ReportAllocs()
			start := time.Now()
			rounds := 0
			for b.Loop() {
				round.Add(w)
				for range w {
					jobs <- struct{}{}
				}
				round.Wait()
				rounds++
			}
			el := time.Since(start)
			close(jobs)
			workers.Wait()
			events := float64(rounds * w)
			b.ReportMetric(float64(el.Nanoseconds())/events, "ns/event")
			b.ReportMetric(events/el.Seconds(), "events/s")
			ws := s.WriterStats()
			b.ReportMetric(float64(ws.Batches)/float64(ws.Transactions), "batches/txn")
		})
	}
}
