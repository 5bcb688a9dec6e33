package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/bridge/store/storetest"
	"github.com/pipestream/gateway/internal/pgtest"
)

// rawConn is a connection to dsn outside the stores.
func rawConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// scanSnapshotBytes is the scan SnapshotBytes was before schema migration
// 5: the bodies of every document and digest.
func scanSnapshotBytes(t *testing.T, conn *pgx.Conn) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), `SELECT coalesce((SELECT sum(length(body)) FROM documents), 0)::bigint +
		coalesce((SELECT sum(length(body)) FROM digests), 0)::bigint`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pgRaw gives storetest.SnapshotTotal the database underneath the stores:
// the scan, and deletes of documents (their digests go by cascade).
func pgRaw() storetest.Raw {
	return storetest.Raw{
		Scan: func(t *testing.T, dsn string) int64 { return scanSnapshotBytes(t, rawConn(t, dsn)) },
		Delete: func(t *testing.T, dsn, id string) {
			tag, err := rawConn(t, dsn).Exec(context.Background(), "DELETE FROM documents WHERE id = $1", id)
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("delete %s: %v, %v", id, tag, err)
			}
		},
	}
}

func openReplica(t *testing.T, dsn string) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgstore.Open(ctx, dsn, pgstore.Options{MaxConns: 4})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return s
}

// twoReplicas is two Stores on one database: each document's batches go
// to one of them by its id (the replica that created it holds its lease),
// so concurrent commits of one round run on both.
type twoReplicas struct {
	storetest.Store
	other storetest.Store
}

func (r twoReplicas) Commit(ctx context.Context, b *store.Batch) (store.CommitResult, error) {
	id := ""
	if b.Create != nil {
		id = b.Create.Doc.GetId()
	} else if len(b.Updates) > 0 {
		id = b.Updates[0].Record.Doc.GetId()
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	if h.Sum32()%2 == 1 {
		return r.other.Commit(ctx, b)
	}
	return r.Store.Commit(ctx, b)
}

func (r twoReplicas) Close() error { return errors.Join(r.Store.Close(), r.other.Close()) }

// TestSnapshotTotalMatchesScan: the snapshot size kept by triggers equals a
// scan of the rows after every round of a seeded workload (creates,
// updates, digest upserts, failing batches, prunes, deletes outside the
// stores) and after reopening; with one store, and with two replicas on
// one database committing at once.
func TestSnapshotTotalMatchesScan(t *testing.T) {
	one := storetest.Backend{
		NewState: func(t *testing.T) string { return pgtest.NewDatabase(t) },
		Open:     func(t *testing.T, dsn string) storetest.Store { return openReplica(t, dsn) },
	}
	two := one
	two.Open = func(t *testing.T, dsn string) storetest.Store {
		return twoReplicas{openReplica(t, dsn), openReplica(t, dsn)}
	}
	for _, seed := range storetest.Seeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			storetest.SnapshotTotal(t, one, pgRaw(), seed, 80)
		})
		t.Run(fmt.Sprintf("replicas/seed=%d", seed), func(t *testing.T) {
			storetest.SnapshotTotal(t, two, pgRaw(), seed, 80)
		})
	}
}

// TestMigration5SeedsSnapshotTotal: a database of schema version 4 with
// documents and digests gets its snapshot total from migration 5's scan,
// and the triggers keep it from there.
func TestMigration5SeedsSnapshotTotal(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn := rawConn(t, dsn)
	if err := pgstore.MigrateTo(ctx, conn, 4); err != nil {
		t.Fatal(err)
	}
	var want int64
	for i := range 20 {
		id := fmt.Sprintf("old%d", i)
		body := make([]byte, 100*i+1)
		if _, err := conn.Exec(ctx, `INSERT INTO documents (id, tenant, state, terminal, rev, create_time, update_time, body)
			VALUES ($1, 'acme', 1, false, 1, 1, 1, $2)`, id, body); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO digests VALUES ($1, 0, 0, 0, $2)`, id, body[:i]); err != nil {
			t.Fatal(err)
		}
		want += int64(len(body) + i)
	}
	if got := scanSnapshotBytes(t, conn); got != want {
		t.Fatalf("scan of the version 4 rows %d, want %d", got, want)
	}
	s := open(t, dsn)
	if got, err := s.SnapshotBytes(ctx); err != nil || got != want {
		t.Fatalf("SnapshotBytes after migrating from version 4 = %d, %v; want %d", got, err, want)
	}
	if _, err := s.Commit(ctx, &store.Batch{Create: doc("new", ""), Events: []store.EventAppend{event("new", "#document")}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.SnapshotBytes(ctx)
	if scan := scanSnapshotBytes(t, conn); err != nil || got != scan || got <= want {
		t.Fatalf("SnapshotBytes after a commit = %d, %v; a scan sums %d (before the commit %d)", got, err, scan, want)
	}
}
