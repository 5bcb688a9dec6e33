package pgstore_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestReadNearTheHeadScansNoHistory: reading the newest events (what a
// live subscriber, a replica's tail and a resume near the head do), or
// summarising their ranges (EachEventRange), touches the blocks it
// returns, not the history below them, under both the
// custom and the generic plan of the prepared statement (pgx prepares
// it; PostgreSQL switches to the generic plan after five executions). On
// the old query the planner walked the primary key from its start and
// dropped every earlier block with a join filter: 8,000 blocks read for
// the last 4.
func TestReadNearTheHeadScansNoHistory(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	open(t, dsn) // migrates
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const history = 8000
	for _, q := range []string{
		`INSERT INTO event_blocks SELECT g, g, '{1}', '{k}', '{acme}', '{d}', '{0}', '{0}', '{0}', ARRAY['\x'::bytea] FROM generate_series(1, 8000) g`,
		"UPDATE meta SET last_seq = 8000, event_count = 8000 WHERE id = 1",
		"ANALYZE event_blocks",
		"PREPARE rb(bigint, int) AS " + pgstore.ReadBlocksSQL,
		"PREPARE er(bigint, bigint, bigint) AS " + pgstore.EventRangesSQL,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	reads := []struct{ name, execute string }{
		{"the read of the last 4 blocks", "EXECUTE rb(7997, 4)"},
		{"the ranges of the last 4 seqs", "EXECUTE er(7997, 8000, 1)"},
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, r := range reads {
			var out string
			if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+r.execute).Scan(&out); err != nil {
				t.Fatal(err)
			}
			var plans []struct{ Plan planNode }
			if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
				t.Fatalf("EXPLAIN output %q: %v", out, err)
			}
			returned, touched := plans[0].Plan.rows()
			if returned != 4 || touched > 60 {
				t.Fatalf("%s, %s of %d: %.0f rows returned, %.0f rows touched (read or filtered out), want 4 and at most 60; plan: %s",
					mode, r.name, history, returned, touched, out)
			}
		}
	}
}

// planNode is the part of an EXPLAIN (ANALYZE, FORMAT JSON) node this
// test reads.
type planNode struct {
	ActualRows  float64    `json:"Actual Rows"`
	ActualLoops float64    `json:"Actual Loops"`
	RemovedScan float64    `json:"Rows Removed by Filter"`
	RemovedJoin float64    `json:"Rows Removed by Join Filter"`
	Plans       []planNode `json:"Plans"`
}

// rows returns the rows of the top node and the rows every node read or
// filtered out (a scan's rows count once per loop).
func (n planNode) rows() (returned, touched float64) {
	returned = n.ActualRows * max(n.ActualLoops, 1)
	var walk func(planNode)
	walk = func(n planNode) {
		touched += n.ActualRows*max(n.ActualLoops, 1) + n.RemovedScan + n.RemovedJoin
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(n)
	return returned, touched
}
