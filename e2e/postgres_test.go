package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// startPostgres starts a throwaway PostgreSQL cluster for t with
// scripts/pg-throwaway.sh, as the README does (initdb in a temp dir, a
// free loopback port; as root the server runs as the postgres user), and
// returns the URL of its database. The cluster is stopped when t ends. It
// fails, never skips, when PostgreSQL is not installed: the script names
// the install command. The package imports nothing of the project for it
// (docs/architecture.md, Layers): the script is a tool like curl.
func startPostgres(t testing.TB) string {
	t.Helper()
	dsn, _ := startPostgresDir(t)
	return dsn
}

// startPostgresDir is startPostgres that also returns the cluster's
// directory (for restartPostgres).
func startPostgresDir(t testing.TB) (dsn, pgDir string) {
	t.Helper()
	script := filepath.Join(filepath.Dir(goEnv("GOMOD")), "scripts", "pg-throwaway.sh")
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} { // the postgres user must reach dir
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pg := filepath.Join(dir, "pg")
	cmd := exec.Command(script, pg, portOf(freeTCPAddr(t)))
	// The settings internal/pgtest uses: durability is not under test here.
	cmd.Env = append(os.Environ(), "PG_THROWAWAY_OPTS=-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(pg, "data", "postmaster.pid")); err != nil {
			return
		}
		if b, err := exec.Command(script, "--stop", pg).CombinedOutput(); err != nil {
			t.Errorf("stop the PostgreSQL cluster in %s: %v %s", pg, err, b)
		}
	})
	if err != nil {
		t.Fatalf("scripts/pg-throwaway.sh (PostgreSQL for this test): %v\n%s", err, errb.String())
	}
	return strings.TrimSpace(out.String()), pg
}

// restartPostgres restarts the cluster startPostgresDir started in dir
// (pg_ctl restart -m fast: every session is cut, as in an operator's
// restart; the server comes back on the same port and options).
func restartPostgres(t testing.TB, dir string) {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	pgctl := "pg_ctl"
	if len(bins) > 0 {
		slices.Sort(bins)
		pgctl = bins[len(bins)-1]
	}
	// -l: the new server writes to its log file, not to our pipe (which
	// it would hold open for its whole life).
	args := []string{pgctl, "-D", filepath.Join(dir, "data"), "-l", filepath.Join(dir, "postgres.log"), "-m", "fast", "-w", "-t", "60", "restart"}
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	if b, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("restart PostgreSQL (%v): %v\n%s", args, err, b)
	}
}
