package e2e

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestRestartMidRun SIGKILLs a gateway (and with it the embedded peer)
// while documents are in flight, restarts it on the same data dir and
// checks docs/architecture.md, "Where state lives": nothing acknowledged is lost, every document
// reaches a terminal state with intact results, claims survive and event
// seqs never repeat.
func TestRestartMidRun(t *testing.T) {
	t.Parallel()
	g1 := startGateway(t, gwOpts{})
	c1 := dialGRPC(t, g1)
	ctx := ctxT(t, 3*time.Minute)

	type want struct {
		result []byte            // expected result bytes
		states []gatewayv1.State // acceptable terminal states
	}
	docs := map[string]want{}
	succeeded := []gatewayv1.State{gatewayv1.State_SUCCEEDED}

	// Finished before the crash: must stay finished with the same result.
	for i := range 3 {
		in := []byte(fmt.Sprintf("finished before the crash #%d", i))
		d := submitREST(t, g1, map[string]any{"content": b64(in), "contentType": "text/plain"})
		if fin := awaitREST(t, g1, d.GetId()); fin.GetState() != gatewayv1.State_SUCCEEDED {
			t.Fatalf("pre-crash document: %v", fin.GetState())
		}
		docs[d.GetId()] = want{result: in, states: succeeded}
	}

	// Deferred with a claim that outlives the crash.
	claimIn := []byte("deferred across a crash")
	cd := submitREST(t, g1, deferredDoc(claimIn, 10*time.Minute, nil, nil))
	claimID := awaitClaims(t, g1, cd.GetId(), 1).GetClaimChecks()[0].GetClaimId()

	// Slow: chunk 0 never finishes and is abandoned after timeoutMs; LENIENT
	// rehydrates the other chunks.
	slowIn := binaryData(3000, 11)
	slow := submitREST(t, g1, map[string]any{
		"content": b64(slowIn), "contentType": "application/octet-stream",
		"split":            map[string]any{"strategy": "SPLIT_FIXED_BYTES", "chunkBytes": 1000, "processor": "fault"},
		"completionPolicy": map[string]any{"mode": "LENIENT", "timeoutMs": 3000},
		"metadata":         map[string]string{"pipestream.fault": "timeout", "pipestream.fault-chunks": "0"},
	})
	docs[slow.GetId()] = want{result: slowIn[1000:], states: []gatewayv1.State{gatewayv1.State_PARTIALLY_SUCCEEDED}}

	// Large: acknowledged, then the crash hits while it is processed.
	large := binaryData(24<<20, 12)
	ld := docOf(t, "large upload", curl(t, "POST", g1.baseURL()+"/v1/documents:upload?split.strategy=fixed_bytes&split.chunkBytes=1048576",
		nil, "--data-binary", "@"+writeTemp(t, "large.bin", large)))
	docs[ld.GetId()] = want{result: large, states: succeeded}

	// A burst of small gRPC submissions right before the crash.
	for i := range 5 {
		in := []byte(fmt.Sprintf("burst %d", i))
		d, err := c1.docs.SubmitDocument(ctx, &gatewayv1.SubmitDocumentRequest{Content: in, ContentType: "text/plain",
			Split: &gatewayv1.SplitOptions{Processor: "passthrough"}})
		if err != nil {
			t.Fatalf("burst submit %d: %v", i, err)
		}
		docs[d.GetId()] = want{result: in, states: succeeded}
	}
	w, err := c1.events.GetEventWindow(ctx, &gatewayv1.GetEventWindowRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seqBefore := w.GetLatestSeq()

	g1.proc.kill()
	t.Logf("SIGKILLed the gateway with %d acknowledged documents, event seq %d", len(docs)+1, seqBefore)

	g2 := g1.restart(t)
	c2 := dialGRPC(t, g2)

	// The claim survived (docs/architecture.md, "Where state lives": "claims and redemptions
	// survive"): still ISSUED, and the client's claim id redeems the entity.
	if st := getClaim(t, g2, claimID).GetState(); st != gatewayv1.ClaimCheck_ISSUED {
		t.Errorf("claim %s after restart: %v, want ISSUED", claimID, st)
	}
	if r := curlJSON(t, "POST", redeemURL(g2, claimID), "{}"); r.status != 200 {
		t.Errorf("redeeming the pre-crash claim %s after restart: want 200, got %s", claimID, r)
		// Let the document finish anyway so the checks below still run:
		// redeem whatever claim the re-dispatch issued.
		d := awaitState(t, g2, cd.GetId(), "holding a new claim", func(d *gatewayv1.Document) bool {
			for _, c := range d.GetClaimChecks() {
				if c.GetClaimId() != claimID && c.GetState() == gatewayv1.ClaimCheck_ISSUED {
					return true
				}
			}
			return terminal(d.GetState())
		})
		for _, c := range d.GetClaimChecks() {
			if c.GetClaimId() != claimID && c.GetState() == gatewayv1.ClaimCheck_ISSUED {
				wantOK(t, "redeem the re-issued claim", curlJSON(t, "POST", redeemURL(g2, c.GetClaimId()), "{}"))
			}
		}
	}
	docs[cd.GetId()] = want{result: claimIn, states: succeeded}

	for id, wnt := range docs {
		ups := watchGRPC(t, c2, id)
		fin := ups[len(ups)-1].GetDocument()
		ok := false
		for _, s := range wnt.states {
			ok = ok || fin.GetState() == s
		}
		if !ok {
			t.Errorf("document %s after restart ended %v (%s), want one of %v", id, fin.GetState(), fin.GetError(), wnt.states)
			continue
		}
		body, err := grpcResult(ctx, c2.docs, id)
		if err != nil {
			t.Errorf("result of %s after restart: %v", id, err)
			continue
		}
		if !bytes.Equal(body.GetData(), wnt.result) {
			t.Errorf("result of %s after restart: %d bytes sha256 %s, want %d bytes sha256 %s",
				id, len(body.GetData()), sha256Hex(body.GetData()), len(wnt.result), sha256Hex(wnt.result))
		}
	}

	// Seqs are durable and never repeat: a new document's events come
	// after everything the first process assigned.
	nd := submitREST(t, g2, map[string]any{"content": b64([]byte("after the restart")), "contentType": "text/plain"})
	awaitREST(t, g2, nd.GetId())
	evs := events(t, curlStream(t, g2.baseURL()+"/v1/events:subscribe?cursor=0&documentId="+nd.GetId(), time.Second))
	if len(evs) == 0 {
		t.Fatalf("no events for the post-restart document")
	}
	if evs[0].GetSeq() <= seqBefore {
		t.Errorf("post-restart event seq %d is not above %d, the latest seq before the crash: seqs repeat", evs[0].GetSeq(), seqBefore)
	}
}

// TestGracefulShutdown sends SIGTERM while one document waits on a claim
// check and another is being processed: the gateway exits 0 well within
// --shutdown-timeout (a claim can wait for a day; it must not hold the
// drain), and after a restart on the same data dir the claim is still
// redeemable and both documents finish.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	g1 := startGateway(t, gwOpts{args: []string{"--shutdown-timeout", "8s"}})
	cin := []byte("deferred across a graceful restart")
	cd := submitREST(t, g1, deferredDoc(cin, 10*time.Minute, nil, nil))
	claimID := awaitClaims(t, g1, cd.GetId(), 1).GetClaimChecks()[0].GetClaimId()
	in := textCorpus(2 << 20)
	d := docOf(t, "upload", curl(t, "POST", g1.baseURL()+"/v1/documents:upload?split.strategy=lines&split.chunkBytes=65536&split.processor=textstats", in))

	start := time.Now()
	if err := g1.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g1.proc.done:
	case <-time.After(13 * time.Second):
		t.Fatalf("gateway did not exit within 13 s of SIGTERM (--shutdown-timeout 8s)")
	}
	took := time.Since(start)
	if code := g1.proc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if took > 5*time.Second {
		t.Errorf("graceful shutdown took %v: a document waiting only on a claim check must not hold the drain until --shutdown-timeout", took.Round(time.Millisecond))
	}

	g2 := g1.restart(t)
	if st := getClaim(t, g2, claimID).GetState(); st != gatewayv1.ClaimCheck_ISSUED {
		t.Errorf("claim after a graceful restart: %v, want ISSUED", st)
	}
	if r := curlJSON(t, "POST", redeemURL(g2, claimID), "{}"); r.status != 200 {
		t.Errorf("redeeming the claim after a graceful restart: want 200, got %s", r)
	} else if fin := awaitREST(t, g2, cd.GetId()); fin.GetState() != gatewayv1.State_SUCCEEDED || !bytes.Equal(resultREST(t, g2, cd.GetId()).body, cin) {
		t.Errorf("deferred document after redemption: %v", fin.GetState())
	}
	if fin := awaitREST(t, g2, d.GetId()); fin.GetState() != gatewayv1.State_SUCCEEDED {
		t.Errorf("document in flight at SIGTERM: %v (%s), want SUCCEEDED", fin.GetState(), fin.GetError())
	}
}
