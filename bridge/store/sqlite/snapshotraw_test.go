package sqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestSnapshotRawMatchesPages: SnapshotRaw returns the same documents as
// SnapshotPages, in pages of the same sizes with the same seq, across
// pages of a store larger than the largest page, for each tenant only its
// own, each body decoding to the stored document and its digests and
// claims attached; its order is the table's (rowids ascending), and
// resuming after a page's last row gives the rest. The documents are
// created with ids descending while their create times ascend, three to a
// create time, committed concurrently: the two orders differ.
func TestSnapshotRawMatchesPages(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
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
			var sizes []int
			var wantSeq uint64
			want := map[string]*gatewayv1.Document{}
			if err := s.SnapshotPages(ctx, tenant, page, func(seq uint64, docs []*store.DocumentRecord) error {
				wantSeq = seq
				sizes = append(sizes, len(docs))
				for _, d := range docs {
					want[d.Doc.GetId()] = d.Doc
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var rows []int64
			var pageEnds []int64
			i := 0
			if err := s.SnapshotRaw(ctx, tenant, store.SnapshotKey{}, page, func(seq uint64, docs []store.RawDocument) error {
				if seq != wantSeq || i >= len(sizes) || len(docs) != sizes[i] {
					t.Fatalf("tenant %s page %d: raw page %d: seq %d, %d documents; want seq %d, pages of %v", tenant, page, i, seq, len(docs), wantSeq, sizes)
				}
				for _, d := range docs {
					if w := want[d.ID]; w == nil {
						t.Fatalf("tenant %s: raw document %s is not in the decoded snapshot (or twice)", tenant, d.ID)
					} else {
						checkRaw(t, d, w)
					}
					delete(want, d.ID)
					if len(rows) > 0 && d.Row <= rows[len(rows)-1] {
						t.Fatalf("tenant %s: row %d after row %d: not in table order", tenant, d.Row, rows[len(rows)-1])
					}
					rows = append(rows, d.Row)
				}
				if len(docs) > 0 {
					pageEnds = append(pageEnds, docs[len(docs)-1].Row)
				}
				i++
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if i != len(sizes) || len(want) != 0 {
				t.Fatalf("tenant %s page %d: %d raw pages, want %d; %d documents missing", tenant, page, i, len(sizes), len(want))
			}
			if len(pageEnds) > 1 { // resume after the first page: the rest, in the same order
				var rest []int64
				if err := s.SnapshotRaw(ctx, tenant, store.SnapshotKey{Row: pageEnds[0]}, page, func(_ uint64, docs []store.RawDocument) error {
					for _, d := range docs {
						rest = append(rest, d.Row)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(rest) != fmt.Sprint(rows[sizes[0]:]) {
					t.Fatalf("tenant %s page %d: resumed after row %d: %d rows, want the %d after it", tenant, page, pageEnds[0], len(rest), len(rows)-sizes[0])
				}
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
	s := openStore(t, t.TempDir(), sqlite.Options{})
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
func commitAll(t *testing.T, s *sqlite.Store, bs []store.Batch) {
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
