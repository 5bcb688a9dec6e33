package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readmeOnPostgresHeading names the README section TestReadmeOnPostgres runs.
const readmeOnPostgresHeading = "### On PostgreSQL"

// TestReadmeOnPostgres runs the commands of the README section "On
// PostgreSQL" as written, with bash: createdb, two gateways on one
// database, a document submitted through the first and read through the
// second, the second's event stream. The PostgreSQL server the section
// assumes on 127.0.0.1:5432 is a throwaway one (scripts/pg-throwaway.sh,
// its "pipestream" database dropped so that the section's createdb makes
// it) on a free port, named by PGPORT and in the URL; the gateways' ports
// are free ones, `go run ./cmd/gateway` is the built binary, and the
// section's last command, a stream that does not end, is stopped once it
// printed the document's events.
func TestReadmeOnPostgres(t *testing.T) {
	t.Parallel()
	root := filepath.Dir(goEnv("GOMOD"))
	blocks := readmeBlocks(t, root, readmeOnPostgresHeading)
	if len(blocks) != 1 {
		t.Fatalf("README section %q has %d sh blocks, want 1: update TestReadmeOnPostgres", readmeOnPostgresHeading, len(blocks))
	}
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} { // as root the postgres user must reach dir/pg
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pgPort := portOf(freeTCPAddr(t))
	pgDir := filepath.Join(dir, "pg")
	throwaway := filepath.Join(root, "scripts", "pg-throwaway.sh")
	if out, err := exec.Command(throwaway, pgDir, pgPort).CombinedOutput(); err != nil {
		t.Fatalf("start a throwaway PostgreSQL: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(throwaway, "--stop", pgDir).CombinedOutput(); err != nil {
			t.Errorf("stop the throwaway PostgreSQL: %v\n%s", err, out)
		}
	})
	pgBin := pgBinDir(t)
	if out, err := exec.Command(filepath.Join(pgBin, "dropdb"), "-h", "127.0.0.1", "-p", pgPort, "-U", "postgres", "pipestream").CombinedOutput(); err != nil {
		t.Fatalf("dropdb: %v\n%s", err, out)
	}

	ports := map[string]string{"5432": pgPort}
	for _, p := range []string{"8080", "8081", "9090", "9091"} {
		ports[p] = portOf(freeTCPAddr(t))
	}
	block := blocks[0]
	for p := range ports {
		if p != "9090" && !strings.Contains(block, p) { // 9090: the first gateway's default
			t.Fatalf("the README block no longer uses port %s: update TestReadmeOnPostgres\n%s", p, block)
		}
	}
	script := regexp.MustCompile(`\b(5432|8080|8081|9090|9091)\b`).ReplaceAllStringFunc(block, func(p string) string { return ports[p] })
	script = strings.ReplaceAll(script, "go run ./cmd/gateway", gatewayBinary(t))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the gateways it starts go with it
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Env = append(os.Environ(), "PGPORT="+pgPort, "PATH="+pgBin+":"+filepath.Dir(need(t, toolCurl))+":"+os.Getenv("PATH"),
		"QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true",
		// the first gateway's default ports
		"GATEWAY_GRPC_ADDR=127.0.0.1:"+ports["9090"], "GATEWAY_HTTP_ADDR=127.0.0.1:"+ports["8080"])
	// The document's id, read through the second gateway, then its events
	// on the second gateway's stream: the section did what it says.
	done := regexp.MustCompile(`(?s)"id": *"([0-9a-f]+)".*"result".*"documentId": *"([0-9a-f]+)"`)
	out := &watchedBuffer{seen: make(chan struct{}), cond: func(b []byte) bool {
		m := done.FindSubmatch(b)
		return m != nil && bytes.Equal(m[1], m[2])
	}}
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-out.seen:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
	case err := <-waited:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("the README commands ended (%v) before the second gateway showed the document and its events\n--- stdout ---\n%.4000s\n--- stderr ---\n%.4000s", err, out.String(), errb.String())
	}
	t.Logf("the README commands' output (first 2000 bytes):\n%.2000s", out.String())
}

// watchedBuffer collects a command's output and closes seen once cond
// holds for all of it.
type watchedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	cond func([]byte) bool
	seen chan struct{}
	once sync.Once
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.cond(w.buf.Bytes()) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// pgBinDir is the directory of the PostgreSQL client and server programs
// (createdb, dropdb), as scripts/pg-throwaway.sh finds them.
func pgBinDir(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "createdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("createdb"); err == nil {
		return filepath.Dir(p)
	}
	t.Fatal("createdb not found in /usr/lib/postgresql/*/bin or $PATH; install it with: apt-get update && apt-get install -y postgresql")
	return ""
}
