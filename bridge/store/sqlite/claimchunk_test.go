package sqlite_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestClaimChunkPersists: the chunk a claim's deferred entity carried is
// stored with the claim (schema 4), survives a reopen, is kept by upserts
// that do not set it (state changes) and is read by ListClaims, GetClaim
// and GetDocument's claims; a claim stored without it reads as unset.
func TestClaimChunkPersists(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, sqlite.Options{})
	ctx := context.Background()
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base)})
	claim := func(id string, st gatewayv1.ClaimCheck_ClaimState) *gatewayv1.ClaimCheck {
		return &gatewayv1.ClaimCheck{ClaimId: id, DocumentId: "d1", EntityId: 1, State: st,
			ExpireTime: timestamppb.New(time.Now().Add(time.Hour)), CreateTime: timestamppb.New(base)}
	}
	mustCommit(t, s, &store.Batch{Claims: []store.ClaimRecord{
		{Tenant: "t", Claim: claim("1", gatewayv1.ClaimCheck_ISSUED), Chunk: store.ClaimChunk{Set: true, Index: -1}},
		{Tenant: "t", Claim: claim("2", gatewayv1.ClaimCheck_ISSUED), Chunk: store.ClaimChunk{Set: true, Index: 5}},
		{Tenant: "t", Claim: claim("3", gatewayv1.ClaimCheck_ISSUED)},
	}})
	// A state change written without the chunk keeps it.
	mustCommit(t, s, &store.Batch{Claims: []store.ClaimRecord{{Tenant: "t", Claim: claim("2", gatewayv1.ClaimCheck_EXPIRED)}}})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, sqlite.Options{})
	recs, err := s.ListClaims(ctx, "t", "d1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]store.ClaimChunk{"1": {Set: true, Index: -1}, "2": {Set: true, Index: 5}, "3": {}}
	if len(recs) != len(want) {
		t.Fatalf("ListClaims: %d claims, want %d", len(recs), len(want))
	}
	for _, r := range recs {
		if r.Chunk != want[r.Claim.ClaimId] {
			t.Errorf("claim %s: chunk %+v, want %+v", r.Claim.ClaimId, r.Chunk, want[r.Claim.ClaimId])
		}
	}
	if r, err := s.GetClaim(ctx, "t", "2"); err != nil || r.Chunk != want["2"] || r.Claim.State != gatewayv1.ClaimCheck_EXPIRED {
		t.Errorf("GetClaim 2: %+v %v", r, err)
	}
	if recs, err := s.ListClaims(ctx, "other", "d1"); err != nil || len(recs) != 0 {
		t.Errorf("another tenant's ListClaims: %d claims, %v; want none", len(recs), err)
	}
}
