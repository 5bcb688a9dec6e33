package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/internal/pgtest"
)

// TestTakeoverAfterKill: two `gateway serve --store` processes on one
// database. A document is submitted through A and deferred by A's peer (a
// claim check); A is killed with SIGKILL while it drives the document (no
// Close, its lease not released). B takes the document over within 15 s
// (10 s lease + 2 s scan, docs/scale-out.md) and dispatches it again; the
// claim A's attempt issued is redeemed through B, and the result,
// downloaded through B, is byte-identical to the input.
func TestTakeoverAfterKill(t *testing.T) {
	db := pgtest.NewDatabase(t)
	dir := t.TempDir()
	gA, hA, gB, hB := freePort(t), freePort(t), freePort(t), freePort(t)
	a := startProc(t, "serve", "--store", db, "--grpc-addr", gA, "--http-addr", hA, "--data-dir", filepath.Join(dir, "a"))
	waitHealthy(t, a, "http://"+hA)
	b := startProc(t, "serve", "--store", db, "--grpc-addr", gB, "--http-addr", hB, "--data-dir", filepath.Join(dir, "b"))
	waitHealthy(t, b, "http://"+hB)

	in := filepath.Join(dir, "in.txt")
	content := strings.Repeat("a document that outlives its gateway\n", 6000) // 222 KB: a streamed payload
	if err := os.WriteFile(in, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	// The peer defers the document (a claim check): it stays in flight on A
	// until the claim is redeemed, so the kill lands mid-document.
	out, stderr, code := run(t, nil, "submit", "--addr", gA, "--processor", "fault",
		"--metadata", "pipestream.fault=defer", "--metadata", "pipestream.claim-ttl-ms=300000", in)
	if code != 0 {
		t.Fatalf("submit: exit %d %s\n%s", code, stderr, a.logs.String())
	}
	id := strings.TrimSpace(out)
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	claim := waitQuery(t, conn, 30*time.Second, "an ISSUED claim of the document",
		"SELECT coalesce(min(claim_id), '') FROM claims WHERE doc_id = $1 AND state = 1", id)
	var terminal bool
	var epoch int64
	if err := conn.QueryRow(context.Background(), "SELECT terminal, lease_epoch FROM documents WHERE id = $1", id).Scan(&terminal, &epoch); err != nil || terminal || epoch != 1 {
		t.Fatalf("before the kill: terminal %v epoch %d err %v; want in flight on A at epoch 1", terminal, epoch, err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.exited <- <-a.exited // dead; the cleanup receives it again
	killed := time.Now()
	waitQuery(t, conn, 15*time.Second, "takeover (lease epoch 2) within 15 s of the kill",
		"SELECT CASE WHEN lease_epoch >= 2 THEN 'yes' ELSE '' END FROM documents WHERE id = $1", id)
	t.Logf("taken over %v after kill -9", time.Since(killed).Round(100*time.Millisecond))
	// The claim A's attempt issued stays redeemable through B's attempt.
	if out, stderr, code := run(t, nil, "redeem", "--addr", gB, claim); code != 0 {
		t.Fatalf("redeem through B: exit %d %s%s\n%s", code, out, stderr, b.logs.String())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway B's log:\n%s", b.logs.String())
		}
	})
	waitQuery(t, conn, 30*time.Second, "the document finished",
		"SELECT CASE WHEN terminal THEN 'yes' ELSE '' END FROM documents WHERE id = $1", id)
	if out, _, code := run(t, nil, "get", "--addr", gB, id); code != 0 || !strings.Contains(out, `"state": "SUCCEEDED"`) {
		t.Fatalf("get through B: exit %d\n%s", code, out)
	}
	res := filepath.Join(dir, "out.bin")
	if _, stderr, code := run(t, nil, "result", "--addr", gB, "-o", res, id); code != 0 {
		t.Fatalf("result through B: exit %d %s\n%s", code, stderr, b.logs.String())
	}
	if got, _ := os.ReadFile(res); string(got) != content {
		t.Fatalf("result through B is %d bytes, not byte-identical to the %d input bytes", len(got), len(content))
	}
}

// waitQuery polls sql (one text column, $1 = arg) until it answers a
// non-empty string, and returns it; fails after within.
func waitQuery(t *testing.T, conn *pgx.Conn, within time.Duration, what, sql, arg string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var v string
		if err := conn.QueryRow(context.Background(), sql, arg).Scan(&v); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if v != "" {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
