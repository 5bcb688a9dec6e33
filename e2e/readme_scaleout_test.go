package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeScaleOutHeading names the README section TestReadmeScaleOut runs.
const readmeScaleOutHeading = "### Two replicas and two peers on one machine"

// TestReadmeScaleOut runs the commands of the README section "Two replicas
// and two peers on one machine" as written, with bash from the module
// root: the throwaway PostgreSQL cluster of scripts/pg-throwaway.sh, two
// `gateway peer`, two `gateway serve --store ... --peer ... --peer ...`, a
// submission through each and its result read through the other, and the
// stop commands. Only the fixed ports are replaced by free ones (the
// first replica's default ports through GATEWAY_GRPC_ADDR and
// GATEWAY_HTTP_ADDR), so that it runs beside other tests; a README edit
// that breaks the commands breaks this test.
func TestReadmeScaleOut(t *testing.T) {
	t.Parallel()
	root := filepath.Dir(goEnv("GOMOD"))
	script, ports := readmeScript(t, root)
	tmp := t.TempDir()
	// mktemp -d lands here; as root the postgres user must reach it.
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its background jobs are killed with it
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true",
		"GATEWAY_GRPC_ADDR=127.0.0.1:"+ports["9090"], "GATEWAY_HTTP_ADDR=127.0.0.1:"+ports["8080"])
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t.Cleanup(func() { stopLeftovers(t, root, tmp) })
	err := cmd.Run()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything the script left running
	if err != nil {
		t.Fatalf("the README commands failed: %v\n--- stdout ---\n%s\n--- stderr ---\n%s", err, out.String(), errb.String())
	}
	got := out.String()
	t.Logf("the README commands' output:\n%s", got)
	for _, want := range []string{"Hello from replica 1", "Hello from replica 2", "127.0.0.1:" + ports["4433"], "127.0.0.1:" + ports["4434"]} {
		if !strings.Contains(got, want) {
			t.Errorf("the README commands' output lacks %q (the results read through the other replica; both peers in /healthz):\n%s\n--- stderr ---\n%s", want, got, errb.String())
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "tmp.*")); len(left) > 0 {
		t.Errorf("the README's stop commands left %v behind", left)
	}
}

// readmeScript returns the sh block of the README section with its fixed
// ports replaced by free ones, and the mapping.
func readmeScript(t *testing.T, root string) (string, map[string]string) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), readmeScaleOutHeading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", readmeScaleOutHeading)
	}
	_, block, ok := strings.Cut(sec, "```sh\n")
	block, _, ok2 := strings.Cut(block, "```\n")
	if !ok || !ok2 || strings.Contains(sec[:strings.Index(sec, "```sh")], "\n## ") {
		t.Fatalf("README section %q has no ```sh block", readmeScaleOutHeading)
	}
	ports := map[string]string{}
	for _, p := range []string{"55432", "8080", "8081", "9090", "9091"} {
		ports[p] = portOf(freeTCPAddr(t))
	}
	for _, p := range []string{"4433", "4434"} {
		ports[p] = portOf(freeUDPAddr(t))
	}
	for p := range ports {
		if !strings.Contains(block, p) {
			t.Fatalf("the README block no longer uses port %s: update TestReadmeScaleOut\n%s", p, block)
		}
	}
	re := regexp.MustCompile(`\b(55432|8080|8081|9090|9091|4433|4434)\b`)
	return re.ReplaceAllStringFunc(block, func(p string) string { return ports[p] }), ports
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// stopLeftovers stops a PostgreSQL cluster the script started but did not
// stop (it failed half-way).
func stopLeftovers(t *testing.T, root, tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, "tmp.*", "pg"))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			if out, err := exec.Command(filepath.Join(root, "scripts", "pg-throwaway.sh"), "--stop", d).CombinedOutput(); err != nil {
				t.Errorf("stop the README's cluster in %s: %v %s", d, err, out)
			}
		}
	}
}
