package gateway

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/randdoc"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestSnapshotJSONMatchesProtojson: the snapshot's hand-written JSON
// encoding of a chunk is the REST marshaler's (protojson with
// EmitUnpopulated), value for value, for randomized documents with
// digests and named claims: every field, default or set, strings with
// JSON specials and multi-byte UTF-8, timestamps with 0-9 fraction digits,
// NaN, infinities and exponent-form floats, unknown enum numbers.
// (protojson's output is not byte-stable on purpose, so the two are
// compared as decoded JSON values.) SNAPSHOT_SEED replays a seed.
func TestSnapshotJSONMatchesProtojson(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("SNAPSHOT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: SNAPSHOT_SEED=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 2))
	m := restMarshaler()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	var claimID uint64
	for round := range 200 {
		c := &gatewayv1.SnapshotChunk{Seq: r.Uint64(), Last: r.IntN(2) == 0, TotalDocuments: r.Uint64N(1 << 50)}
		for i := range r.IntN(5) {
			id := fmt.Sprintf("d-%d-%d", round, i)
			d := randdoc.Document(r, id, base.Add(time.Duration(r.Int64N(1<<50))))
			d.Name = "documents/" + id
			if r.IntN(10) == 0 {
				d.State = gatewayv1.State(99) // a value without a name: a number
			}
			d.Digests = randdoc.Digests(r)
			d.ClaimChecks = randdoc.Claims(r, id, base, &claimID)
			for _, cl := range d.ClaimChecks {
				cl.Name = "claims/" + cl.ClaimId
			}
			c.Documents = append(c.Documents, d)
		}
		got, ok := appendChunkJSON(nil, c)
		if !ok {
			t.Fatalf("round %d: the appender refused a valid chunk (seed %d)", round, seed)
		}
		want, err := m.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("round %d: not JSON: %v\n%s", round, err, got)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("round %d (seed %d):\n got %s\nwant %s", round, seed, got, want)
		}
	}
}

// TestSnapshotJSONRefuses: what protojson would refuse or render
// otherwise makes the appender return false (the caller falls back to
// protojson for the chunk): a string that is not UTF-8, a timestamp out
// of protojson's range, entities (never in a snapshot).
func TestSnapshotJSONRefuses(t *testing.T) {
	for name, d := range map[string]*gatewayv1.Document{
		"invalid UTF-8":    {Id: "d", DisplayName: "a\xffb"},
		"year 10000":       {Id: "d", CreateTime: &timestamppb.Timestamp{Seconds: maxTimestampSeconds + 1}},
		"negative nanos":   {Id: "d", UpdateTime: &timestamppb.Timestamp{Nanos: -1}},
		"entities present": {Id: "d", Entities: []*gatewayv1.Entity{{EntityId: 1}}},
	} {
		if _, ok := appendDocumentJSON(nil, d); ok {
			t.Errorf("%s: appended, want refused", name)
		}
	}
	if _, ok := appendDocumentJSON(nil, &gatewayv1.Document{Id: "d", DisplayName: "ok é\u2028"}); !ok {
		t.Error("a valid document was refused")
	}
}

// TestDocumentAnswerMatchesProtojson: the REST mux's marshaler writes a
// Document (the answer of submit, get, cancel) with the hand encoder, the
// same JSON value as protojson (the marshaler without the cache), for
// randomized documents; one with entities, an invalid UTF-8 string or an
// unknown state goes through protojson and still matches.
// SNAPSHOT_SEED replays a seed.
func TestDocumentAnswerMatchesProtojson(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("SNAPSHOT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: SNAPSHOT_SEED=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 3))
	plain := restMarshaler()
	m := withEventCache(restMarshaler(), &eventCache{})
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	var claimID uint64
	hand := 0
	for round := range 300 {
		id := fmt.Sprintf("d-%d", round)
		d := randdoc.Document(r, id, base.Add(time.Duration(r.Int64N(1<<50))))
		d.Name = "documents/" + id
		switch r.IntN(10) {
		case 0:
			d.State = gatewayv1.State(99)
		case 1:
			d.DisplayName = "a\xffb"
		case 2:
			d.Entities = []*gatewayv1.Entity{{EntityId: 1, ScopeId: 2}}
		}
		d.Digests = randdoc.Digests(r)
		d.ClaimChecks = randdoc.Claims(r, id, base, &claimID)
		if _, ok := appendDocumentJSON(nil, d); ok {
			hand++
		}
		got, gerr := m.Marshal(d)
		want, werr := plain.Marshal(d)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("round %d (seed %d): error %v, protojson's %v", round, seed, gerr, werr)
		}
		if werr != nil {
			continue
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("round %d: not JSON: %v\n%s", round, err, got)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("round %d (seed %d):\n got %s\nwant %s", round, seed, got, want)
		}
	}
	if hand < 150 {
		t.Fatalf("the hand encoder took %d of 300 documents (seed %d)", hand, seed)
	}
}
