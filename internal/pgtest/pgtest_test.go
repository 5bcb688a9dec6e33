package pgtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestNewDatabase: each database is real, reachable over TCP, and separate.
func TestNewDatabase(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	if a == b {
		t.Fatalf("two databases share a DSN: %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE x (v int); INSERT INTO x VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := ca.QueryRow(ctx, "SELECT v FROM x").Scan(&v); err != nil || v != 42 {
		t.Fatalf("read back: %d, %v", v, err)
	}
	var addr string
	if err := ca.QueryRow(ctx, "SELECT host(inet_server_addr())").Scan(&addr); err != nil || addr != "127.0.0.1" {
		t.Fatalf("server address %q (%v), want 127.0.0.1 (TCP loopback)", addr, err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'x'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("second database sees the first one's table: %d, %v", n, err)
	}
}

// TestFindBinNamesInstallCommand: a missing PostgreSQL is an error that says
// how to install it.
func TestFindBinNamesInstallCommand(t *testing.T) {
	t.Setenv("PGTEST_BIN", t.TempDir())
	_, err := pgtest.FindBin()
	if err == nil || !strings.Contains(err.Error(), pgtest.InstallHint) {
		t.Fatalf("FindBin with an empty PGTEST_BIN: %v; want an error naming %q", err, pgtest.InstallHint)
	}
}
