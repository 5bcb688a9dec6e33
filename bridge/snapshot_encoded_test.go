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
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// pagesOnly hides the SQLite store's SnapshotRaw: the event log then
// encodes decoded pages itself (the path of a backend without it).
type pagesOnly struct{ bridge.Store }

// TestStreamSnapshotEncodedMatchesDecoded: the chunks StreamSnapshotEncoded
// assembles from stored bytes decode to exactly the chunks StreamSnapshot
// sends (decoded documents named by publicDoc), document for document, for
// randomized documents with digests and claims in three tenants, in pages
// smaller than the store, with the SQLite store's raw read and with the
// fallback that encodes decoded pages; resumed after a document's
// position, it sends exactly the documents after it (the REST page form).
// SNAPSHOT_SEED replays a seed.
func TestStreamSnapshotEncodedMatchesDecoded(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("SNAPSHOT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: SNAPSHOT_SEED=%d)", seed, seed)
	for _, raw := range []bool{true, false} {
		t.Run(fmt.Sprintf("raw=%v", raw), func(t *testing.T) {
			sq, err := store.Open(context.Background(), t.TempDir(), store.Options{})
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
					if len(slow) != len(fast) {
						t.Fatalf("tenant %q page %d: %d chunks decoded, %d encoded", tenant, page, len(slow), len(fast))
					}
					docs := 0
					for i := range slow {
						docs += len(slow[i].GetDocuments())
						if !sameMessage(t, slow[i], fast[i]) {
							t.Fatalf("tenant %q page %d chunk %d (seed %d):\n decoded %v\n encoded %v", tenant, page, i, seed, slow[i], fast[i])
						}
					}
					if docs != n || slow[len(slow)-1].GetTotalDocuments() != uint64(n) {
						t.Fatalf("tenant %q: %d documents, total %d, want %d", tenant, docs, slow[len(slow)-1].GetTotalDocuments(), n)
					}
					checkResume(t, e.b, bridge.Tenant(tenant), page, slow)
				}
			}
		})
	}
}

// loadRandom commits n random terminal documents with digests and claims
// spread over three tenants (one #document event each) and returns how
// many each tenant has.
func loadRandom(t *testing.T, sq *store.Store, r *rand.Rand, n int) map[string]int {
	t.Helper()
	tenants := []string{"", "acme", "zeta"}
	counts := map[string]int{"nobody": 0}
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
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

// snapshotBoth streams tenant's snapshot decoded and encoded (decoding
// the encoded chunks).
func snapshotBoth(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, page int) (slow, fast []*gatewayv1.SnapshotChunk) {
	t.Helper()
	ctx := context.Background()
	if err := b.Events().StreamSnapshot(ctx, tenant, page, func(c *gatewayv1.SnapshotChunk) error {
		slow = append(slow, proto.CloneOf(c))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Events().StreamSnapshotEncoded(ctx, tenant, page, bridge.SnapshotPosition{}, func(chunk []byte) error {
		c := new(gatewayv1.SnapshotChunk)
		if err := proto.Unmarshal(chunk, c); err != nil {
			return err
		}
		if len(c.ProtoReflect().GetUnknown()) > 0 {
			return fmt.Errorf("encoded chunk has unknown fields: %x", c.ProtoReflect().GetUnknown())
		}
		fast = append(fast, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return slow, fast
}

// checkResume: StreamSnapshotEncoded after a document's position sends
// exactly the documents that follow it in the full snapshot, for a
// position in the middle, the last document's and one past every
// document (none, with the final chunk).
func checkResume(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, page int, full []*gatewayv1.SnapshotChunk) {
	t.Helper()
	var all []*gatewayv1.Document
	for _, c := range full {
		all = append(all, c.GetDocuments()...)
	}
	if len(all) == 0 {
		return
	}
	for _, i := range []int{len(all) / 2, len(all) - 1} {
		d := all[i]
		pos := bridge.SnapshotPosition{CreateTime: d.GetCreateTime().AsTime().UnixNano(), ID: d.GetId()}
		var got []string
		var last *gatewayv1.SnapshotChunk
		if err := b.Events().StreamSnapshotEncoded(context.Background(), tenant, page, pos, func(chunk []byte) error {
			c := new(gatewayv1.SnapshotChunk)
			if err := proto.Unmarshal(chunk, c); err != nil {
				return err
			}
			for _, d := range c.GetDocuments() {
				got = append(got, d.GetId())
			}
			last = c
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, d := range all[i+1:] {
			want = append(want, d.GetId())
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || !last.GetLast() || last.GetSeq() != full[0].GetSeq() {
			t.Fatalf("tenant %q after document %d of %d: got %v (last chunk %v), want %v", tenant, i, len(all), got, last, want)
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
