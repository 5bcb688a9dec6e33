package sqlite_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
)

// Shape of the log BenchmarkReadEvents reads: readDocs documents of
// readTenants tenants, six events each, committed by 64 concurrent
// committers so that group commits mix tenants and documents (as the
// gateway's do).
const (
	readDocs    = 20000
	readTenants = 8
)

// BenchmarkReadEvents measures ReadEvents on a log of 120,000 events:
// a replay page of every tenant (1,000 events from a random seq), a
// tenant's page (1,000 of its events, 1/8 of the log, from a random seq),
// one document's six events (by DocID from seq 0), and a live tenant
// reader's read of the newest 600 seqs. ns/op per read; events/op what it
// returned.
func BenchmarkReadEvents(b *testing.B) {
	s, last := readLog(b)
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		query func(r *rand.Rand) store.EventQuery
	}{
		{"all", func(r *rand.Rand) store.EventQuery {
			return store.EventQuery{AllTenants: true, From: r.Uint64N(last - 2000), Limit: 1000}
		}},
		{"tenant", func(r *rand.Rand) store.EventQuery {
			return store.EventQuery{Tenant: "t3", From: r.Uint64N(last / 2), Limit: 1000}
		}},
		{"document", func(r *rand.Rand) store.EventQuery {
			d := r.IntN(readDocs)
			return store.EventQuery{Tenant: readTenant(d), DocID: fmt.Sprint("rd-", d)}
		}},
		{"tail", func(*rand.Rand) store.EventQuery {
			return store.EventQuery{Tenant: "t3", From: last - 600}
		}},
	} {
		b.Run("read="+c.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			var n int
			b.ReportAllocs()
			for b.Loop() {
				evs, err := s.ReadEvents(ctx, c.query(r))
				if err != nil || len(evs) == 0 {
					b.Fatalf("ReadEvents: %d events, %v", len(evs), err)
				}
				n += len(evs)
			}
			b.ReportMetric(float64(n)/float64(b.N), "events/op")
		})
	}
}

// readLog writes the benchmark's log into a new store (once per run of
// the benchmark: its sub-benchmarks share it).
func readLog(b *testing.B) (*sqlite.Store, uint64) {
	b.Helper()
	s := openStore(b, b.TempDir(), sqlite.Options{Synchronous: "NORMAL"})
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for d := w; d < readDocs; d += 64 {
				var batch store.Batch
				for k := range 6 {
					batch.Events = append(batch.Events, store.EventAppend{Tenant: readTenant(d),
						Event: newEvent("#status", fmt.Sprint("rd-", d), uint64(k+1))})
				}
				if _, err := s.Commit(context.Background(), &batch); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return s, s.LastSeq()
}

// readTenant is document d's tenant: a group commit mixes all of them,
// and each committer goes through all of
// them, so the log's newest events hold every tenant too.
func readTenant(d int) string { return fmt.Sprint("t", (d+d/64)%readTenants) }

// BenchmarkEventIndexLoad measures what the event log's start reads of
// the same 120,000-event log: EachEventRange in 2,048 ranges (the
// default IndexBuckets/2) and EachEventMeta (a call per event). ns/op per
// pass over the whole log.
func BenchmarkEventIndexLoad(b *testing.B) {
	s, last := readLog(b)
	ctx := context.Background()
	b.Run("ranges", func(b *testing.B) {
		for b.Loop() {
			n := 0
			if err := s.EachEventRange(ctx, 1, last, last/2048+1, func(store.EventRange) error { n++; return nil }); err != nil || n == 0 {
				b.Fatalf("EachEventRange: %d ranges, %v", n, err)
			}
		}
	})
	b.Run("meta", func(b *testing.B) {
		for b.Loop() {
			n := 0
			if err := s.EachEventMeta(ctx, func(uint64, time.Time, int) error { n++; return nil }); err != nil || uint64(n) != last {
				b.Fatalf("EachEventMeta: %d events, %v", n, err)
			}
		}
	})
}
