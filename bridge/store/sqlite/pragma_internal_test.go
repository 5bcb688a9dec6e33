package sqlite

import (
	"context"
	"testing"
)

// TestConnectionPragmas checks that every connection runs with the durability
// settings the package documents (the writer's DSN differs from the readers'
// only by journal_mode, which Open verifies, and query_only).
func TestConnectionPragmas(t *testing.T) {
	for _, c := range []struct {
		sync string
		want int
	}{{"", 2}, {"FULL", 2}, {"normal", 1}} {
		s, err := Open(context.Background(), t.TempDir(), Options{Synchronous: c.sync})
		if err != nil {
			t.Fatal(err)
		}
		var syncMode, fk, qo int
		var jm string
		row := s.rdb.QueryRow("SELECT * FROM pragma_synchronous, pragma_foreign_keys, pragma_query_only, pragma_journal_mode")
		if err := row.Scan(&syncMode, &fk, &qo, &jm); err != nil {
			t.Fatal(err)
		}
		if syncMode != c.want || fk != 1 || qo != 1 || jm != "wal" {
			t.Errorf("Synchronous %q: synchronous=%d foreign_keys=%d query_only=%d journal_mode=%s; want %d 1 1 wal", c.sync, syncMode, fk, qo, jm, c.want)
		}
		if _, err := s.rdb.Exec("DELETE FROM event_blocks"); err == nil {
			t.Error("read pool accepted a write")
		}
		s.Close()
	}
}
