package main_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// waitHealthy polls /healthz until 200 or fails t.
func waitHealthy(t *testing.T, p *proc, base string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for healthz(base) != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("%s/healthz never answered 200\n%s", base, p.logs.String())
		}
		select {
		case err := <-p.exited:
			t.Fatalf("exited early: %v\n%s", err, p.logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// runRefused runs bin args to completion (it must exit on its own within
// 10 s) and returns its exit code, stderr and how long it ran.
func runRefused(t *testing.T, args ...string) (int, string, time.Duration) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	var stderr lockedBuffer
	stderr.mu = make(chan struct{}, 1)
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		code := 0
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		return code, stderr.String(), time.Since(start)
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within 10 s (it must refuse a locked data dir at once)\n%s", args, stderr.String())
		return 0, "", 0
	}
}

// TestDataDirLock: a second gateway (and a second peer) on a data dir in
// use exits at once with a non-zero code and a message naming the holder's
// pid, and leaves the first one's files alone (the temporary spool file a
// starting store would clean up survives); the first keeps serving. The
// lock goes with the process: after it exits, a new gateway starts there.
func TestDataDirLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	httpAddr := freePort(t)
	first := startProc(t, "serve", "--grpc-addr", freePort(t), "--http-addr", httpAddr, "--data-dir", dir)
	waitHealthy(t, first, "http://"+httpAddr)
	pid := strconv.Itoa(first.cmd.Process.Pid)
	if b, err := os.ReadFile(filepath.Join(dir, "LOCK")); err != nil || strings.TrimSpace(string(b)) != pid {
		t.Fatalf("LOCK holds %q (%v), want the first gateway's pid %s", b, err, pid)
	}
	// A temporary spool file of an upload in flight: a starting store
	// removes such leftovers, so a second gateway must not get that far.
	inFlight := filepath.Join(dir, "spool", "upload-in-flight.1.tmp")
	if err := os.WriteFile(inFlight, []byte("partial upload"), 0o644); err != nil {
		t.Fatal(err)
	}

	code, stderr, took := runRefused(t, "serve", "--grpc-addr", freePort(t), "--http-addr", freePort(t), "--data-dir", dir)
	want := fmt.Sprintf("is locked by pid %s", pid)
	if code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "--data-dir") {
		t.Errorf("second gateway: exit %d, stderr %q; want non-zero and %q", code, stderr, want)
	}
	t.Logf("second gateway refused in %v: %s", took.Round(time.Millisecond), strings.TrimSpace(stderr))
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("the second gateway touched the first one's spool: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "LOCK")); strings.TrimSpace(string(b)) != pid {
		t.Errorf("LOCK now holds %q, want %s still", b, pid)
	}
	// A standalone peer on the embedded peer's dir is refused too.
	code, stderr, _ = runRefused(t, "peer", "--listen", freeUDP(t), "--data-dir", filepath.Join(dir, "peer"))
	if code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("peer on the embedded peer's dir: exit %d, stderr %q; want non-zero and %q", code, stderr, want)
	}
	if healthz("http://"+httpAddr) != 200 {
		t.Errorf("the first gateway stopped serving\n%s", first.logs.String())
	}

	_ = first.cmd.Process.Kill() // kill -9: the kernel drops the lock
	<-first.exited
	first.exited <- nil // for the cleanup
	httpAddr = freePort(t)
	again := startProc(t, "serve", "--grpc-addr", freePort(t), "--http-addr", httpAddr, "--data-dir", dir)
	waitHealthy(t, again, "http://"+httpAddr)
}

// TestPeerDataDirLock: a second `gateway peer` on a peer's data dir exits
// at once naming the holder.
func TestPeerDataDirLock(t *testing.T) {
	dir := t.TempDir()
	first := startProc(t, "peer", "--listen", freeUDP(t), "--data-dir", dir)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(first.logs.String(), "peer listening") {
		if time.Now().After(deadline) {
			t.Fatalf("the first peer did not start\n%s", first.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, stderr, _ := runRefused(t, "peer", "--listen", freeUDP(t), "--data-dir", dir)
	want := fmt.Sprintf("is locked by pid %d", first.cmd.Process.Pid)
	if code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("second peer: exit %d, stderr %q; want non-zero and %q", code, stderr, want)
	}
}
