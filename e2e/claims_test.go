package e2e

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// deferredDoc is a submission whose entities the fault processor defers
// with a claim check valid for ttl.
func deferredDoc(content []byte, ttl time.Duration, split map[string]any, extra map[string]string) map[string]any {
	if split == nil {
		split = map[string]any{}
	}
	split["processor"] = "fault"
	md := map[string]string{"pipestream.fault": "defer", "pipestream.claim-ttl-ms": strconv.FormatInt(ttl.Milliseconds(), 10)}
	for k, v := range extra {
		md[k] = v
	}
	return map[string]any{"content": b64(content), "contentType": "application/octet-stream", "split": split, "metadata": md}
}

// awaitClaims waits until GET /v1/documents/{id} lists n claim checks.
func awaitClaims(t testing.TB, g *gatewayProc, id string, n int) *gatewayv1.Document {
	t.Helper()
	return awaitState(t, g, id, "holding claim checks", func(d *gatewayv1.Document) bool {
		if terminal(d.GetState()) {
			t.Fatalf("document %s reached %v (%s) instead of waiting on a claim", id, d.GetState(), d.GetError())
		}
		return len(d.GetClaimChecks()) >= n
	})
}

func getClaim(t testing.TB, g *gatewayProc, claimID string) *gatewayv1.ClaimCheck {
	t.Helper()
	u := g.baseURL() + "/v1/claims/" + claimID
	r := curl(t, "GET", u, nil)
	wantOK(t, "GET "+u, r)
	c := &gatewayv1.ClaimCheck{}
	decode(t, r.body, c)
	return c
}

func redeemURL(g *gatewayProc, claimID string) string {
	return g.baseURL() + "/v1/claims/" + claimID + ":redeem"
}

// TestClaimCheckLifecycle: a DEFERRED entity gets a claim check that the
// document, GET /v1/claims and the event log show; redeeming it finishes
// the document with the right bytes; a replay is 400
// CLAIM_ALREADY_REDEEMED.
func TestClaimCheckLifecycle(t *testing.T) {
	g := shared(t)
	cases := []struct {
		name  string
		in    []byte
		split map[string]any
		extra map[string]string
	}{
		{"whole document", []byte("deferred whole document"), nil, nil},
		{"one chunk of three", binaryData(3000, 9), map[string]any{"strategy": "SPLIT_FIXED_BYTES", "chunkBytes": 1000},
			map[string]string{"pipestream.fault-chunks": "1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := time.Now()
			d := submitREST(t, g, deferredDoc(c.in, time.Minute, c.split, c.extra))
			doc := awaitClaims(t, g, d.GetId(), 1)
			if len(doc.GetClaimChecks()) != 1 {
				t.Fatalf("claimChecks %v, want exactly one", doc.GetClaimChecks())
			}
			if doc.GetEntityCounts().GetDeferred() != 1 {
				t.Errorf("entityCounts.deferred %d, want 1", doc.GetEntityCounts().GetDeferred())
			}
			cc := doc.GetClaimChecks()[0]
			id := cc.GetClaimId()
			if _, err := strconv.ParseUint(id, 10, 64); err != nil || cc.GetName() != "claims/"+id {
				t.Errorf("claim id %q / name %q: want a decimal 64-bit id and name claims/{id}", id, cc.GetName())
			}

			got := getClaim(t, g, id)
			if got.GetState() != gatewayv1.ClaimCheck_ISSUED || got.GetDocumentId() != d.GetId() || got.GetEntityId() != cc.GetEntityId() {
				t.Errorf("GET claim: %v, want ISSUED for document %s entity %d", got, d.GetId(), cc.GetEntityId())
			}
			exp := got.GetExpireTime().AsTime()
			if exp.Before(before.Add(50*time.Second)) || exp.After(time.Now().Add(70*time.Second)) {
				t.Errorf("expireTime %v: want about now + the 60 s claim-ttl-ms", exp)
			}

			r := curlJSON(t, "POST", redeemURL(g, id), "{}")
			wantOK(t, "redeem", r)
			red := &gatewayv1.ClaimCheck{}
			decode(t, r.body, red)
			if red.GetState() != gatewayv1.ClaimCheck_REDEEMED || red.GetRedeemTime() == nil {
				t.Errorf("redeem answered %v, want REDEEMED with a redeemTime", red)
			}
			fin := awaitREST(t, g, d.GetId())
			if fin.GetState() != gatewayv1.State_SUCCEEDED {
				t.Fatalf("after redemption: state %v (%s), want SUCCEEDED", fin.GetState(), fin.GetError())
			}
			if out := resultREST(t, g, d.GetId()).body; !bytes.Equal(out, c.in) {
				t.Errorf("result after redemption: %d bytes sha256 %s, want the %d input bytes", len(out), sha256Hex(out), len(c.in))
			}
			if st := getClaim(t, g, id).GetState(); st != gatewayv1.ClaimCheck_REDEEMED {
				t.Errorf("GET claim after redemption: %v, want REDEEMED", st)
			}

			wantError(t, "replayed redemption", curlJSON(t, "POST", redeemURL(g, id), "{}"),
				400, int(codes.FailedPrecondition), "CLAIM_ALREADY_REDEEMED", "redeemed")

			evs := events(t, curlStream(t, g.baseURL()+"/v1/events:subscribe?cursor=0&documentId="+d.GetId(), 1500*time.Millisecond))
			var actions []string
			for _, ev := range evs {
				if ev.GetDocumentId() != d.GetId() {
					t.Errorf("documentId filter let through an event of %q", ev.GetDocumentId())
				}
				if ev.GetKind() == "#claim" && ev.GetClaimId() == id {
					actions = append(actions, ev.GetClaimAction())
				}
			}
			if !contains(actions, "issued") || !contains(actions, "redeemed") {
				t.Errorf("event log #claim actions for claim %s: %v, want issued and redeemed; events: %v", id, actions, evs)
			}
		})
	}
}

// TestClaimCheckExpiry: a claim with claim-ttl-ms 1000 cannot be redeemed
// after it expired (400 CLAIM_EXPIRED), and the document still ends.
func TestClaimCheckExpiry(t *testing.T) {
	t.Parallel()
	g := shared(t)
	in := []byte("this claim will expire")
	d := submitREST(t, g, deferredDoc(in, time.Second, nil, nil))
	doc := awaitClaims(t, g, d.GetId(), 1)
	id := doc.GetClaimChecks()[0].GetClaimId()
	exp := doc.GetClaimChecks()[0].GetExpireTime().AsTime()
	if time.Until(exp) > 2*time.Second {
		t.Fatalf("expireTime %v is more than claim-ttl-ms 1000 ahead", exp)
	}
	time.Sleep(time.Until(exp) + 500*time.Millisecond)

	wantError(t, "redeem after expiry", curlJSON(t, "POST", redeemURL(g, id), "{}"),
		400, int(codes.FailedPrecondition), "CLAIM_EXPIRED", "expired")
	if st := getClaim(t, g, id).GetState(); st != gatewayv1.ClaimCheck_EXPIRED {
		t.Errorf("GET claim after expiry: %v, want EXPIRED", st)
	}
	// The deferred entity is abandoned once its claim expired: the
	// document must not hang.
	fin := awaitREST(t, g, d.GetId())
	if fin.GetState() == gatewayv1.State_SUCCEEDED {
		t.Errorf("document with an expired, unredeemed claim ended SUCCEEDED")
	}
}
