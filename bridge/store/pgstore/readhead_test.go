package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestReadNearTheHeadScansNoHistory: an event read touches the blocks it
// returns, not the history around them, under both the custom and the
// generic plan of the prepared statement (pgx prepares it; PostgreSQL
// may switch to the generic plan after five executions):
//   - the newest events (a live subscriber, a replica's tail, a resume
//     near the head) and their ranges (EachEventRange);
//   - one document's events from seq 1 (WatchDocument from an early
//     cursor, its fold), with and without the tenant filter.
//
// On the old queries the planner walked the primary key from its start
// (or from the bound, for a document) and dropped every other block with
// a filter: 24,017 rows touched to read the last 4 of 8,000 blocks.
func TestReadNearTheHeadScansNoHistory(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	open(t, dsn) // migrates
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// 8,000 blocks of one event each, one document each, but document x
	// has three: at seqs 10, 4000 and 7999.
	for _, q := range []string{
		`INSERT INTO event_blocks SELECT g, g, '{1}', '{k}', '{acme}',
			ARRAY[CASE WHEN g IN (10, 4000, 7999) THEN 'x' ELSE 'd' || g END], '{0}', '{0}', '{0}', ARRAY['\x'::bytea]
			FROM generate_series(1, 8000) g`,
		"UPDATE meta SET last_seq = 8000, event_count = 8000 WHERE id = 1",
		"ANALYZE event_blocks",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	blocks := func(name string, eq store.EventQuery, from int64, want float64) statement {
		sql, args := pgstore.BlocksQuery(eq, from, 4)
		return statement{name, sql, args, want, 60}
	}
	checkPlans(t, conn, "8000 event blocks", []statement{
		blocks("the last 4 blocks", store.EventQuery{AllTenants: true}, 7997, 4),
		blocks("document x from seq 1", store.EventQuery{AllTenants: true, DocID: "x"}, 1, 3),
		blocks("document x of tenant acme from seq 1", store.EventQuery{Tenant: "acme", DocID: "x"}, 1, 3),
		{"the ranges of the last 4 seqs", pgstore.EventRangesSQL, []any{int64(7997), int64(8000), int64(1)}, 4, 60},
	})
}

// literals renders args as SQL literals for EXECUTE.
func literals(args []any) string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case []string:
			out[i] = "ARRAY[" + literals(toAny(v)) + "]::text[]"
		case []int64:
			out[i] = "ARRAY[" + literals(toAny(v)) + "]::bigint[]"
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	return strings.Join(out, ", ")
}

// toAny converts a slice for literals.
func toAny[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// explain runs EXPLAIN (ANALYZE, FORMAT JSON) of stmt and returns the
// rows of its top node, the rows every node read or filtered out, and the
// plan.
func explain(t *testing.T, conn *pgx.Conn, stmt string) (returned, touched float64, plan string) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+stmt).Scan(&plan); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(plan), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN output %q: %v", plan, err)
	}
	returned, touched = plans[0].Plan.rows()
	return returned, touched, plan
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
