package sqlite_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	"github.com/pipestream/gateway/bridge/store/storetest"
	"github.com/pipestream/gateway/internal/cputime"
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
			s := openStore(b, b.TempDir(), sqlite.Options{Synchronous: c.sync})
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
			start, cpu0, ws0 := time.Now(), cputime.Process(), s.WriterStats()
			rounds := 0
			for b.Loop() {
				round.Add(w)
				for range w {
					jobs <- struct{}{}
				}
				round.Wait()
				rounds++
			}
			el, cpu := time.Since(start), cputime.Process()-cpu0
			close(jobs)
			workers.Wait()
			events := float64(rounds * w)
			b.ReportMetric(float64(el.Nanoseconds())/events, "ns/event")
			b.ReportMetric(events/el.Seconds(), "events/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/events, "cpu-ns/event")
			ws := s.WriterStats()
			b.ReportMetric(float64(ws.Batches)/float64(ws.Transactions), "batches/txn")
			b.ReportMetric(float64(ws.Statements-ws0.Statements)/events, "stmts/event")
		})
	}
}

// BenchmarkSmallDocumentLifecycle measures what the store does for one
// small (4 KiB) document from submit to SUCCEEDED, with 64 documents in
// flight. payload=inline and payload=files run
// storetest.SmallDocumentLifecycle: the Create batch (with its creation
// event), an update to RUNNING (entity + 2 events) and the terminal update
// (entity + 3 events); shape=gateway2 runs
// storetest.GatewayDocumentLifecycle, the two batches per document the
// gateway's bridge committed in `gateway bench --only small`. With
// payload=inline the content rides in the Create batch and the result in
// the terminal batch (and the content row is deleted there); with
// payload=files each is a streamed payload (temp file, fsync, rename,
// directory fsync) written before its batch, as before migration 3.
// ns/op is per document (wall time, bound by the single
// writer); cpu-ns/doc is the process's CPU (writer, callers and the
// benchmark's own encoding) per document; stmts/doc the SQL statements the
// writer ran per document.
func BenchmarkSmallDocumentLifecycle(b *testing.B) {
	content := make([]byte, 4096)
	for _, c := range []struct{ name, shape, payload string }{
		{"payload=inline", "lifecycle3", "inline"}, {"payload=files", "lifecycle3", "files"}, {"shape=gateway2/payload=inline", "gateway2", "inline"},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := openStore(b, b.TempDir(), sqlite.Options{})
			ctx := context.Background()
			var n atomic.Int64
			lifecycle := func() error {
				id := fmt.Sprintf("d%d", n.Add(1))
				if c.shape == "gateway2" {
					return storetest.GatewayDocumentLifecycle(ctx, s, id, content)
				}
				return storetest.SmallDocumentLifecycle(ctx, s, id, content, c.payload == "files")
			}
			b.ReportAllocs()
			b.SetParallelism(32) // 64 in flight on 2 CPUs
			cpu0, ws0 := cputime.Process(), s.WriterStats()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := lifecycle(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			cpu, ws := cputime.Process()-cpu0, s.WriterStats()
			docs := float64(n.Load())
			b.ReportMetric(float64(cpu.Nanoseconds())/docs, "cpu-ns/doc")
			b.ReportMetric(float64(ws.Batches)/float64(ws.Transactions), "batches/txn")
			b.ReportMetric(float64(ws.Statements-ws0.Statements)/docs, "stmts/doc")
		})
	}
}
