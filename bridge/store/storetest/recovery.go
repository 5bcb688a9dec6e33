package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// testSnapshot: the snapshot holds the documents as of its seq, with
// digests and claims; SnapshotBytes grows with documents.
func testSnapshot(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	empty, err := s.SnapshotBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		id := fmt.Sprintf("d%d", i)
		mustCommit(t, s, &store.Batch{Create: newDoc("t", id, base),
			Digests: []store.DigestRecord{{DocID: id, Digest: &gatewayv1.ScopeDigest{ScopeId: 0}}},
			Events:  []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}}})
	}
	mustCommit(t, s, &store.Batch{Claims: []store.ClaimRecord{issued("t", "d1", "3", base)}})
	seq, docs, err := s.SnapshotDocuments(ctx, "t")
	if err != nil || seq != 3 || len(docs) != 3 {
		t.Fatalf("SnapshotDocuments = seq %d, %v, %v; want seq 3, 3 documents", seq, ids(docs), err)
	}
	for _, d := range docs {
		if len(d.Doc.GetDigests()) != 1 || (d.Doc.GetId() == "d1") != (len(d.Doc.GetClaimChecks()) == 1) {
			t.Fatalf("snapshot of %s: digests %v, claims %v", d.Doc.GetId(), d.Doc.GetDigests(), d.Doc.GetClaimChecks())
		}
	}
	if full, err := s.SnapshotBytes(ctx); err != nil || full <= empty {
		t.Fatalf("SnapshotBytes = %d (empty %d), %v", full, empty, err)
	}
	if ws := s.WriterStats(); ws.Transactions < 4 {
		t.Fatalf("WriterStats.Transactions = %d after 4 commits", ws.Transactions)
	}
}

// testCloseRefuses: Close is idempotent and later commits get ErrClosed;
// what was committed before is there after reopening.
func testCloseRefuses(t *testing.T, b Backend) {
	state := b.NewState(t)
	s := b.Open(t, state)
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base), Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", "d1", 1)}}})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := s.Commit(context.Background(), &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "", 1)}}})
	wantErr(t, "Commit after Close", err, store.ErrClosed)
	s2 := b.Open(t, state)
	defer s2.Close()
	if _, err := s2.GetDocument(context.Background(), "t", "d1", false); err != nil || s2.LastSeq() != 1 {
		t.Fatalf("after reopen: %v, LastSeq %d", err, s2.LastSeq())
	}
}

// testCrashRecovery: a store abandoned without Close (as by kill -9) leaves
// its committed documents, claims, events and synced payloads to the next
// store opened on the state; unsynced payloads are gone; seqs continue
// above every seq ever assigned, also after pruning them all.
func testCrashRecovery(t *testing.T, b Backend) {
	ctx := context.Background()
	state := b.NewState(t)
	crashed := b.Open(t, state)
	for i := range 5 {
		id := fmt.Sprintf("d%d", i)
		mustCommit(t, crashed, &store.Batch{Create: newDoc("t", id, base),
			Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}, {Tenant: "t", Event: newEvent("#status", id, 2)}}})
	}
	mustCommit(t, crashed, &store.Batch{Claims: []store.ClaimRecord{issued("t", "d1", "42", base)}})
	writePayload(t, crashed, "d2", store.PayloadContent, []byte("synced"), 4)
	w, err := crashed.CreatePayload(ctx, "d3", store.PayloadContent)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("never synced"))
	if _, err := crashed.PruneEvents(ctx, 11); err != nil {
		t.Fatal(err)
	}
	last := crashed.LastSeq()
	// No Close: the next store opens the state as after a crash. The
	// abandoned one is closed only when the test ends.
	t.Cleanup(func() { crashed.Close() })

	s := b.Open(t, state)
	defer s.Close()
	if s.LastSeq() != last || last != 10 {
		t.Fatalf("LastSeq after reopen = %d, before the crash %d; want 10", s.LastSeq(), last)
	}
	for i := range 5 {
		if _, err := s.GetDocument(ctx, "t", fmt.Sprintf("d%d", i), false); err != nil {
			t.Fatalf("committed document d%d lost: %v", i, err)
		}
	}
	if c, err := s.GetClaim(ctx, "t", "42"); err != nil || c.Claim.GetState() != gatewayv1.ClaimCheck_ISSUED {
		t.Fatalf("committed claim: %v, %v", c, err)
	}
	if got, err := readPayload(t, s, "d2", store.PayloadContent); err != nil || string(got) != "synced" {
		t.Fatalf("synced payload after the crash = %q, %v", got, err)
	}
	_, err = s.OpenPayload(ctx, "d3", store.PayloadContent)
	wantErr(t, "unsynced payload after the crash", err, store.ErrNotFound)
	res := mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "", 1)}}})
	if res.Seqs[0] != last+1 {
		t.Fatalf("first seq after the crash = %d, want %d (never reused)", res.Seqs[0], last+1)
	}
	if st, err := s.EventStats(ctx); err != nil || st.OldestSeq != last+1 || st.Count != 1 {
		t.Fatalf("EventStats after the crash = %+v, %v", st, err)
	}
}
