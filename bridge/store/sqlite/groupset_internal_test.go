package sqlite

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

var groupSetSeed = flag.Uint64("groupset.seed", 0, "seed of TestSetPathMatchesRowByRow (0: from the clock)")

// TestSetPathMatchesRowByRow runs one seeded, generated workload of groups
// through two stores, one with the set path (groupset.go) and one running
// every batch row by row, handing both the same groups: creates (some
// repeating an id or a request id), updates (some with a stale revision,
// some chained on a document the group created or updated), entity
// upserts, inline payload puts and deletes (some for a document the group
// creates later, which the foreign key refuses), events, and now and then a
// claim (which the set path leaves to the row-by-row run). Every batch must
// get the same outcome from both (error text, seqs, duplicate), and the
// stores must end with the same rows in every table. A failing run prints
// its seed; -groupset.seed replays it.
func TestSetPathMatchesRowByRow(t *testing.T) {
	seed := *groupSetSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run TestSetPathMatchesRowByRow -groupset.seed %d)", seed, seed)
	ctx := context.Background()
	open := func(o Options) *Store {
		s, err := Open(ctx, t.TempDir(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	set, row := open(Options{}), open(RowByRow(Options{}))
	g := &setWorkload{rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), revs: map[string]uint64{}}
	for round := range 100 {
		n := 1 + g.rng.IntN(12)
		if round%25 == 7 {
			n = maxRowsPerStmt + 10 // more creates than one statement takes
		}
		batches := g.group(n)
		ra, rb := runSetGroup(t, set, batches), runSetGroup(t, row, batches)
		for i := range batches {
			a, b := ra[i], rb[i]
			if fmt.Sprint(a.err) != fmt.Sprint(b.err) || !reflect.DeepEqual(a.res.Seqs, b.res.Seqs) || (a.res.Duplicate == nil) != (b.res.Duplicate == nil) {
				t.Fatalf("seed %d round %d batch %d: set path %v seqs %v dup %v; row by row %v seqs %v dup %v",
					seed, round, i, a.err, a.res.Seqs, a.res.Duplicate != nil, b.err, b.res.Seqs, b.res.Duplicate != nil)
			}
		}
		if a, b := dumpTables(t, set), dumpTables(t, row); !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d round %d: the stores differ:\nset path   %v\nrow by row %v", seed, round, a, b)
		}
		g.learn(row)
	}
	setRuns, rowRuns := set.WriterStats().Statements, row.WriterStats().Statements
	t.Logf("statements: set path %d, row by row %d", setRuns, rowRuns)
	if setRuns >= rowRuns {
		t.Fatalf("the set path never applied (%d statements, row by row %d)", setRuns, rowRuns)
	}
	if setRuns >= rowRuns {
		t.Fatalf("the set path ran %d statements, row by row %d: it never applied", setRuns, rowRuns)
	}
}

// runSetGroup commits batches as exactly one group: it runs the group on
// the test's goroutine, which is safe because nothing is ever queued to
// s's writer goroutine (it idles until Close).
func runSetGroup(t *testing.T, s *Store, batches []*store.Batch) []*request {
	t.Helper()
	reqs := make([]*request, len(batches))
	for i, b := range batches {
		reqs[i] = mustPrepare(t, b)
	}
	s.runGroup(reqs)
	return reqs
}

// setWorkload generates groups from what the stores hold (learn).
type setWorkload struct {
	rng     *rand.Rand
	revs    map[string]uint64 // stored documents and their revisions
	ids     int
	fault   setFault // this group's kind of failing batch
	touched []string // documents the group being generated created or updated
}

// setFault is the kind of failing batch a group carries (at most one kind
// per group, so that each is seen alone; the batches of that kind fail, the
// others commit).
type setFault int

const (
	faultNone   setFault = iota
	faultDupID           // a create of an id in use: ErrConflict
	faultDupReq          // creates reusing request ids: a duplicate or ErrConflict
	faultStale           // an update expecting another revision: ErrStaleRev
	faultClaim           // a claim (the set path leaves the group to the row-by-row run)
	faultEarly           // a payload of a document the group creates later: the foreign key refuses it
	faultCount
)

func (g *setWorkload) learn(s *Store) {
	rows, err := s.rdb.Query("SELECT id, rev FROM documents")
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	clear(g.revs)
	for rows.Next() {
		var id string
		var rev uint64
		if err := rows.Scan(&id, &rev); err != nil {
			panic(err)
		}
		g.revs[id] = rev
	}
}

// group generates n batches; its view of revisions assumes every batch of
// the group succeeds, so later batches chain on earlier ones (an update of
// a document the group created or updated: the set path merges them).
func (g *setWorkload) group(n int) []*store.Batch {
	view := map[string]uint64{}
	for id, rev := range g.revs {
		view[id] = rev
	}
	g.touched = g.touched[:0]
	g.fault = faultNone
	if g.rng.IntN(2) == 0 { // half the groups succeed whole: the set path applies
		g.fault = setFault(1 + g.rng.IntN(int(faultCount)-1))
	}
	var out []*store.Batch
	for range n {
		b := &store.Batch{}
		switch k := g.rng.IntN(10); {
		case k < 4 || len(view) == 0:
			g.createBatch(b, view)
		case k == 9 && g.fault == faultClaim:
			id := g.pick(view, false)
			b.Claims = []store.ClaimRecord{{Tenant: "t", Claim: &gatewayv1.ClaimCheck{ClaimId: fmt.Sprint(1000 + g.rng.IntN(50)),
				DocumentId: id, State: gatewayv1.ClaimCheck_ISSUED, ExpireTime: timestamppb.New(groupBase.Add(time.Hour)), CreateTime: timestamppb.New(groupBase)}}}
		default:
			g.updateBatch(b, view)
		}
		if g.fault == faultEarly && g.rng.IntN(4) == 0 {
			id := fmt.Sprintf("d%03d", g.ids+1+g.rng.IntN(2))
			b.Payloads = append(b.Payloads, store.PayloadRecord{DocID: id, Kind: store.PayloadResult, Body: []byte("early")})
		}
		out = append(out, b)
	}
	return out
}

// pick returns a document of view (one the group touched, half the time,
// if fresh is set and there is one), in an order fixed by the rng alone.
func (g *setWorkload) pick(view map[string]uint64, fresh bool) string {
	if fresh && len(g.touched) > 0 && g.rng.IntN(2) == 0 {
		return g.touched[g.rng.IntN(len(g.touched))]
	}
	ids := make([]string, 0, len(view))
	for id := range view {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return "d000"
	}
	return ids[g.rng.IntN(len(ids))]
}

func (g *setWorkload) createBatch(b *store.Batch, view map[string]uint64) {
	var id string
	if g.fault == faultDupID && len(view) > 0 && g.rng.IntN(3) == 0 {
		id = g.pick(view, true)
	} else {
		g.ids++
		id = fmt.Sprintf("d%03d", g.ids)
	}
	rec := groupDoc("t", id, 1)
	if g.rng.IntN(3) == 0 {
		rec.Doc.RequestId, rec.BodyHash = "req-"+id, []byte{1}
		if g.fault == faultDupReq {
			rec.Doc.RequestId, rec.BodyHash = fmt.Sprintf("req-%d", g.rng.IntN(4)), []byte{byte(g.rng.IntN(2))}
		}
	}
	b.Create = rec
	b.Events = []store.EventAppend{groupEvent(id, 1)}
	if g.rng.IntN(2) == 0 {
		b.Payloads = append(b.Payloads, store.PayloadRecord{DocID: id, Kind: store.PayloadContent, Body: []byte("content-" + id)})
	}
	if _, used := view[id]; !used {
		view[id] = 1
		g.touched = append(g.touched, id)
	}
}

func (g *setWorkload) updateBatch(b *store.Batch, view map[string]uint64) {
	id := g.pick(view, true)
	prev := view[id]
	if g.fault == faultStale && g.rng.IntN(3) == 0 {
		prev += uint64(1 + g.rng.IntN(3))
	}
	rev := prev + 1 + uint64(g.rng.IntN(2))
	rec := groupDoc("t", id, rev)
	rec.Doc.State = []gatewayv1.State{gatewayv1.State_RUNNING, gatewayv1.State_SUCCEEDED, gatewayv1.State_FAILED}[g.rng.IntN(3)]
	rec.Doc.UpdateTime = timestamppb.New(groupBase.Add(time.Duration(rev) * time.Second))
	rec.ResultContentType = fmt.Sprintf("type/%d", rev)
	b.Updates = []store.DocumentUpdate{{Record: rec, PrevRev: prev}}
	for e := range g.rng.IntN(3) {
		b.Entities = append(b.Entities, store.EntityRecord{DocID: id, Entity: &gatewayv1.Entity{EntityId: uint32(1 + e + g.rng.IntN(2)),
			Status: gatewayv1.EntityStatus(g.rng.IntN(4)), SizeBytes: rev}})
	}
	switch g.rng.IntN(4) {
	case 0:
		b.Payloads = append(b.Payloads, store.PayloadRecord{DocID: id, Kind: store.PayloadResult, Body: []byte(fmt.Sprintf("result-%s-%d", id, rev))})
	case 1:
		b.Payloads = append(b.Payloads, store.PayloadRecord{DocID: id, Kind: store.PayloadContent})
	case 2:
		b.Payloads = append(b.Payloads, store.PayloadRecord{DocID: id, Kind: store.PayloadResult, Body: []byte("r")},
			store.PayloadRecord{DocID: id, Kind: store.PayloadContent})
	}
	for e := range 1 + g.rng.IntN(5) {
		b.Events = append(b.Events, groupEvent(id, rev+uint64(e)))
	}
	view[id] = rev
	g.touched = append(g.touched, id)
}

// dumpTables reads every row of the tables the writer writes.
func dumpTables(t *testing.T, s *Store) map[string][][]any {
	t.Helper()
	out := map[string][][]any{}
	for name, q := range map[string]string{
		"documents": "SELECT * FROM documents ORDER BY id",
		"entities":  "SELECT * FROM entities ORDER BY doc_id, attempt, scope_id, scope_instance, entity_id",
		"payloads":  "SELECT doc_id, kind, body FROM payloads ORDER BY doc_id, kind",
		"events":    "SELECT * FROM events ORDER BY seq",
		"claims":    "SELECT * FROM claims ORDER BY claim_id",
		"meta":      "SELECT * FROM meta ORDER BY key",
	} {
		rows, err := s.rdb.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			out[name] = append(out[name], vals)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return out
}
