package bridge_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// chunks4 is 4 lines of 10 bytes, cut into one chunk per line.
var chunks4 = []byte("aaaaaaaaa\nbbbbbbbbb\nccccccccc\nddddddddd\n")

func faultReq(mode gatewayv1.CompletionPolicy_Mode, fault, chunks string) *gatewayv1.SubmitDocumentRequest {
	return &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split:            &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 10, Processor: "fault"},
		CompletionPolicy: &gatewayv1.CompletionPolicy{Mode: mode},
		Metadata:         map[string]string{"pipestream.fault": fault, "pipestream.fault-chunks": chunks}}
}

func TestCompletionPolicies(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	t.Run("lenient", func(t *testing.T) {
		doc := e.submit(chunks4, faultReq(gatewayv1.CompletionPolicy_LENIENT, "fail", "1"))
		got := e.wait(doc.Id, 20*time.Second)
		if got.State != gatewayv1.State_PARTIALLY_SUCCEEDED {
			t.Fatalf("state %s error %q", got.State, got.Error)
		}
		if got.EntityCounts.Failed != 1 || got.EntityCounts.Complete != 4 {
			t.Fatalf("counts %v, want 1 failed chunk, 3 chunks + root complete", got.EntityCounts)
		}
		if res := e.result(doc.Id); string(res) != "aaaaaaaaa\nccccccccc\nddddddddd\n" {
			t.Fatalf("result %q", res)
		}
	})
	t.Run("strict", func(t *testing.T) {
		doc := e.submit(chunks4, faultReq(gatewayv1.CompletionPolicy_STRICT, "fail", "2"))
		got := e.wait(doc.Id, 20*time.Second)
		if got.State != gatewayv1.State_FAILED || !strings.Contains(got.Error, "3 of 4") {
			t.Fatalf("state %s error %q", got.State, got.Error)
		}
		if _, _, _, err := e.b.Result(context.Background(), "", doc.Id); err == nil {
			t.Fatal("Result of a FAILED document succeeded")
		}
	})
	t.Run("retry", func(t *testing.T) {
		req := faultReq(gatewayv1.CompletionPolicy_STRICT, "fail-once", "0,3")
		req.CompletionPolicy.OnFailure = gatewayv1.CompletionPolicy_RETRY
		req.CompletionPolicy.MaxRetries = 2
		req.CompletionPolicy.RetryDelayMs = 10
		doc := e.submit(chunks4, req)
		got := e.wait(doc.Id, 20*time.Second)
		if got.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("state %s error %q", got.State, got.Error)
		}
		if res := e.result(doc.Id); !bytes.Equal(res, chunks4) {
			t.Fatalf("result %q", res)
		}
	})
}

func TestClaimCheckRedeem(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx := context.Background()
	doc := e.submit(chunks4, faultReq(gatewayv1.CompletionPolicy_STRICT, "defer", "1"))
	got := e.waitFor(doc.Id, 20*time.Second, "a claim check", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) > 0 })
	c := got.ClaimChecks[0]
	if c.State != gatewayv1.ClaimCheck_ISSUED || c.DocumentId != doc.Id || c.Name != "claims/"+c.ClaimId || c.ExpireTime == nil {
		t.Fatalf("claim %v", c)
	}
	gc, err := e.b.GetClaim(ctx, "", c.ClaimId)
	if err != nil || gc.EntityId != c.EntityId {
		t.Fatalf("GetClaim %v %v", gc, err)
	}
	_, err = e.b.GetClaim(ctx, "other-tenant", c.ClaimId)
	wantErr(t, err, bridge.ErrNotFound)
	_, err = e.b.Redeem(ctx, "other-tenant", c.ClaimId)
	wantErr(t, err, bridge.ErrNotFound)
	_, err = e.b.Redeem(ctx, "", "12345")
	wantErr(t, err, bridge.ErrNotFound)
	_, err = e.b.Redeem(ctx, "", "not-a-number")
	wantErr(t, err, bridge.ErrInvalid)

	rc, err := e.b.Redeem(ctx, "", c.ClaimId)
	if err != nil {
		t.Fatalf("Redeem: %v", err)
	}
	if rc.State != gatewayv1.ClaimCheck_REDEEMED || rc.RedeemTime == nil {
		t.Fatalf("redeemed claim %v", rc)
	}
	_, err = e.b.Redeem(ctx, "", c.ClaimId)
	wantErr(t, err, bridge.ErrClaimRedeemed)
	got = e.wait(doc.Id, 20*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q counts %v", got.State, got.Error, got.EntityCounts)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, chunks4) {
		t.Fatalf("result %q", res)
	}
}

func TestClaimCheckExpired(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	req := faultReq(gatewayv1.CompletionPolicy_LENIENT, "defer", "0")
	req.Metadata["pipestream.claim-ttl-ms"] = "300"
	doc := e.submit(chunks4, req)
	got := e.waitFor(doc.Id, 20*time.Second, "a claim check", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) > 0 })
	id := got.ClaimChecks[0].ClaimId
	// The claim sweeper's verdict is the event: the claim is EXPIRED.
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := e.b.GetClaim(context.Background(), "", id)
		if err == nil && c.State == gatewayv1.ClaimCheck_EXPIRED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim %s with a 300 ms TTL not EXPIRED after 20 s: %v %v", id, c, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := e.b.Redeem(context.Background(), "", id)
	wantErr(t, err, bridge.ErrClaimExpired)
	c, err := e.b.GetClaim(context.Background(), "", id)
	if err != nil || c.State != gatewayv1.ClaimCheck_EXPIRED {
		t.Fatalf("claim after expiry %v %v", c, err)
	}
	// The peer abandons the expired child; LENIENT rehydrates the rest.
	got = e.wait(doc.Id, 20*time.Second)
	if got.State != gatewayv1.State_PARTIALLY_SUCCEEDED {
		t.Fatalf("state %s error %q counts %v", got.State, got.Error, got.EntityCounts)
	}
}
