package bridge

import (
	"context"
	"fmt"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// DefaultSnapshotPage and MaxSnapshotPage bound StreamSnapshot's chunks:
// 2,000 small documents are ~200 KB encoded (~600 KB as JSON), large
// enough to amortize the store's three queries per page and a stream
// message (1.8x the throughput of 500 in BenchmarkSnapshotLargeStore),
// small enough that memory is a constant per stream. The maximum is the
// store's page cap.
const (
	DefaultSnapshotPage = 2000
	MaxSnapshotPage     = 10000
)

func (e events) StreamSnapshot(ctx context.Context, t Tenant, pageSize int, send func(*gatewayv1.SnapshotChunk) error) error {
	if pageSize < 0 || pageSize > MaxSnapshotPage {
		return fmt.Errorf("page_size %d is out of range: use 1 to %d, or 0 for %d: %w", pageSize, MaxSnapshotPage, DefaultSnapshotPage, ErrInvalid)
	}
	if pageSize == 0 {
		pageSize = DefaultSnapshotPage
	}
	var total, last uint64
	err := e.b.ev.StreamSnapshot(ctx, string(t), pageSize, func(seq uint64, docs []*gatewayv1.Document) error {
		last = seq
		if len(docs) == 0 {
			return nil // only the empty store's single call: the final chunk says it
		}
		for _, d := range docs {
			d.Name = "documents/" + d.Id
			for _, c := range d.ClaimChecks {
				c.Name = "claims/" + c.ClaimId
			}
		}
		total += uint64(len(docs))
		return send(&gatewayv1.SnapshotChunk{Seq: seq, Documents: docs})
	})
	if err != nil {
		return e.b.mapEventErr(err, 0)
	}
	return send(&gatewayv1.SnapshotChunk{Seq: last, Last: true, TotalDocuments: total})
}
