package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/randdoc"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// pagesOnly hides the SQLite store's SnapshotRaw: the event log then
// encodes decoded pages itself (the path of a backend without it).
type pagesOnly struct{ bridge.Store }

// TestStreamSnapshotEncodedMatchesDecoded: the chunks StreamSnapshotEncoded
// assembles from stored bytes hold exactly the documents StreamSnapshot
// sends (decoded, named by publicDoc), document for document, in chunks
// of the same sizes with the same seq and final chunk, for randomized
// documents with digests and claims in three tenants, in pages smaller
// than the store, with the SQLite store's raw read (table order) and with
// the fallback that encodes decoded pages (create-time order); resumed
// after a chunk's position, it sends exactly the chunks after it (the
// REST page form). SNAPSHOT_SEED replays a seed.
func TestStreamSnapshotEncodedMatchesDecoded(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("SNAPSHOT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: SNAPSHOT_SEED=%d)", seed, seed)
	for _, raw := range []bool{true, false} {
		t.Run(fmt.Sprintf("raw=%v", raw), func(t *testing.T) {
			sq, err := sqlite.Open(context.Background(), t.TempDir(), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			counts := loadRandom(t, sq, rand.New(rand.NewPCG(seed, 1)), 150)
			var st bridge.Store = sq
			if !raw {
				st = pagesOnly{sq}
			}
			e := newEnv(t, withBridgeOpts(func(o *bridge.Options) { o.Store = st }))
			e.waitReady()
			for tenant, n := range counts {
				for _, page := range []int{7, 0} {
					slow, fast := snapshotBoth(t, e.b, bridge.Tenant(tenant), page)
					compareSnapshots(t, fmt.Sprintf("tenant %q page %d (seed %d)", tenant, page, seed), slow, fast.chunks, n)
					if raw { // the raw read, not the fallback: table order, which is commit order here
						checkCommitOrder(t, fast.chunks)
					}
					checkResume(t, e.b, bridge.Tenant(tenant), page, fast)
				}
			}
		})
	}
}

// checkCommitOrder: the documents come in the order loadRandom committed
// them (ids ascending), the SQLite table's order; the decoded path's
// create-time order is a random one here.
func checkCommitOrder(t *testing.T, chunks []*gatewayv1.SnapshotChunk) {
	t.Helper()
	prev := ""
	for _, c := range chunks {
		for _, d := range c.GetDocuments() {
			if d.GetId() <= prev {
				t.Fatalf("document %s after %s: not the table's order (did the raw read run?)", d.GetId(), prev)
			}
			prev = d.GetId()
		}
	}
}

// compareSnapshots fails unless the two snapshots have chunks of the same
// sizes, seqs and final chunk, and the same documents (by id, compared
// encoded).
func compareSnapshots(t *testing.T, what string, slow, fast []*gatewayv1.SnapshotChunk, n int) {
	t.Helper()
	if len(slow) != len(fast) {
		t.Fatalf("%s: %d chunks decoded, %d encoded", what, len(slow), len(fast))
	}
	want, got := map[string]*gatewayv1.Document{}, map[string]*gatewayv1.Document{}
	for i := range slow {
		s, f := slow[i], fast[i]
		if len(s.GetDocuments()) != len(f.GetDocuments()) || s.GetSeq() != f.GetSeq() || s.GetLast() != f.GetLast() || s.GetTotalDocuments() != f.GetTotalDocuments() {
			t.Fatalf("%s: chunk %d: decoded seq %d, %d documents, last %v, total %d; encoded seq %d, %d, %v, %d", what, i,
				s.GetSeq(), len(s.GetDocuments()), s.GetLast(), s.GetTotalDocuments(), f.GetSeq(), len(f.GetDocuments()), f.GetLast(), f.GetTotalDocuments())
		}
		for _, d := range s.GetDocuments() {
			want[d.GetId()] = d
		}
		for _, d := range f.GetDocuments() {
			if got[d.GetId()] != nil {
				t.Fatalf("%s: document %s twice", what, d.GetId())
			}
			got[d.GetId()] = d
		}
	}
	if len(want) != n || len(got) != n || slow[len(slow)-1].GetTotalDocuments() != uint64(n) {
		t.Fatalf("%s: %d documents decoded, %d encoded, total %d; want %d", what, len(want), len(got), slow[len(slow)-1].GetTotalDocuments(), n)
	}
	for id, w := range want {
		if !sameMessage(t, w, got[id]) {
			t.Fatalf("%s: document %s:\n decoded %v\n encoded %v", what, id, w, got[id])
		}
	}
}

// loadRandom commits n random terminal documents with digests and claims
// spread over three tenants (one #document event each) and returns how
// many each tenant has.
func loadRandom(t *testing.T, sq *sqlite.Store, r *rand.Rand, n int) map[string]int {
	t.Helper()
	tenants := []string{"", "acme", "zeta"}
	counts := map[string]int{"nobody": 0}
	// Now, not a fixed date: the claims expire an hour after creation, and
	// a claim past its expiry may be swept to EXPIRED between the two
	// paths' reads (the comparison then sees a real change, not a bug).
	base := time.Now().UTC().Truncate(time.Second)
	var claimID uint64
	for i := range n {
		tenant := tenants[r.IntN(len(tenants))]
		id := fmt.Sprintf("doc-%04d", i)
		created := base.Add(time.Duration(r.IntN(n/2)) * time.Second) // equal create times: id breaks the tie
		d := randdoc.Document(r, id, created)
		b := &store.Batch{Create: &store.DocumentRecord{Tenant: tenant, Doc: d, BodyHash: []byte(id)},
			Events: []store.EventAppend{{Tenant: tenant, Event: &gatewayv1.Event{Time: timestamppb.New(created), Kind: "#document", DocumentId: id, Rev: d.GetRev()}}}}
		for j, g := range randdoc.Digests(r) {
			b.Digests = append(b.Digests, store.DigestRecord{DocID: id, Digest: g, ScopeInstance: uint32(j)})
		}
		for _, c := range randdoc.Claims(r, id, created, &claimID) {
			b.Claims = append(b.Claims, store.ClaimRecord{Tenant: tenant, Claim: c})
		}
		if _, err := sq.Commit(context.Background(), b); err != nil {
			t.Fatalf("commit %s: %v", id, err)
		}
		counts[tenant]++
	}
	return counts
}

// encodedSnapshot is StreamSnapshotEncoded's chunks, decoded, with the
// position after each.
type encodedSnapshot struct {
	chunks []*gatewayv1.SnapshotChunk
	next   []bridge.SnapshotPosition
}

// snapshotBoth streams tenant's snapshot decoded and encoded.
func snapshotBoth(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, page int) (slow []*gatewayv1.SnapshotChunk, fast encodedSnapshot) {
	t.Helper()
	if err := b.Events().StreamSnapshot(context.Background(), tenant, page, func(c *gatewayv1.SnapshotChunk) error {
		slow = append(slow, proto.CloneOf(c))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return slow, streamEncoded(t, b, tenant, page, bridge.SnapshotPosition{})
}

// streamEncoded streams tenant's encoded snapshot from after pos.
func streamEncoded(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, page int, pos bridge.SnapshotPosition) (out encodedSnapshot) {
	t.Helper()
	if err := b.Events().StreamSnapshotEncoded(context.Background(), tenant, page, pos, func(chunk []byte, next bridge.SnapshotPosition) error {
		c := new(gatewayv1.SnapshotChunk)
		if err := proto.Unmarshal(chunk, c); err != nil {
			return err
		}
		if len(c.ProtoReflect().GetUnknown()) > 0 {
			return fmt.Errorf("encoded chunk has unknown fields: %x", c.ProtoReflect().GetUnknown())
		}
		out.chunks, out.next = append(out.chunks, c), append(out.next, next)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkResume: resumed after the position that came with chunk k, the
// encoded snapshot sends exactly the documents of the chunks after k, in
// the same order, and the same final chunk (after the last document: the
// final chunk alone).
func checkResume(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, page int, full encodedSnapshot) {
	t.Helper()
	ids := func(cs []*gatewayv1.SnapshotChunk) (out []string) {
		for _, c := range cs {
			for _, d := range c.GetDocuments() {
				out = append(out, d.GetId())
			}
		}
		return out
	}
	n := len(full.chunks)
	for _, k := range []int{0, n / 2, n - 2} {
		if k < 0 || k >= n-1 {
			continue
		}
		got := streamEncoded(t, b, tenant, page, full.next[k])
		last := got.chunks[len(got.chunks)-1]
		if fmt.Sprint(ids(got.chunks)) != fmt.Sprint(ids(full.chunks[k+1:])) || !last.GetLast() || last.GetSeq() != full.chunks[0].GetSeq() {
			t.Fatalf("tenant %q after chunk %d of %d: got %v (last %v), want %v", tenant, k, n, ids(got.chunks), last, ids(full.chunks[k+1:]))
		}
	}
}

// sameMessage compares deterministic encodings (proto.Equal fails on
// NaN, which the random documents carry).
func sameMessage(t *testing.T, a, b proto.Message) bool {
	t.Helper()
	opt := proto.MarshalOptions{Deterministic: true}
	x, err1 := opt.Marshal(a)
	y, err2 := opt.Marshal(b)
	if err1 != nil || err2 != nil {
		t.Fatalf("marshal: %v %v", err1, err2)
	}
	return bytes.Equal(x, y)
}
