package pgstore

import (
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
)

// TestCollectGroupRowsMergesOnlyCommutingRows checks when a group's entity
// and payload rows go as multi-row statements: distinct keys of existing or
// earlier-created documents merge; a repeated key, or a row of a document a
// later batch creates, keeps the batches' own statements (queue order).
func TestCollectGroupRowsMergesOnlyCommutingRows(t *testing.T) {
	create := func(id string) *store.DocumentRecord {
		return &store.DocumentRecord{Tenant: "acme", Doc: &gatewayv1.Document{Id: id, Rev: 1, CreateTime: timestamppb.Now()}}
	}
	ent := func(doc string, id uint32) store.EntityRecord {
		return store.EntityRecord{DocID: doc, Entity: &gatewayv1.Entity{EntityId: id}}
	}
	pay := func(doc string, body []byte) store.PayloadRecord {
		return store.PayloadRecord{DocID: doc, Kind: store.PayloadContent, Body: body}
	}
	group := func(bs ...*store.Batch) []*prepared {
		ps := make([]*prepared, len(bs))
		for i, b := range bs {
			p, err := prepare(b)
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = p
		}
		return ps
	}
	for _, c := range []struct {
		name  string
		ps    []*prepared
		merge bool
	}{
		{"distinct rows", group(&store.Batch{Create: create("a"), Payloads: []store.PayloadRecord{pay("a", []byte("x"))}},
			&store.Batch{Entities: []store.EntityRecord{ent("a", 1), ent("b", 1)}, Payloads: []store.PayloadRecord{pay("b", nil)}}), true},
		{"repeated entity", group(&store.Batch{Entities: []store.EntityRecord{ent("a", 1)}},
			&store.Batch{Entities: []store.EntityRecord{ent("a", 1)}}), false},
		{"payload written and deleted", group(&store.Batch{Payloads: []store.PayloadRecord{pay("a", []byte("x"))}},
			&store.Batch{Payloads: []store.PayloadRecord{pay("a", nil)}}), false},
		{"entity before its document's create", group(&store.Batch{Entities: []store.EntityRecord{ent("c", 1)}},
			&store.Batch{Create: create("c")}), false},
		{"payload before its document's create", group(&store.Batch{Payloads: []store.PayloadRecord{pay("c", []byte("x"))}},
			&store.Batch{Create: create("c")}), false},
	} {
		g, merged := collectGroupRows(c.ps)
		if merged != c.merge {
			t.Errorf("%s: merged %v, want %v", c.name, merged, c.merge)
		}
		if merged && (g.nEnts != 2 || len(g.putDoc) != 1 || len(g.delDoc) != 1) {
			t.Errorf("%s: %d entities, %d payload writes, %d deletes; want 2, 1, 1", c.name, g.nEnts, len(g.putDoc), len(g.delDoc))
		}
	}
}

// TestConcatBodiesOffsets: each body is the substring its 1-based offset
// and length name (upsertPayloadsSQL), empty bodies included.
func TestConcatBodiesOffsets(t *testing.T) {
	bodies := [][]byte{[]byte("abc"), {}, []byte("d"), make([]byte, 5000), []byte("ef")}
	all, offs, lens := concatBodies(bodies)
	for i, b := range bodies {
		got := all[offs[i]-1 : offs[i]-1+lens[i]]
		if string(got) != string(b) {
			t.Errorf("body %d: offset %d length %d gives %q, want %q", i, offs[i], lens[i], got, b)
		}
	}
	if len(all) != 5006 {
		t.Errorf("%d octets in all, want 5006", len(all))
	}
}

// TestCollectGroupRowsBoundsMergedPayloadBytes: a group whose inline
// payloads sum to more than maxMergedPayloadBytes keeps the batches' own
// statements.
func TestCollectGroupRowsBoundsMergedPayloadBytes(t *testing.T) {
	big := make([]byte, maxMergedPayloadBytes/2+1)
	var ps []*prepared
	for _, id := range []string{"a", "b"} {
		p, err := prepare(&store.Batch{Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadContent, Body: big}}})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if _, merged := collectGroupRows(ps[:1]); !merged {
		t.Fatal("one payload under the bound: not merged")
	}
	if _, merged := collectGroupRows(ps); merged {
		t.Fatalf("payloads of %d octets in all merged, bound %d", 2*len(big), maxMergedPayloadBytes)
	}
}
