package pgstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// The tests of this file check, as TestReadNearTheHeadScansNoHistory
// does for event reads, that a statement the store runs per request or
// periodically touches about the rows it answers, not the history: on a
// synthetic store (historyDocs documents, almost all terminal, with their
// entities, digests, claims, payloads and events) each statement is
// prepared as the store sends it and explained under the custom and the
// generic plan.

// historyDocs is the size of the synthetic store: enough that a scan of
// the history stands out from the few rows an answer needs.
const historyDocs = 20000

// heldDocs is the number of non-terminal documents (the newest), all held
// by replica "r1" with a live lease.
const heldDocs = 2000

// historyStore names the synthetic store in failure messages.
var historyStore = fmt.Sprintf("%d documents", historyDocs)

// history opens a connection to a new migrated database holding the
// synthetic store: historyDocs documents d1..dN of tenant acme, the newest
// heldDocs of them running and held by r1, the others succeeded and
// unowned; per document one entity, one digest, one redeemed claim, one
// inline payload, one synced streamed payload and one event block.
func history(t *testing.T) *pgx.Conn {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	open(t, dsn) // migrates
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	open := historyDocs - heldDocs
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO documents (id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time, body,
				owner, lease_epoch, lease_expires)
			SELECT 'd' || g, 'acme', CASE WHEN g > %[1]d THEN 2 ELSE 3 END, g <= %[1]d, 3, 'r' || g, '\x00', g, g, '\x0a0101',
				CASE WHEN g > %[1]d THEN 'r1' END, 1, CASE WHEN g > %[1]d THEN now() + interval '1 hour' ELSE now() - interval '1 day' END
			FROM generate_series(1, %[2]d) g`, open, historyDocs),
		`INSERT INTO entities SELECT id, 0, 1, 0, 1, 0, 0, 3, 0, 0, 10, '', 1, '' FROM documents`,
		`INSERT INTO digests SELECT id, 0, 1, 0, '\x0801' FROM documents`,
		`INSERT INTO claims SELECT 'c' || id, tenant, id, 1, 1, 2, 0, create_time, 0, NULL FROM documents`,
		`INSERT INTO payloads SELECT id, 1, '\x01' FROM documents`,
		`INSERT INTO blobs (doc_id, kind, state, size, chunk_size, touched) SELECT id, 2, 1, 1, 262144, 0 FROM documents`,
		`INSERT INTO blob_chunks SELECT blob_id, 0, '\x01' FROM blobs`,
		fmt.Sprintf(`INSERT INTO event_blocks SELECT g, g, '{1}', '{k}', '{acme}', ARRAY['d' || g], '{0}', '{0}', '{1}', ARRAY['\x'::bytea]
			FROM generate_series(1, %[1]d) g`, historyDocs),
		fmt.Sprintf("UPDATE meta SET last_seq = %[1]d, event_count = %[1]d WHERE id = 1", historyDocs),
		"VACUUM ANALYZE",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return conn
}

// statement is one statement of the store, its arguments for EXECUTE,
// the rows its top node returns and the most rows it may touch.
type statement struct {
	name    string
	sql     string
	args    []any
	want    float64
	touched float64
}

// checkPlans prepares every statement and explains it under the custom
// and the generic plan, in a transaction rolled back after each (a write
// changes nothing for the next). It fails on a statement that returns
// other than want rows or touches more than touched; store names the
// synthetic store in the message.
func checkPlans(t *testing.T, conn *pgx.Conn, store string, stmts []statement) {
	t.Helper()
	ctx := context.Background()
	for i, st := range stmts {
		if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE p%d AS %s", i, st.sql)); err != nil {
			t.Fatalf("prepare %s: %v", st.name, err)
		}
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for i, st := range stmts {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			returned, touched, plan := explain(t, tx.Conn(), fmt.Sprintf("EXECUTE p%d(%s)", i, literals(st.args)))
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if returned != st.want || touched > st.touched {
				t.Errorf("%s, %s on %s: %.0f rows returned, %.0f rows touched (read or filtered out), want %.0f and at most %.0f; plan: %s",
					mode, st.name, store, returned, touched, st.want, st.touched, plan)
			}
		}
	}
}

// TestPruneScansOnlyThePrunedBlocks: PruneEvents deletes the blocks below
// the new floor through the primary key, without reading the retained
// ones. On the old DELETE (a condition on last_seq alone) every prune read
// every block: 20,000 rows touched to delete 10.
func TestPruneScansOnlyThePrunedBlocks(t *testing.T) {
	conn := history(t)
	checkPlans(t, conn, historyStore, []statement{
		{"the DELETE of the blocks below seq 11", pgstore.PruneDeleteSQL, []any{int64(11)}, 0, 40},
		{"the count of the events below seq 11", pgstore.PruneCountSQL, []any{int64(0), int64(11)}, 1, 40},
	})
}

// TestPayloadStatementsScanNoHistory: opening, superseding and removing
// one document's streamed payload, and the stale cleanup after every
// Sync, touch that document's blobs (or the unsynced ones), not every
// document's. Before blobs_doc (schema migration 6) RemovePayload read
// every blob under both plans, and OpenPayload, Sync's supersede and the
// cleanup did under the generic plan: 20,000 rows each.
func TestPayloadStatementsScanNoHistory(t *testing.T) {
	conn := history(t)
	doc := fmt.Sprintf("d%d", historyDocs-1)
	checkPlans(t, conn, historyStore, []statement{
		{"OpenPayload", pgstore.OpenPayloadSQL, []any{doc, int32(2), int32(1)}, 1, 10},
		{"RemovePayload", pgstore.RemovePayloadSQL, []any{doc, int32(2)}, 0, 10},
		{"Sync's supersede", pgstore.SupersedeSQL, []any{int32(2), int64(1), doc, int32(2), int32(1)}, 0, 10},
		{"the stale cleanup", pgstore.RemoveStaleSQL, []any{int64(1)}, 0, 10},
	})
}

// TestRedeemedOfHeldScansOnlyHeldClaims: the listing of the redeemed
// claims of the documents a replica drives (at every listener reconnect)
// reads those documents' claims, not the history's. On the old join every
// claim was read under both plans: 26,000 rows touched for 2,000.
func TestRedeemedOfHeldScansOnlyHeldClaims(t *testing.T) {
	conn := history(t)
	checkPlans(t, conn, historyStore, []statement{
		{"the redeemed claims of the documents r1 drives", pgstore.RedeemedOfHeldSQL, []any{"r1", int32(2)}, heldDocs, 2*heldDocs + 10},
	})
}

// TestBlobSyncedSQL: the synced state written into removeStaleSQL as a
// literal (so that its partial index serves the generic plan) is the
// constant's value.
func TestBlobSyncedSQL(t *testing.T) {
	if want := strconv.Itoa(pgstore.BlobSynced); pgstore.BlobSyncedSQL != want {
		t.Fatalf("blobSyncedSQL is %q, blobSynced is %s", pgstore.BlobSyncedSQL, want)
	}
}
