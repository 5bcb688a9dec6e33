package pgstore

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestCommitLocksDocumentsInIDOrder: a batch's document updates (the
// flusher lists them in map order) and its child fence are sent in id
// order, the order the lease renewal locks in (renewSQL), so a renewal
// and a commit on the same documents wait on each other instead of
// deadlocking.
func TestCommitLocksDocumentsInIDOrder(t *testing.T) {
	ids := []string{"d7", "d2", "d9", "d1", "d5"}
	b := &store.Batch{}
	for _, id := range ids {
		b.Updates = append(b.Updates, store.DocumentUpdate{PrevRev: 1, Record: &store.DocumentRecord{Tenant: "t",
			Doc: &gatewayv1.Document{Id: id, State: gatewayv1.State_RUNNING, Rev: 2, CreateTime: timestamppb.Now()}}})
	}
	p, err := prepare(b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range p.updates {
		got = append(got, p.updates[i].rec.Doc.GetId())
	}
	if !slices.IsSorted(got) || len(got) != len(ids) {
		t.Fatalf("updates sent in order %v, want all of %v sorted by id", got, ids)
	}
	p.childFence = map[string]int64{"c3": 3, "c1": 1, "c2": 2}
	_, args, n := childFenceStatement(p)
	if fenced := args[1].([]string); n != 3 || !slices.IsSorted(fenced) || args[2].([]int64)[0] != 1 {
		t.Fatalf("child fence ids %v epochs %v, want sorted by id with their epochs", fenced, args[2])
	}
	for name, sql := range map[string]string{"renewSQL": renewSQL, "childFenceSQL": childFenceSQL} {
		if !strings.Contains(sql, "ORDER BY") {
			t.Errorf("%s locks rows without an ORDER BY: %s", name, sql)
		}
	}
}
