package sqlite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/storetest"
	"github.com/pipestream/gateway/internal/cputime"
)

// BenchmarkWriterGroup measures the writer alone on the gateway's small
// document shape (storetest.GatewayDocumentLifecycle's batches): a group of
// 32 Create batches, then a group of their 32 terminal batches, run by
// runGroup on the benchmark's goroutine (no queue, no callers, so the
// writer goroutine idles and nothing races). cpu-ns/doc is the process's
// CPU time during the two runGroup calls per document (the writer's work
// and any GC it triggers), with synchronous=NORMAL so that fsync waits do
// not blur it; it moves far less with other load on the machine than the
// wall time of the parallel benchmarks.
func BenchmarkWriterGroup(b *testing.B) {
	benchWriterShape(b, storetest.GatewayDocumentLifecycle)
}

// BenchmarkWriterRiding is BenchmarkWriterGroup on the shape the bridge
// commits since a small document's creation rides with its result
// (storetest.GatewayRidingLifecycle): one Create batch per document,
// groups of 32.
func BenchmarkWriterRiding(b *testing.B) {
	benchWriterShape(b, storetest.GatewayRidingLifecycle)
}

// benchWriterShape runs the writer over groups of 32 documents of the
// shape lifecycle commits: the first batches of the group's documents in
// one runGroup, then their second batches in the next, and so on.
func benchWriterShape(b *testing.B, lifecycle func(context.Context, storetest.Store, string, []byte) error) {
	const group = 32
	content := make([]byte, 4096)
	s, err := Open(context.Background(), b.TempDir(), Options{Synchronous: "NORMAL"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	n := 0
	var cpu time.Duration
	rec := &recorder{}
	for b.Loop() {
		var phases [][]*request // phases[i]: the group's i-th batches
		for range group {
			n++
			rec.batches = rec.batches[:0]
			if err := lifecycle(context.Background(), rec, fmt.Sprintf("d%08d", n), content); err != nil {
				b.Fatal(err)
			}
			for i, bt := range rec.batches {
				if i == len(phases) {
					phases = append(phases, nil)
				}
				phases[i] = append(phases[i], mustPrepareB(b, bt))
			}
		}
		c0 := cputime.Process()
		for _, reqs := range phases {
			s.runGroup(reqs)
		}
		cpu += cputime.Process() - c0
		for _, reqs := range phases {
			for _, r := range reqs {
				if r.err != nil {
					b.Fatal(r.err)
				}
			}
		}
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/doc")
	b.ReportMetric(float64(s.WriterStats().Statements)/float64(n), "stmts/doc")
}

func mustPrepareB(b *testing.B, bt *store.Batch) *request {
	b.Helper()
	r, err := prepare(bt)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// recorder is a storetest.Store that only keeps the batches committed to it.
type recorder struct {
	storetest.Store
	batches []*store.Batch
}

func (r *recorder) Commit(_ context.Context, b *store.Batch) (store.CommitResult, error) {
	r.batches = append(r.batches, b)
	return store.CommitResult{}, nil
}
