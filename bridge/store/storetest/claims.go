package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// testClaimsRedeemedOnce: of many concurrent redemptions of one claim
// exactly one wins (its batch's events commit); the rest are refused with
// ErrClaimRedeemed and append nothing.
func testClaimsRedeemedOnce(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base),
		Claims: []store.ClaimRecord{issued("t", "d1", "18446744073709551615", now.Add(time.Hour))}})
	const n = 30
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		wins, redeemed int
		others         []error
		start          = make(chan struct{})
		winner         *gatewayv1.ClaimCheck
	)
	for range n {
		wg.Go(func() {
			<-start
			res, err := s.Commit(ctx, &store.Batch{
				Redeem: &store.RedeemClaim{Tenant: "t", ClaimID: "18446744073709551615", Now: now},
				Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#claim", "d1", 2)}},
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
				winner = res.Claim
			case errors.Is(err, store.ErrClaimRedeemed):
				redeemed++
			default:
				others = append(others, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if wins != 1 || redeemed != n-1 || len(others) != 0 {
		t.Fatalf("wins %d, already redeemed %d, other %v; want 1, %d, none", wins, redeemed, others, n-1)
	}
	if winner.GetState() != gatewayv1.ClaimCheck_REDEEMED || !winner.GetRedeemTime().AsTime().Equal(now) {
		t.Fatalf("the winner's claim = %v, want REDEEMED at %v", winner, now)
	}
	if s.LastSeq() != 1 {
		t.Fatalf("refused redemptions appended events: LastSeq %d, want 1", s.LastSeq())
	}
	c, err := s.GetClaim(ctx, "t", "18446744073709551615")
	if err != nil || c.Claim.GetState() != gatewayv1.ClaimCheck_REDEEMED || c.Claim.GetName() != "" {
		t.Fatalf("GetClaim = %v, %v", c, err)
	}
}

// testClaimErrors: expired, unknown and malformed claims; the chunk a claim
// carries; ListClaims and ListIssuedClaims.
func testClaimErrors(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	now := time.Now().UTC()
	withChunk := issued("t", "d1", "7", now.Add(time.Hour))
	withChunk.Chunk = store.ClaimChunk{Set: true, Index: 3}
	root := issued("t", "d1", "8", now.Add(2*time.Hour))
	root.Chunk = store.ClaimChunk{Set: true, Index: -1}
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base),
		Claims: []store.ClaimRecord{issued("t", "d1", "5", now.Add(-time.Second)), withChunk, root}})
	_, err := s.Commit(ctx, &store.Batch{Redeem: &store.RedeemClaim{Tenant: "t", ClaimID: "5", Now: now}})
	wantErr(t, "expired claim", err, store.ErrClaimExpired)
	for _, id := range []string{"6", "not-a-number"} {
		_, err := s.Commit(ctx, &store.Batch{Redeem: &store.RedeemClaim{Tenant: "t", ClaimID: id, Now: now}})
		wantErr(t, "unknown claim "+id, err, store.ErrNotFound)
	}
	_, err = s.Commit(ctx, &store.Batch{Claims: []store.ClaimRecord{issued("t", "d1", "x1", now)}})
	wantErr(t, "claim id that is not a decimal uint64", err, store.ErrInvalid)
	c, err := s.GetClaim(ctx, "t", "7")
	if err != nil || c.Chunk != (store.ClaimChunk{Set: true, Index: 3}) || c.Tenant != "t" {
		t.Fatalf("GetClaim(7) = %+v, %v; want chunk 3", c, err)
	}
	up := issued("t", "d1", "7", now.Add(time.Hour)) // an upsert without Chunk keeps it
	up.Claim.ScopeId = 4
	mustCommit(t, s, &store.Batch{Claims: []store.ClaimRecord{up}})
	if c, err := s.GetClaim(ctx, "t", "7"); err != nil || c.Chunk.Index != 3 || !c.Chunk.Set || c.Claim.GetScopeId() != 4 {
		t.Fatalf("after an upsert without chunk: %+v, %v", c, err)
	}
	cs, err := s.ListClaims(ctx, "t", "d1")
	if err != nil || len(cs) != 3 {
		t.Fatalf("ListClaims = %v, %v; want 3", cs, err)
	}
	exp, err := s.ListIssuedClaims(ctx, now.Add(90*time.Minute))
	if err != nil || len(exp) != 2 || exp[0].Claim.GetClaimId() != "5" || exp[1].Claim.GetClaimId() != "7" {
		t.Fatalf("ListIssuedClaims = %v, %v; want 5 then 7", exp, err)
	}
}

// testClaimsCancelled: a document that ends cancels its open claims in the
// transaction of its own update (one batch: the document, the claims, the
// events); a CANCELLED claim refuses redemption with ErrClaimCancelled; and
// a cancellation never overwrites a claim redeemed (or expired) first.
func testClaimsCancelled(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base), Claims: []store.ClaimRecord{
		issued("t", "d1", "11", now.Add(time.Hour)), issued("t", "d1", "12", now.Add(time.Hour)), issued("t", "d1", "13", now.Add(time.Hour))}})
	redeemed := mustCommit(t, s, &store.Batch{Redeem: &store.RedeemClaim{Tenant: "t", ClaimID: "12", Now: now}}).Claim
	expired := issued("t", "d1", "13", now.Add(time.Hour))
	expired.Claim.State = gatewayv1.ClaimCheck_EXPIRED
	mustCommit(t, s, &store.Batch{Claims: []store.ClaimRecord{expired}})

	// The document's end: its update, every claim it knew as ISSUED moved
	// to CANCELLED (12 and 13 are stale in the caller's view), one event.
	doc := newDoc("t", "d1", base)
	doc.Doc.State, doc.Doc.Rev = gatewayv1.State_CANCELLED, 2
	var cancels []store.ClaimRecord
	for _, id := range []string{"11", "12", "13"} {
		c := issued("t", "d1", id, now.Add(time.Hour))
		c.Claim.State = gatewayv1.ClaimCheck_CANCELLED
		cancels = append(cancels, c)
	}
	mustCommit(t, s, &store.Batch{Updates: []store.DocumentUpdate{{Record: doc, PrevRev: 1}}, Claims: cancels,
		Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#claim", "d1", 2)}}})
	want := map[string]gatewayv1.ClaimCheck_ClaimState{"11": gatewayv1.ClaimCheck_CANCELLED,
		"12": gatewayv1.ClaimCheck_REDEEMED, "13": gatewayv1.ClaimCheck_EXPIRED}
	for id, st := range want {
		c, err := s.GetClaim(ctx, "t", id)
		if err != nil || c.Claim.GetState() != st {
			t.Fatalf("claim %s after its document's cancellation: %v, %v; want %v", id, c, err, st)
		}
	}
	if c, _ := s.GetClaim(ctx, "t", "12"); !c.Claim.GetRedeemTime().AsTime().Equal(redeemed.GetRedeemTime().AsTime()) {
		t.Fatalf("the cancellation changed the redeem time of claim 12: %v, want %v", c.Claim.GetRedeemTime(), redeemed.GetRedeemTime())
	}
	_, err := s.Commit(ctx, &store.Batch{Redeem: &store.RedeemClaim{Tenant: "t", ClaimID: "11", Now: now},
		Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#claim", "d1", 3)}}})
	wantErr(t, "redeeming a cancelled claim", err, store.ErrClaimCancelled)
	if s.LastSeq() != 1 {
		t.Fatalf("the refused redemption appended an event: LastSeq %d, want 1", s.LastSeq())
	}
	if exp, err := s.ListIssuedClaims(ctx, now.Add(2*time.Hour)); err != nil || len(exp) != 0 {
		t.Fatalf("ListIssuedClaims after the cancellation = %v, %v; want none", exp, err)
	}
}

// testIdempotency: a create repeating (tenant, request id) with the same
// body hash applies nothing and names the first document; with another hash
// it is ErrConflict; concurrent repeats create one document.
func testIdempotency(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	first := newDoc("t", "d1", base)
	first.Doc.RequestId = "req-1"
	mustCommit(t, s, &store.Batch{Create: first, Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "d1", 1)}}})
	again := newDoc("t", "d2", base)
	again.Doc.RequestId, again.BodyHash = "req-1", first.BodyHash
	res, err := s.Commit(ctx, &store.Batch{Create: again, Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "d2", 1)}}})
	if err != nil || res.Duplicate == nil || res.Duplicate.Doc.GetId() != "d1" || len(res.Seqs) != 0 {
		t.Fatalf("repeat = %+v, %v; want Duplicate d1 and nothing applied", res, err)
	}
	if _, err := s.GetDocument(ctx, "t", "d2", false); !errors.Is(err, store.ErrNotFound) || s.LastSeq() != 1 {
		t.Fatalf("the repeat applied something: d2 %v, LastSeq %d", err, s.LastSeq())
	}
	other := newDoc("t", "d3", base)
	other.Doc.RequestId = "req-1"
	_, err = s.Commit(ctx, &store.Batch{Create: other})
	wantErr(t, "request id with another body", err, store.ErrConflict)
	elsewhere := newDoc("u", "d4", base) // request ids are per tenant
	elsewhere.Doc.RequestId, elsewhere.BodyHash = "req-1", first.BodyHash
	if res := mustCommit(t, s, &store.Batch{Create: elsewhere}); res.Duplicate != nil {
		t.Fatalf("another tenant's request id was a duplicate: %v", res.Duplicate)
	}

	const n = 10
	var wg sync.WaitGroup
	created := make(chan string, n)
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			rec := newDoc("t", "c"+string(rune('a'+i)), base)
			rec.Doc.RequestId, rec.BodyHash = "req-2", []byte("same")
			res, err := s.Commit(ctx, &store.Batch{Create: rec})
			switch {
			case err != nil:
				errs <- err
			case res.Duplicate == nil:
				created <- rec.Doc.GetId()
			}
		})
	}
	wg.Wait()
	close(created)
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent repeat: %v", err)
	}
	if len(created) != 1 {
		t.Fatalf("%d concurrent creates with one request id created documents, want exactly 1", len(created))
	}
}
