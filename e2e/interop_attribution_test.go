package e2e

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestInteropOwnNumbering: issue 20's first two cases, checked from
// outside the way they were seen. A plain draft-02 peer that numbers its
// result entities itself (a counter per connection from 1, parent-id =
// the input; the torture test's own-ids partner): 120 small documents of
// two tenants, 24 in flight, all SUCCEEDED with the result of their own
// content; a 3 MiB upload in 1 MiB chunks SUCCEEDED with every chunk's
// result in chunk order.
func TestInteropOwnNumbering(t *testing.T) {
	t.Parallel()
	ledger := &tLedger{}
	p := startTPeer(t, 0, bOwnIDs, 1, ledger)
	tokens := tortureTokens(t)
	g := startGateway(t, gwOpts{args: []string{"--peer", p.addr, "--peer-ca", p.caPath, "--auth-tokens", tokens.file,
		"--rate-limit", "0", "--max-uploads-per-tenant", "0", "--max-downloads-per-tenant", "0"}})
	conn, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := func(tenant string) *tClient {
		return &tClient{tenant: tenant, token: tokens.byTenant[tenant], docs: gatewayv1.NewDocumentServiceClient(conn)}
	}
	ctx := ctxT(t, 3*time.Minute)

	var docs []*tDoc
	for i := range 120 {
		tenant := []string{"acme", "globex"}[i%2]
		docs = append(docs, newTDoc(tDocPlan{n: i, tenant: tenant, size: 200 + i*37, contentSeed: uint64(i),
			strategy: gatewayv1.SplitStrategy_SPLIT_NONE, processor: "textstats"}))
	}
	big := newTDoc(tDocPlan{n: 120, tenant: "acme", size: 3 << 20, contentSeed: 120,
		strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, chunkBytes: 1 << 20, processor: "textstats"})
	docs = append(docs, big)

	sem := make(chan struct{}, 24)
	var wg sync.WaitGroup
	for _, d := range docs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c := client(d.plan.tenant)
			c.submit(ctx, d, &wg)
			if d.id == "" {
				return
			}
			for d.final == nil || !isTerminal(d.final.GetState()) {
				if ctx.Err() != nil {
					return
				}
				if err := c.fetch(ctx, d); err != nil {
					d.resultErr = err
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	wrong := 0
	for _, d := range docs {
		switch {
		case d.id == "":
			t.Errorf("document %d: not accepted: %v", d.plan.n, d.submitErr)
		case d.final == nil || d.final.GetState() != gatewayv1.State_SUCCEEDED || d.final.GetResultAbsent():
			t.Errorf("document %d (%s): %v, want SUCCEEDED with a result (%v)", d.plan.n, d.plan.tenant, d.final, d.resultErr)
		case !bytes.Equal(d.result, tortureProcess(d.plan.processor, d.content)):
			wrong++
			t.Errorf("document %d (%s, %d octets): wrong result (%s)", d.plan.n, d.plan.tenant, d.plan.size,
				firstDiff(d.result, tortureProcess(d.plan.processor, d.content)))
		}
	}
	chunks := 0
	ledger.mu.Lock()
	for _, rc := range ledger.received {
		if rc.chunk != nil {
			chunks++
		}
	}
	ledger.mu.Unlock()
	if chunks != 3 {
		t.Errorf("the 3 MiB upload reached the peer as %d chunks, want 3 of 1 MiB", chunks)
	}
	t.Logf("%d documents, %d wrong; the peer's result ids collide with the gateway's (its counter starts at 1)", len(docs), wrong)
}
