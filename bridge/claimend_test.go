package bridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestClaimsEndWithTheirDocument: a document that ends while one of its
// claims is ISSUED takes the claim with it (issue 23 item 6): the claim
// becomes CANCELLED with a #claim "cancelled" event, committed with the
// document's terminal state (a read that sees the document ended sees the
// claim ended), and a redemption is refused with ErrClaimCancelled.
func TestClaimsEndWithTheirDocument(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx := context.Background()
	hasClaim := func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) > 0 }

	t.Run("cancelled", func(t *testing.T) {
		doc := e.submit(chunks4, faultReq(gatewayv1.CompletionPolicy_STRICT, "defer", "1"))
		claim := e.waitFor(doc.Id, 20*time.Second, "a claim check", hasClaim).ClaimChecks[0]
		if _, err := e.b.Cancel(ctx, "", doc.Id); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		checkClaimEnded(t, e, doc.Id, claim.ClaimId, gatewayv1.State_CANCELLED)
	})
	t.Run("failed", func(t *testing.T) {
		// The peer goes away while the chunk is deferred, and the document
		// fails after PeerWait without a peer; its claim is still ISSUED.
		e := newEnv(t, withBridgeOpts(func(o *bridge.Options) { o.PeerWait = time.Second }))
		e.waitReady()
		doc := e.submit(chunks4, faultReq(gatewayv1.CompletionPolicy_STRICT, "defer", "2"))
		claim := e.waitFor(doc.Id, 20*time.Second, "a claim check", hasClaim).ClaimChecks[0]
		e.stopPeer()
		checkClaimEnded(t, e, doc.Id, claim.ClaimId, gatewayv1.State_FAILED)
	})
}

// checkClaimEnded waits for document id to reach want and checks that its
// claim claimID ended with it.
func checkClaimEnded(t *testing.T, e *env, id, claimID string, want gatewayv1.State) {
	t.Helper()
	ctx := context.Background()
	got := e.wait(id, 20*time.Second)
	if got.State != want {
		t.Fatalf("document %s, error %q; want %s", got.State, got.Error, want)
	}
	if len(got.ClaimChecks) != 1 || got.ClaimChecks[0].State != gatewayv1.ClaimCheck_CANCELLED {
		t.Fatalf("the first read of the %s document shows its claims %v; want the claim CANCELLED in the same commit", want, got.ClaimChecks)
	}
	if c, err := e.b.GetClaim(ctx, "", claimID); err != nil || c.State != gatewayv1.ClaimCheck_CANCELLED {
		t.Fatalf("GetClaim = %v, %v; want CANCELLED", c, err)
	}
	_, err := e.b.Redeem(ctx, "", claimID)
	wantErr(t, err, bridge.ErrClaimCancelled)

	var ev *gatewayv1.Event
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = e.b.Events().Subscribe(sctx, "", "k", new(uint64), bridge.EventFilter{DocumentID: id}, func(x *gatewayv1.Event) error {
		if x.Kind == "#claim" && x.ClaimId == claimID && x.ClaimAction == "cancelled" {
			ev = x
			cancel()
		}
		return nil
	})
	if ev == nil || ev.Message == "" {
		t.Fatalf("no #claim cancelled event with a message for claim %s: %v", claimID, ev)
	}
}
