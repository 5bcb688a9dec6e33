package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	"github.com/pipestream/gateway/bridge/store/storetest"
)

// rawDB opens dir's database file beside the store (WAL: readers and a
// second writer wait for each other through the busy timeout).
func rawDB(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "gateway.db")+"?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// scanSnapshotBytes is the scan SnapshotBytes was before schema migration
// 5: the bodies of every document and digest.
func scanSnapshotBytes(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(`SELECT coalesce((SELECT sum(length(body)) FROM documents), 0) +
		coalesce((SELECT sum(length(body)) FROM digests), 0)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// sqliteRaw gives storetest.SnapshotTotal the file underneath the store:
// the scan, and deletes of documents (their digests go by cascade).
func sqliteRaw() storetest.Raw {
	return storetest.Raw{
		Scan: func(t *testing.T, dir string) int64 { return scanSnapshotBytes(t, rawDB(t, dir)) },
		Delete: func(t *testing.T, dir, id string) {
			res, err := rawDB(t, dir).Exec("DELETE FROM documents WHERE id = ?", id)
			if n, _ := res.RowsAffected(); err != nil || n != 1 {
				t.Fatalf("delete %s: %d rows, %v", id, n, err)
			}
		},
	}
}

// TestSnapshotTotalMatchesScan: the snapshot size kept by triggers equals a
// scan of the rows after every round of a seeded workload (creates,
// updates, digest upserts, failing batches, prunes, deletes outside the
// store) and after reopening.
func TestSnapshotTotalMatchesScan(t *testing.T) {
	b := storetest.Backend{
		NewState: func(t *testing.T) string { return t.TempDir() },
		Open: func(t *testing.T, dir string) storetest.Store {
			s, err := sqlite.Open(context.Background(), dir, sqlite.Options{Synchronous: "NORMAL"})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		},
	}
	for _, seed := range storetest.Seeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			storetest.SnapshotTotal(t, b, sqliteRaw(), seed, 150)
		})
	}
}

// TestMigration5SeedsSnapshotTotal: a database of schema version 4 with
// documents and digests gets its snapshot total from migration 5's scan,
// and the triggers keep it from there.
func TestMigration5SeedsSnapshotTotal(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	db := rawDB(t, dir)
	if err := sqlite.MigrateTo(ctx, db, 4); err != nil {
		t.Fatal(err)
	}
	var want int64
	for i := range 20 {
		id := fmt.Sprintf("old%d", i)
		body := make([]byte, 100*i+1)
		if _, err := db.Exec(`INSERT INTO documents (id, tenant, state, terminal, rev, create_time, update_time, body)
			VALUES (?, 't', 1, 0, 1, 1, 1, ?)`, id, body); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`INSERT INTO digests VALUES (?, 0, 0, 0, ?)`, id, body[:i]); err != nil {
			t.Fatal(err)
		}
		want += int64(len(body) + i)
	}
	if got := scanSnapshotBytes(t, db); got != want {
		t.Fatalf("scan of the version 4 rows %d, want %d", got, want)
	}
	db.Close()
	s := openStore(t, dir, sqlite.Options{})
	if got, err := s.SnapshotBytes(ctx); err != nil || got != want {
		t.Fatalf("SnapshotBytes after migrating from version 4 = %d, %v; want %d", got, err, want)
	}
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "new", base)})
	got, err := s.SnapshotBytes(ctx)
	if scan := scanSnapshotBytes(t, rawDB(t, dir)); err != nil || got != scan || got <= want {
		t.Fatalf("SnapshotBytes after a commit = %d, %v; a scan sums %d (before the commit %d)", got, err, scan, want)
	}
}
