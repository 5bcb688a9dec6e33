package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// base is the creation time of the first document of a test; stored times
// are compared at microsecond precision (PostgreSQL's timestamp).
var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newDoc(tenant, id string, created time.Time) *store.DocumentRecord {
	return &store.DocumentRecord{
		Tenant: tenant,
		Doc: &gatewayv1.Document{
			Name: "documents/" + id, Id: id, State: gatewayv1.State_PENDING, Rev: 1,
			ContentType: "text/plain", CreateTime: timestamppb.New(created), UpdateTime: timestamppb.New(created),
		},
		BodyHash: []byte("hash-" + id),
	}
}

func newEvent(kind, docID string, rev uint64) *gatewayv1.Event {
	return &gatewayv1.Event{Time: timestamppb.New(base), Kind: kind, DocumentId: docID, Rev: rev, Since: rev - 1}
}

func issued(tenant, docID, claimID string, expire time.Time) store.ClaimRecord {
	return store.ClaimRecord{Tenant: tenant, Claim: &gatewayv1.ClaimCheck{
		ClaimId: claimID, DocumentId: docID, EntityId: 7, State: gatewayv1.ClaimCheck_ISSUED,
		ExpireTime: timestamppb.New(expire), CreateTime: timestamppb.New(base),
	}}
}

func mustCommit(t *testing.T, s Store, b *store.Batch) store.CommitResult {
	t.Helper()
	res, err := s.Commit(context.Background(), b)
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	return res
}

// wantErr fails unless err wraps want.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

// ids lists the document ids of recs.
func ids(recs []*store.DocumentRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Doc.GetId()
	}
	return out
}
