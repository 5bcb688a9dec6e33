package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// testSnapshotPages: the snapshot in pages holds every document of the
// tenant exactly once, in (create time, id) order (ties on the create time
// included), with its digests and claims, every page naming the same seq;
// a commit made while the pages are read shows in none of them (one read
// transaction); a tenant without documents gets one empty page.
func testSnapshotPages(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	for i := range 7 {
		id := fmt.Sprintf("p%d", 6-i)                         // ids descending...
		created := base.Add(time.Duration(i/3) * time.Second) // ...three share each create time
		mustCommit(t, s, &store.Batch{Create: newDoc("t", id, created),
			Digests: []store.DigestRecord{{DocID: id, Digest: &gatewayv1.ScopeDigest{ScopeId: 0}}},
			Events:  []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}}})
		mustCommit(t, s, &store.Batch{Create: newDoc("other", "o"+id, created)})
	}
	// (create time, id) order: p6, p5, p4 share the first second, p3, p2,
	// p1 the next, p0 the last; ids ascend within a second.
	mustCommit(t, s, &store.Batch{Claims: []store.ClaimRecord{issued("t", "p2", "22", base)}})
	want := []string{"p4", "p5", "p6", "p1", "p2", "p3", "p0"}
	seq0 := s.LastSeq()
	var got []string
	var sizes []int
	err := s.SnapshotPages(ctx, "t", 3, func(seq uint64, docs []*store.DocumentRecord) error {
		if seq != seq0 {
			t.Errorf("page at seq %d, want %d", seq, seq0)
		}
		if len(got) == 0 { // a commit during the read is in no page
			mustCommit(t, s, &store.Batch{Create: newDoc("t", "late", base),
				Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "late", 1)}}})
		}
		sizes = append(sizes, len(docs))
		for _, d := range docs {
			got = append(got, d.Doc.GetId())
			if len(d.Doc.GetDigests()) != 1 || (d.Doc.GetId() == "p2") != (len(d.Doc.GetClaimChecks()) == 1) || d.Tenant != "t" {
				t.Errorf("%s: tenant %q, digests %v, claims %v", d.Doc.GetId(), d.Tenant, d.Doc.GetDigests(), d.Doc.GetClaimChecks())
			}
		}
		return nil
	})
	if err != nil || !slices.Equal(got, want) || !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Fatalf("SnapshotPages = %v in pages %v, %v; want %v in pages [3 3 1]", got, sizes, err, want)
	}
	calls := 0
	if err := s.SnapshotPages(ctx, "nobody", 3, func(seq uint64, docs []*store.DocumentRecord) error {
		calls++
		if len(docs) != 0 || seq != s.LastSeq() {
			t.Errorf("empty tenant: %d documents at seq %d", len(docs), seq)
		}
		return nil
	}); err != nil || calls != 1 {
		t.Fatalf("empty tenant: %d calls, %v; want one empty page", calls, err)
	}
}

// testEventMeta: EachEventMeta lists every retained event's seq, time and
// size (what ReadEvents reports), in order, after a prune.
func testEventMeta(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	for i := range 5 {
		mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#status", fmt.Sprintf("d%d", i), 2)}}})
	}
	if _, err := s.PruneEvents(ctx, 3); err != nil {
		t.Fatal(err)
	}
	recs, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	err = s.EachEventMeta(ctx, func(seq uint64, tm time.Time, size int) error {
		if i >= len(recs) || seq != recs[i].Seq || !tm.Equal(recs[i].Time) || size != recs[i].Size() {
			t.Errorf("meta %d: seq %d time %v size %d", i, seq, tm, size)
		}
		i++
		return nil
	})
	if err != nil || i != len(recs) || len(recs) != 3 {
		t.Fatalf("EachEventMeta: %d events, ReadEvents %d, %v; want 3", i, len(recs), err)
	}
	// Ranges of width 2 from seq 1: [1,3) holds none (pruned), [3,5)
	// holds 3 and 4, [5,7) holds 5.
	var got []store.EventRange
	if err := s.EachEventRange(ctx, 1, 5, 2, func(r store.EventRange) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].First != 3 || got[0].Last != 4 || got[0].Count != 2 ||
		got[0].Bytes != uint64(recs[0].Size()+recs[1].Size()) || !got[0].Oldest.Equal(recs[0].Time) || !got[0].Newest.Equal(recs[1].Time) ||
		got[1].First != 5 || got[1].Last != 5 || got[1].Count != 1 {
		t.Fatalf("EachEventRange = %+v", got)
	}
}
