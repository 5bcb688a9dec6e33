package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// testDocuments: a created document reads back field for field; a reused
// id is ErrConflict; a missing one ErrNotFound; a malformed one ErrInvalid.
func testDocuments(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	rec := newDoc("t", "d1", base)
	rec.Doc.Metadata = map[string]string{"k": "v"}
	rec.ContentPayload, rec.ResultPayload = true, true
	rec.ResultContentType = "text/csv"
	rec.DispatchAttempts = 2
	rec.Private = []byte{1, 2, 3}
	mustCommit(t, s, &store.Batch{Create: rec})
	got, err := s.GetDocument(ctx, "t", "d1", false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "t" || !proto.Equal(got.Doc, rec.Doc) || string(got.BodyHash) != "hash-d1" ||
		!got.ContentPayload || !got.ResultPayload || got.ResultContentType != "text/csv" ||
		got.DispatchAttempts != 2 || string(got.Private) != "\x01\x02\x03" {
		t.Fatalf("GetDocument = %+v (doc %v), want %+v (doc %v)", got, got.Doc, rec, rec.Doc)
	}
	_, err = s.Commit(ctx, &store.Batch{Create: newDoc("t", "d1", base)})
	wantErr(t, "create with a reused id", err, store.ErrConflict)
	_, err = s.GetDocument(ctx, "t", "nope", false)
	wantErr(t, "missing document", err, store.ErrNotFound)
	_, err = s.Commit(ctx, &store.Batch{Create: &store.DocumentRecord{Tenant: "t"}})
	wantErr(t, "document without Doc", err, store.ErrInvalid)
	_, err = s.Commit(ctx, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: &gatewayv1.Event{Kind: "#info"}}}})
	wantErr(t, "event without time", err, store.ErrInvalid)
	if s.LastSeq() != 0 {
		t.Fatalf("failed batches assigned seqs: LastSeq %d", s.LastSeq())
	}
}

// testRevisions: an update applies only at the stored revision
// (ErrStaleRev otherwise) and a failed batch applies nothing of itself.
func testRevisions(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base)})
	up := newDoc("t", "d1", base)
	up.Doc.State, up.Doc.Rev = gatewayv1.State_RUNNING, 2
	mustCommit(t, s, &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: 1}}})
	stale := newDoc("t", "d1", base)
	stale.Doc.State, stale.Doc.Rev = gatewayv1.State_FAILED, 2
	_, err := s.Commit(ctx, &store.Batch{
		Updates: []store.DocumentUpdate{{Record: stale, PrevRev: 1}},
		Events:  []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "d1", 2)}},
	})
	wantErr(t, "update at a stale revision", err, store.ErrStaleRev)
	got, err := s.GetDocument(ctx, "t", "d1", false)
	if err != nil || got.Doc.GetState() != gatewayv1.State_RUNNING || got.Doc.GetRev() != 2 {
		t.Fatalf("after the stale update: %v, %v; want RUNNING rev 2", got, err)
	}
	if s.LastSeq() != 0 {
		t.Fatalf("the failed batch's event was appended: LastSeq %d", s.LastSeq())
	}
	missing := newDoc("t", "zz", base)
	_, err = s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: missing, PrevRev: 1}}})
	wantErr(t, "update of a missing document", err, store.ErrNotFound)
}

// testListPagination: pages in create-time-descending order, tokens that
// survive concurrent creates, a state filter, and bad tokens.
func testListPagination(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	var want []string
	for i := range 7 {
		id := fmt.Sprintf("d%d", i)
		rec := newDoc("t", id, base.Add(time.Duration(i/2)*time.Second)) // pairs share a create time: the id breaks the tie
		if i%2 == 1 {
			rec.Doc.State = gatewayv1.State_SUCCEEDED
		}
		mustCommit(t, s, &store.Batch{Create: rec})
		want = append([]string{id}, want...)
	}
	mustCommit(t, s, &store.Batch{Create: newDoc("u", "other", base.Add(time.Hour))})
	var got []string
	tok := ""
	for page := 0; ; page++ {
		docs, next, err := s.ListDocuments(ctx, "t", store.ListQuery{PageSize: 3, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if len(docs) > 3 || (next != "" && len(docs) != 3) {
			t.Fatalf("page %d has %d documents, next %q", page, len(docs), next)
		}
		got = append(got, ids(docs)...)
		if page == 0 { // a newer document created while paging appears on no later page
			mustCommit(t, s, &store.Batch{Create: newDoc("t", "late", base.Add(time.Minute))})
		}
		if next == "" {
			break
		}
		tok = next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages = %v, want %v", got, want)
	}
	docs, _, err := s.ListDocuments(ctx, "t", store.ListQuery{State: gatewayv1.State_SUCCEEDED})
	if err != nil || !slices.Equal(ids(docs), []string{"d5", "d3", "d1"}) {
		t.Fatalf("SUCCEEDED filter = %v, %v; want d5 d3 d1", ids(docs), err)
	}
	_, next, err := s.ListDocuments(ctx, "t", store.ListQuery{PageSize: 2})
	if err != nil || next == "" {
		t.Fatalf("first page: next %q, %v", next, err)
	}
	_, _, err = s.ListDocuments(ctx, "t", store.ListQuery{PageSize: 2, PageToken: next, State: gatewayv1.State_FAILED})
	wantErr(t, "token of another state filter", err, store.ErrBadPageToken)
	_, _, err = s.ListDocuments(ctx, "t", store.ListQuery{PageToken: "not a token"})
	wantErr(t, "garbage token", err, store.ErrBadPageToken)
}

// testTenantIsolation: another tenant's rows answer ErrNotFound, exactly as
// missing ones, and never appear in its lists.
func testTenantIsolation(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	mustCommit(t, s, &store.Batch{Create: newDoc("a", "d1", base), Claims: []store.ClaimRecord{issued("a", "d1", "11", base.Add(time.Hour))},
		Entities: []store.EntityRecord{{DocID: "d1", Entity: &gatewayv1.Entity{EntityId: 1}}},
		Payloads: []store.PayloadRecord{{DocID: "d1", Kind: store.PayloadContent, Body: []byte("x")}}})
	_, err := s.GetDocument(ctx, "b", "d1", true)
	wantErr(t, "GetDocument of another tenant", err, store.ErrNotFound)
	_, err = s.ListEntities(ctx, "b", "d1")
	wantErr(t, "ListEntities of another tenant", err, store.ErrNotFound)
	_, err = s.GetClaim(ctx, "b", "11")
	wantErr(t, "GetClaim of another tenant", err, store.ErrNotFound)
	_, err = s.GetPayload(ctx, "b", "d1", store.PayloadContent)
	wantErr(t, "GetPayload of another tenant", err, store.ErrNotFound)
	if cs, err := s.ListClaims(ctx, "b", "d1"); err != nil || len(cs) != 0 {
		t.Fatalf("ListClaims of another tenant = %v, %v", cs, err)
	}
	if docs, _, err := s.ListDocuments(ctx, "b", store.ListQuery{}); err != nil || len(docs) != 0 {
		t.Fatalf("ListDocuments of another tenant = %v, %v", ids(docs), err)
	}
	_, err = s.Commit(ctx, &store.Batch{Redeem: &store.RedeemClaim{Tenant: "b", ClaimID: "11", Now: base}})
	wantErr(t, "redeem of another tenant's claim", err, store.ErrNotFound)
	_, err = s.Commit(ctx, &store.Batch{Claims: []store.ClaimRecord{issued("b", "d1", "11", base.Add(time.Hour))}})
	wantErr(t, "claim id owned by another tenant", err, store.ErrConflict)
	if _, docs, err := s.SnapshotDocuments(ctx, "b"); err != nil || len(docs) != 0 {
		t.Fatalf("SnapshotDocuments of another tenant = %v, %v", ids(docs), err)
	}
	upd := newDoc("b", "d1", base)
	upd.Doc.Rev = 2
	_, err = s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: upd, PrevRev: 1}}})
	wantErr(t, "update of another tenant's document", err, store.ErrNotFound)
	if _, err := s.GetDocument(ctx, "a", "d1", true); err != nil {
		t.Fatalf("the owner lost access: %v", err)
	}
	if c, err := s.GetClaim(ctx, "a", "11"); err != nil || c.Claim.GetState() != gatewayv1.ClaimCheck_ISSUED {
		t.Fatalf("the owner's claim after another tenant's attempts: %v, %v", c, err)
	}
}

// testEntities: reads return the highest dispatch attempt's entities,
// ordered by scope, scope instance and entity id; upserts replace.
func testEntities(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	ent := func(scope, id uint32, st gatewayv1.EntityStatus) *gatewayv1.Entity {
		return &gatewayv1.Entity{ScopeId: scope, EntityId: id, Status: st}
	}
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base), Entities: []store.EntityRecord{
		{DocID: "d1", Attempt: 1, Entity: ent(0, 1, gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING)},
		{DocID: "d1", Attempt: 1, Entity: ent(0, 2, gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING)},
	}})
	mustCommit(t, s, &store.Batch{Entities: []store.EntityRecord{
		{DocID: "d1", Attempt: 2, Entity: ent(5, 1, gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING)},
		{DocID: "d1", Attempt: 2, Entity: ent(0, 9, gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING)},
		{DocID: "d1", Attempt: 2, ScopeInstance: 1, Entity: ent(5, 0, gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING)},
	}})
	mustCommit(t, s, &store.Batch{Entities: []store.EntityRecord{ // upsert
		{DocID: "d1", Attempt: 2, Entity: ent(0, 9, gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE)},
	}})
	got, err := s.ListEntities(ctx, "t", "d1")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range got {
		keys = append(keys, fmt.Sprintf("%d/%d:%s", e.GetScopeId(), e.GetEntityId(), e.GetStatus()))
	}
	want := []string{"0/9:ENTITY_STATUS_COMPLETE", "5/1:ENTITY_STATUS_PROCESSING", "5/0:ENTITY_STATUS_PROCESSING"}
	if !slices.Equal(keys, want) {
		t.Fatalf("ListEntities = %v, want %v (attempt 2 only, by scope, instance, id)", keys, want)
	}
	rec, err := s.GetDocument(ctx, "t", "d1", true)
	if err != nil || len(rec.Doc.GetEntities()) != 3 {
		t.Fatalf("GetDocument with entities: %v, %v", rec, err)
	}
	if rec, err := s.GetDocument(ctx, "t", "d1", false); err != nil || len(rec.Doc.GetEntities()) != 0 {
		t.Fatalf("GetDocument without entities: %v, %v", rec, err)
	}
	_, err = s.ListEntities(ctx, "t", "nope")
	wantErr(t, "ListEntities of a missing document", err, store.ErrNotFound)
}

// testNonTerminal: every tenant's non-terminal documents, oldest first.
func testNonTerminal(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	for i, st := range []gatewayv1.State{gatewayv1.State_RUNNING, gatewayv1.State_SUCCEEDED, gatewayv1.State_PENDING,
		gatewayv1.State_FAILED, gatewayv1.State_CANCELLED, gatewayv1.State_PARTIALLY_SUCCEEDED} {
		rec := newDoc(fmt.Sprintf("t%d", i%2), fmt.Sprintf("d%d", i), base.Add(time.Duration(10-i)*time.Second))
		rec.Doc.State = st
		mustCommit(t, s, &store.Batch{Create: rec})
	}
	recs, err := s.ListNonTerminal(ctx)
	if err != nil || !slices.Equal(ids(recs), []string{"d2", "d0"}) {
		t.Fatalf("ListNonTerminal = %v, %v; want d2 d0", ids(recs), err)
	}
}
