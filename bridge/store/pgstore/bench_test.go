package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/storetest"
	"github.com/pipestream/gateway/internal/cputime"
	"github.com/pipestream/gateway/internal/pgtest"
)

// BenchmarkCommit measures a document create with and without events, from
// 8 concurrent committers: the difference is the cost of the serialised
// seq counter (package doc, Event sequence).
func BenchmarkCommit(b *testing.B) {
	for _, events := range []int{0, 2} {
		b.Run(fmt.Sprintf("events=%d", events), func(b *testing.B) {
			s := open(b, pgtest.NewDatabase(b))
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprintf("d%d", n.Add(1))
					batch := &store.Batch{Create: doc(id, "")}
					for range events {
						batch.Events = append(batch.Events, event(id, "created"))
					}
					if _, err := s.Commit(context.Background(), batch); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkSmallDocumentLifecycle is bridge/store's benchmark of the same
// name (storetest.SmallDocumentLifecycle, content and result inline, 64
// documents in flight) on PostgreSQL. cpu-ns/doc is this process's CPU
// (the store's client side and the benchmark's encoding), server-ns/doc
// the PostgreSQL server's (postmaster and all its processes, internal/cputime), and
// total-ns/doc their sum: compare it with SQLite's cpu-ns/doc, where the
// database runs inside the process.
func BenchmarkSmallDocumentLifecycle(b *testing.B) {
	dsn := pgtest.NewDatabase(b)
	s := open(b, dsn)
	content := make([]byte, 4096)
	cpu, srv, docs := runDocs(b, dsn, func(ctx context.Context, id string) error {
		return storetest.SmallDocumentLifecycle(ctx, s, id, content, false)
	})
	b.ReportMetric(float64(cpu.Nanoseconds())/docs, "cpu-ns/doc")
	b.ReportMetric(float64(srv.Nanoseconds())/docs, "server-ns/doc")
	b.ReportMetric(float64((cpu+srv).Nanoseconds())/docs, "total-ns/doc")
}

// runDocs runs one document's lifecycle (one, with ids d1, d2, ...) per
// iteration, 64 in flight on 2 CPUs, and returns this process's and the
// PostgreSQL server's CPU over the run and the number of documents.
func runDocs(b *testing.B, dsn string, one func(ctx context.Context, id string) error) (cpu, srv time.Duration, docs float64) {
	ctx := context.Background()
	pg, err := cputime.FindPostgres(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	cpu0, srv0 := cputime.Process(), serverCPU(b, pg)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := one(ctx, fmt.Sprintf("d%d", n.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	return cputime.Process() - cpu0, serverCPU(b, pg) - srv0, float64(n.Load())
}

func serverCPU(b *testing.B, pg *cputime.Postgres) time.Duration {
	d, err := pg.CPU()
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkRidingWithHook is the shape the gateway commits for a riding
// small document (storetest.GatewayRidingLifecycle: one batch with the
// finished row, its entity, the 4 KiB result and 6 events), 64 in flight,
// with an event hook installed as the gateway's event log installs one:
// the store's own CPU and the server's per document, what the gateway's
// PostgreSQL path adds over SQLite's (docs/performance.md).
func BenchmarkRidingWithHook(b *testing.B) {
	dsn := pgtest.NewDatabase(b)
	s := open(b, dsn)
	var delivered atomic.Int64
	s.SetEventHook(func(evs []store.EventRecord) { delivered.Add(int64(len(evs))) })
	content := make([]byte, 4096)
	reads0 := s.TailReads()
	cpu, srv, docs := runDocs(b, dsn, func(ctx context.Context, id string) error {
		return storetest.GatewayRidingLifecycle(ctx, s, id, content)
	})
	b.ReportMetric(float64(cpu.Nanoseconds())/docs, "cpu-ns/doc")
	b.ReportMetric(float64(srv.Nanoseconds())/docs, "server-ns/doc")
	b.ReportMetric(float64(s.TailReads()-reads0)/docs, "reads/doc")
}
