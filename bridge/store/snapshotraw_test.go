package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestSnapshotRawMatchesPages: SnapshotRaw returns the same documents as
// SnapshotPages, page for page and in the same (create_time, id) order,
// across pages of a store larger than the largest page (ties of create
// time broken by id), for each tenant only its own, each body decoding to
// the stored document and its digests and claims attached.
func TestSnapshotRawMatchesPages(t *testing.T) {
	s := openStore(t, t.TempDir(), store.Options{})
	ctx := context.Background()
	const n = 12_345
	var batch []store.Batch
	for i := range n {
		tenant := "t"
		if i%7 == 3 {
			tenant = "other"
		}
		id := fmt.Sprintf("d%05d", n-i)                                     // ids descending while times ascend
		rec := newDoc(tenant, id, base.Add(time.Duration(i/3)*time.Second)) // three documents a create time
		b := store.Batch{Create: rec, Events: []store.EventAppend{{Tenant: tenant, Event: newEvent("#document", id, 1)}}}
		if i%1000 == 0 {
			b.Digests = []store.DigestRecord{{DocID: id, Digest: &gatewayv1.ScopeDigest{ScopeId: 1, MerkleRoot: id}}}
			b.Claims = []store.ClaimRecord{{Tenant: tenant, Claim: &gatewayv1.ClaimCheck{ClaimId: fmt.Sprint(i + 1), DocumentId: id,
				State: gatewayv1.ClaimCheck_ISSUED, ExpireTime: rec.Doc.CreateTime, CreateTime: rec.Doc.CreateTime}}}
		}
		batch = append(batch, b)
	}
	commitAll(t, s, batch)
	for _, tenant := range []string{"t", "other", "nobody"} {
		for _, page := range []int{10000, 999} {
			var want [][]*store.DocumentRecord
			var wantSeq uint64
			if err := s.SnapshotPages(ctx, tenant, page, func(seq uint64, docs []*store.DocumentRecord) error {
				wantSeq = seq
				want = append(want, docs)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			i := 0
			if err := s.SnapshotRaw(ctx, tenant, store.SnapshotKey{}, page, func(seq uint64, docs []store.RawDocument) error {
				if seq != wantSeq || i >= len(want) || len(docs) != len(want[i]) {
					t.Fatalf("tenant %s page %d: raw page %d: seq %d, %d documents; want seq %d, %d pages", tenant, page, i, seq, len(docs), wantSeq, len(want))
				}
				for j, d := range docs {
					checkRaw(t, d, want[i][j].Doc)
				}
				i++
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if i != len(want) {
				t.Fatalf("tenant %s page %d: %d raw pages, want %d", tenant, page, i, len(want))
			}
		}
	}
}

// checkRaw fails unless d is the stored form of want: the body decodes
// to want without its digests and claims, which d carries beside it.
func checkRaw(t *testing.T, d store.RawDocument, want *gatewayv1.Document) {
	t.Helper()
	got := new(gatewayv1.Document)
	if err := proto.Unmarshal(d.Body, got); err != nil {
		t.Fatalf("%s: %v", d.ID, err)
	}
	for _, b := range d.Digests {
		g := new(gatewayv1.ScopeDigest)
		if err := proto.Unmarshal(b, g); err != nil {
			t.Fatal(err)
		}
		got.Digests = append(got.Digests, g)
	}
	got.ClaimChecks = d.Claims
	if d.ID != want.GetId() || !proto.Equal(got, want) {
		t.Fatalf("raw document %s:\n got %v\nwant %v", d.ID, got, want)
	}
}

// TestSnapshotRawConsistentWhileWritten: changes committed while a raw
// snapshot is being read (after its first page) are not in it: a later
// page shows the documents as of the snapshot's seq (old rev, old
// digests), a document created meanwhile is absent, and every page names
// the seq from before the changes.
func TestSnapshotRawConsistentWhileWritten(t *testing.T) {
	s := openStore(t, t.TempDir(), store.Options{})
	ctx := context.Background()
	var batch []store.Batch
	for i := range 50 {
		id := fmt.Sprintf("d%02d", i)
		batch = append(batch, store.Batch{Create: newDoc("t", id, base.Add(time.Duration(i)*time.Second)),
			Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}}})
	}
	commitAll(t, s, batch)
	seq0 := s.LastSeq()
	var seqs []uint64
	seen := map[string]uint64{}
	err := s.SnapshotRaw(ctx, "t", store.SnapshotKey{}, 10, func(seq uint64, docs []store.RawDocument) error {
		seqs = append(seqs, seq)
		for _, d := range docs {
			var doc gatewayv1.Document
			if err := proto.Unmarshal(d.Body, &doc); err != nil {
				return err
			}
			seen[d.ID] = doc.GetRev()
			if d.ID == "d46" && len(d.Digests) != 0 {
				t.Errorf("d46 has %d digests in the snapshot, committed after it started", len(d.Digests))
			}
		}
		if len(seqs) == 1 { // change a document of a later page, add one, add a digest
			upd := newDoc("t", "d45", base.Add(45*time.Second))
			upd.Doc.Rev, upd.Doc.State = 2, gatewayv1.State_RUNNING
			mustCommit(t, s, &store.Batch{Updates: []store.DocumentUpdate{{Record: upd, PrevRev: 1}},
				Digests: []store.DigestRecord{{DocID: "d46", Digest: &gatewayv1.ScopeDigest{ScopeId: 9}}},
				Events:  []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "d45", 2)}}})
			mustCommit(t, s, &store.Batch{Create: newDoc("t", "d99", base.Add(time.Hour)),
				Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "d99", 1)}}})
			if s.LastSeq() != seq0+2 {
				t.Fatalf("LastSeq %d after two commits from %d", s.LastSeq(), seq0)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, sq := range seqs {
		if sq != seq0 {
			t.Errorf("page %d names seq %d, want %d (the seq before the changes)", i, sq, seq0)
		}
	}
	if len(seen) != 50 || seen["d45"] != 1 {
		t.Errorf("snapshot: %d documents, d45 at rev %d; want 50, rev 1 (d99 absent: %v)", len(seen), seen["d45"], seen["d99"] > 0)
	}
}

// commitAll commits the batches on 16 goroutines (grouped by the writer).
func commitAll(t *testing.T, s *store.Store, bs []store.Batch) {
	t.Helper()
	errs := make(chan error, len(bs))
	sem := make(chan struct{}, 16)
	for i := range bs {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := s.Commit(context.Background(), &bs[i])
			errs <- err
		}()
	}
	for range bs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
