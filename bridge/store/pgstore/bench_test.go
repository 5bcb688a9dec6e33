package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
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
