package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestPipelinedCommitFallsBack checks the pipelined Commit (pipeline.go):
// plain batches commit in one pipeline (no retry), and a batch whose
// outcome is not the plain one (a reused request id, a stale rev) rolls the
// pipeline back, is rerun step by step (WriterStats.Retries) and answers
// exactly as before; the rolled-back pipelines took no seq.
func TestPipelinedCommitFallsBack(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	retries := func() uint64 { return s.WriterStats().Retries }

	res, err := s.Commit(ctx, &store.Batch{Create: doc("a", "r1"), Events: []store.EventAppend{event("a", "created")},
		Payloads: []store.PayloadRecord{{DocID: "a", Kind: store.PayloadContent, Body: []byte("x")}}})
	if err != nil || len(res.Seqs) != 1 || res.Seqs[0] != 1 || retries() != 0 {
		t.Fatalf("plain create: %+v, %v, retries %d; want seq 1 and no retry", res, err, retries())
	}

	retry := doc("a2", "r1")
	retry.BodyHash = []byte("h-a") // the same body: the answer is the existing document
	res, err = s.Commit(ctx, &store.Batch{Create: retry, Events: []store.EventAppend{event("a2", "created")}})
	if err != nil || res.Duplicate == nil || res.Duplicate.Doc.GetId() != "a" || len(res.Seqs) != 0 || retries() != 1 {
		t.Fatalf("reused request id: %+v, %v, retries %d; want the duplicate of a, no seq, one retry", res, err, retries())
	}

	upd := doc("a", "r1")
	upd.Doc.Rev, upd.Doc.State = 3, gatewayv1.State_RUNNING
	_, err = s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: upd, PrevRev: 2}},
		Events: []store.EventAppend{event("a", "processing")}})
	if !errors.Is(err, store.ErrStaleRev) || retries() != 2 {
		t.Fatalf("stale update: %v, retries %d; want ErrStaleRev after a retry", err, retries())
	}

	upd.Doc.Rev = 2
	res, err = s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: upd, PrevRev: 1}},
		Events: []store.EventAppend{event("a", "processing"), event("a", "more")}})
	if err != nil || len(res.Seqs) != 2 || res.Seqs[0] != 2 || res.Seqs[1] != 3 || retries() != 2 {
		t.Fatalf("plain update: %+v, %v, retries %d; want seqs 2,3 (no gap from the rolled-back pipelines), no retry", res, err, retries())
	}
	if ws := s.WriterStats(); ws.Batches != 4 || ws.Transactions != 6 {
		t.Errorf("WriterStats %+v: want 4 batches in 6 transactions", ws)
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.LatestSeq != 3 || st.Count != 3 {
		t.Errorf("EventStats %+v, %v; want latest seq 3, 3 events", st, err)
	}
}
