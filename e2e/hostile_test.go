package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Hostile-load suite (issue 11): each test is one family of attack the
// gateway must hold up under. Figures they log are quoted in
// docs/security.md ("Hostile load").

// TestHostileDataDirLock: a second gateway on a live data dir exits at
// once, non-zero, naming the holder's pid, and leaves the first one's
// upload spool alone; the first keeps serving.
func TestHostileDataDirLock(t *testing.T) {
	g := startGateway(t, gwOpts{})
	inFlight := filepath.Join(g.dataDir, "spool", "in-flight.1.tmp")
	if err := os.WriteFile(inFlight, []byte("partial upload"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	second := startProc(t, "gateway-second", t.TempDir(), "serve", "--grpc-addr", freeTCPAddr(t), "--http-addr", freeTCPAddr(t), "--data-dir", g.dataDir)
	t.Cleanup(second.stop)
	attachLog(t, second)
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second gateway is still running after 10 s; it must exit at once on a locked data dir")
	}
	took := time.Since(start)
	want := fmt.Sprintf("is locked by pid %d", g.proc.cmd.Process.Pid)
	if second.cmd.ProcessState.ExitCode() == 0 || !second.logContains(want) {
		t.Errorf("second gateway: exit %d, log:\n%s\nwant a non-zero exit and %q", second.cmd.ProcessState.ExitCode(), second.tail(20), want)
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("the second gateway touched the first one's spool: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(g.dataDir, "LOCK")); err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(g.proc.cmd.Process.Pid) {
		t.Errorf("LOCK holds %q (%v), want the first gateway's pid", b, err)
	}
	if code, _ := httpGetStatus(g.baseURL() + "/healthz"); code != 200 {
		t.Errorf("the first gateway's /healthz answers %d after the second one's attempt", code)
	}
	t.Logf("second gateway refused in %v", took.Round(time.Millisecond))
}

// httpGetStatus is a plain GET with a 5 s timeout: the status code, or 0
// and the error.
func httpGetStatus(url string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
