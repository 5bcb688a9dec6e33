package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestGroupedPayloadsReadBackExactly: concurrent commits, each creating a
// document with an inline payload of its own size (0 to 12 KiB, random
// bytes), share group transactions whose payloads go as one concatenated
// parameter cut by offset (upsertPayloadsSQL); every payload reads back
// byte for byte.
func TestGroupedPayloadsReadBackExactly(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	const n = 96
	rng := rand.New(rand.NewPCG(20, 26))
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = make([]byte, rng.IntN(12<<10+1))
		for j := range bodies[i] {
			bodies[i][j] = byte(rng.Uint32())
		}
	}
	before := s.WriterStats()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("p%d", i)
			_, err := s.Commit(ctx, &store.Batch{Create: doc(id, ""),
				Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadResult, Body: bodies[i]}}})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := s.WriterStats()
	if txns, batches := st.Transactions-before.Transactions, st.Batches-before.Batches; txns >= batches {
		t.Fatalf("%d transactions for %d batches: no group carried two payloads", txns, batches)
	}
	for i, want := range bodies {
		got, err := s.GetPayload(ctx, "acme", fmt.Sprintf("p%d", i), store.PayloadResult)
		if err != nil {
			t.Fatalf("payload %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("payload %d: %d octets read back, %d written, or different bytes", i, len(got), len(want))
		}
	}
}
