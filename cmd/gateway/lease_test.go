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

// leasePair is two `gateway serve --store` processes on one database with
// a document submitted through A that A's peer deferred (a claim check): it
// stays in flight on A until the claim is redeemed.
type leasePair struct {
	dir     string
	a, b    *proc
	gB      string
	conn    *pgx.Conn
	id      string
	claim   string
	content string
}

func startLeasePair(t *testing.T) *leasePair {
	db := pgtest.NewDatabase(t)
	p := &leasePair{dir: t.TempDir()}
	gA, hA, gB, hB := freePort(t), freePort(t), freePort(t), freePort(t)
	p.gB = gB
	p.a = startProc(t, "serve", "--store", db, "--grpc-addr", gA, "--http-addr", hA, "--data-dir", filepath.Join(p.dir, "a"))
	waitHealthy(t, p.a, "http://"+hA)
	p.b = startProc(t, "serve", "--store", db, "--grpc-addr", gB, "--http-addr", hB, "--data-dir", filepath.Join(p.dir, "b"))
	waitHealthy(t, p.b, "http://"+hB)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway A's log:\n%s\ngateway B's log:\n%s", p.a.logs.String(), p.b.logs.String())
		}
	})

	in := filepath.Join(p.dir, "in.txt")
	p.content = strings.Repeat("a document that outlives its gateway\n", 6000) // 222 KB: a streamed payload
	if err := os.WriteFile(in, []byte(p.content), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run(t, nil, "submit", "--addr", gA, "--processor", "fault",
		"--metadata", "pipestream.fault=defer", "--metadata", "pipestream.claim-ttl-ms=300000", in)
	if code != 0 {
		t.Fatalf("submit: exit %d %s", code, stderr)
	}
	p.id = strings.TrimSpace(out)
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	p.conn = conn
	p.claim = waitQuery(t, conn, 30*time.Second, "an ISSUED claim of the document",
		"SELECT coalesce(min(claim_id), '') FROM claims WHERE doc_id = $1 AND state = 1", p.id)
	var terminal bool
	var epoch int64
	if err := conn.QueryRow(context.Background(), "SELECT terminal, lease_epoch FROM documents WHERE id = $1", p.id).Scan(&terminal, &epoch); err != nil || terminal || epoch != 1 {
		t.Fatalf("before stopping A: terminal %v epoch %d err %v; want in flight on A at epoch 1", terminal, epoch, err)
	}
	return p
}

// finishThroughB redeems the claim A's attempt issued through B, waits for
// the document to finish and checks the result downloaded through B.
func (p *leasePair) finishThroughB(t *testing.T) {
	t.Helper()
	if out, stderr, code := run(t, nil, "redeem", "--addr", p.gB, p.claim); code != 0 {
		t.Fatalf("redeem through B: exit %d %s%s", code, out, stderr)
	}
	waitQuery(t, p.conn, 30*time.Second, "the document finished",
		"SELECT CASE WHEN terminal THEN 'yes' ELSE '' END FROM documents WHERE id = $1", p.id)
	if out, _, code := run(t, nil, "get", "--addr", p.gB, p.id); code != 0 || !strings.Contains(out, `"state": "SUCCEEDED"`) {
		t.Fatalf("get through B: exit %d\n%s", code, out)
	}
	res := filepath.Join(p.dir, "out.bin")
	if _, stderr, code := run(t, nil, "result", "--addr", p.gB, "-o", res, p.id); code != 0 {
		t.Fatalf("result through B: exit %d %s", code, stderr)
	}
	if got, _ := os.ReadFile(res); string(got) != p.content {
		t.Fatalf("result through B is %d bytes, not byte-identical to the %d input bytes", len(got), len(p.content))
	}
}

// waitTakeover waits until the document's lease epoch is 2 (B took it
// over) and returns when that was seen.
func (p *leasePair) waitTakeover(t *testing.T, within time.Duration, what string) time.Time {
	t.Helper()
	waitQuery(t, p.conn, within, what,
		"SELECT CASE WHEN lease_epoch >= 2 THEN 'yes' ELSE '' END FROM documents WHERE id = $1", p.id)
	return time.Now()
}

// TestTakeoverAfterKill: A is killed with SIGKILL while it drives the
// deferred document (no Close, its lease not released). B takes the
// document over within 15 s (10 s lease + 2 s scan, docs/scale-out.md) and
// dispatches it again; the claim A's attempt issued is redeemed through B,
// and the result, downloaded through B, is byte-identical to the input.
func TestTakeoverAfterKill(t *testing.T) {
	p := startLeasePair(t)
	if err := p.a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.a.exited <- <-p.a.exited // dead; the cleanup receives it again
	killed := time.Now()
	at := p.waitTakeover(t, 15*time.Second, "takeover (lease epoch 2) within 15 s of the kill")
	t.Logf("taken over %v after kill -9", at.Sub(killed).Round(100*time.Millisecond))
	p.finishThroughB(t)
}

// TestTakeoverAfterSIGTERM: A is stopped with SIGTERM while it drives the
// deferred document. After its drain A hands the lease back (owner NULL,
// expired, still epoch 1: nobody took it meanwhile), and B takes the
// document over at its next scan: within the 2 s scan interval + 1 s of
// slack after A exited, not after the 10 s lease. B then finishes it.
func TestTakeoverAfterSIGTERM(t *testing.T) {
	p := startLeasePair(t)
	if err := p.a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	select {
	case err := <-p.a.exited:
		if err != nil {
			t.Fatalf("A after SIGTERM: %v", err)
		}
		p.a.exited <- err // the cleanup receives it again
	case <-time.After(30 * time.Second):
		t.Fatalf("A did not exit within 30 s of SIGTERM")
	}
	exited := time.Now()
	if !strings.Contains(p.a.logs.String(), "released document leases at close") {
		t.Fatalf("A did not log the lease release")
	}
	at := p.waitTakeover(t, 3*time.Second, "takeover within the scan interval (2 s) + 1 s of A's exit")
	t.Logf("SIGTERM drain took %v; taken over %v after A exited (%v after SIGTERM)",
		exited.Sub(sent).Round(10*time.Millisecond), at.Sub(exited).Round(10*time.Millisecond), at.Sub(sent).Round(10*time.Millisecond))
	p.finishThroughB(t)
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
