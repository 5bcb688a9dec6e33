// Package pgtest runs a throwaway PostgreSQL cluster for tests: real
// initdb, real postgres, on a free loopback TCP port, removed when the test
// binary ends.
//
// # Use
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestX(t *testing.T) {
//		dsn := pgtest.NewDatabase(t) // a fresh, empty database on the shared cluster
//		...
//	}
//
// One cluster per test binary: it starts on the first NewDatabase (about a
// second: initdb plus startup) and Main stops it and removes its directory
// after the tests. Every NewDatabase creates a new database, so tests do not
// see each other's rows; the database is dropped at the test's cleanup.
//
// # Requirements
//
// PostgreSQL's server binaries (initdb, pg_ctl, postgres). Discovery: the
// directory in $PGTEST_BIN if set, else the newest /usr/lib/postgresql/*/bin
// (Debian's layout), else $PATH. A test that needs PostgreSQL and cannot
// find it FAILS (never skips) with the command that installs it:
//
//	apt-get update && apt-get install -y postgresql
//
// .ci/setup.sh (run by .ci/test.sh) installs it when initdb is missing.
//
// PostgreSQL refuses to run as root. When the test runs as root, pgtest
// chowns the cluster directory to the `postgres` user (created by the Debian
// package) and runs initdb and pg_ctl through `runuser -u postgres --`.
//
// # The cluster
//
// initdb --auth=trust in a temporary directory ($TMPDIR/pgtest-*), listening
// on 127.0.0.1:<free port> with its unix socket in the same directory (no
// /var/run/postgresql needed). fsync, synchronous_commit and
// full_page_writes are off: the cluster is thrown away, and CPU and disk are
// shared with other engineers. max_connections is 300 so that tests with
// several pools fit. If the test binary is killed (kill -9) the postgres
// process outlives it; its directory under $TMPDIR names it (postmaster.pid).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstallHint is the command that installs the PostgreSQL server on Debian.
const InstallHint = "apt-get update && apt-get install -y postgresql"

// Cluster is one running PostgreSQL cluster.
type Cluster struct {
	dir     string // temp dir: data/, socket, log
	bin     string // directory of initdb, pg_ctl
	port    int
	asUser  string // "postgres" when running as root, else ""
	logPath string
}

var (
	shared     *Cluster
	sharedErr  error
	sharedOnce sync.Once
	dbCounter  atomic.Int64
)

// Main runs the tests of m, stops the shared cluster (if a test started
// one), removes its directory and exits. Use it as TestMain's body.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain that has more to do: it returns m.Run's code
// after stopping the shared cluster.
func Run(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	return code
}

// Shared returns the test binary's cluster, starting it on first use. It
// fails t (never skips) when PostgreSQL is not installed or does not start.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared, sharedErr = Start(ctx)
	})
	if sharedErr != nil {
		t.Fatalf("pgtest: %v", sharedErr)
	}
	return shared
}

// NewDatabase creates a fresh database on the shared cluster and returns its
// DSN (postgres://postgres@127.0.0.1:<port>/<name>?sslmode=disable). The
// database is dropped (WITH FORCE) when t ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	c := Shared(t)
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.exec(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.exec(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return c.DSN(name)
}

// DSN is the URL of database db on the cluster.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Port is the cluster's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

func (c *Cluster) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// FindBin returns the directory holding initdb and pg_ctl (see the package
// doc) or an error naming the install command.
func FindBin() (string, error) {
	if d := os.Getenv("PGTEST_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("PGTEST_BIN=%s has no initdb (%w); unset it, or install PostgreSQL with: %s", d, err, InstallHint)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("PostgreSQL server binaries (initdb, pg_ctl) not found in /usr/lib/postgresql/*/bin or $PATH; install them with: %s (or set PGTEST_BIN to their directory)", InstallHint)
}

// pgVersion is the major version in /usr/lib/postgresql/<v>/bin (0 if none).
func pgVersion(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// Start creates and starts a new cluster (see the package doc). Stop it with
// Stop.
func Start(ctx context.Context) (*Cluster, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin, logPath: filepath.Join(dir, "postgres.log")}
	if os.Geteuid() == 0 {
		if err := c.runAsPostgres(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.initdb(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// A free port can be taken between our probe and postgres' bind: retry.
	for attempt := 0; ; attempt++ {
		if err = c.start(ctx); err == nil {
			return c, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// runAsPostgres prepares running the server binaries as the postgres user.
func (c *Cluster) runAsPostgres() error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root needs the 'postgres' user to run the server (the Debian package creates it; %s): %w", InstallHint, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(c.dir, uid, gid); err != nil {
		return fmt.Errorf("chown %s to postgres: %w", c.dir, err)
	}
	if _, err := exec.LookPath("runuser"); err != nil {
		return fmt.Errorf("running as root needs runuser (util-linux): %w", err)
	}
	c.asUser = "postgres"
	return nil
}

func (c *Cluster) command(ctx context.Context, tool string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, tool)
	if c.asUser != "" {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) initdb(ctx context.Context) error {
	cmd := c.command(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) start(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	return c.startOn(ctx, port)
}

// startOn starts the server on port.
func (c *Cluster) startOn(ctx context.Context, port int) error {
	c.port = port
	opts := strings.Join([]string{
		"-p", strconv.Itoa(port), "-k", c.dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=32MB",
	}, " ")
	cmd := c.command(ctx, "pg_ctl", "-D", c.dataDir(), "-l", c.logPath, "-w", "-t", "60", "-o", opts, "start")
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(c.logPath)
		return fmt.Errorf("pg_ctl start on port %d: %w\n%s\n%s", port, err, out, tail(log, 2000))
	}
	return nil
}

// CreateDatabase creates database name on c and returns its DSN: for a
// test that runs its own cluster (Start), e.g. to restart it.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	if err := c.exec(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return c.DSN(name), nil
}

// Down stops the server with a fast shutdown (as an operator's restart
// does: sessions are terminated, committed work is written out), keeping
// the data directory; Up starts it again on the same port. Use them on a
// cluster of the test's own (Start), never on Shared: other tests use it.
func (c *Cluster) Down(ctx context.Context) error {
	if out, err := c.command(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Up starts a cluster stopped by Down again, on the same port.
func (c *Cluster) Up(ctx context.Context) error { return c.startOn(ctx, c.port) }

// Stop stops the cluster (immediate shutdown) and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	if out, err := c.command(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("pg_ctl stop: %w\n%s", err, out))
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
