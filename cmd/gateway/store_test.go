package main_test

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/internal/pgtest"
)

// TestServeOnPostgres: two gateways on one PostgreSQL database (--store).
// A document submitted and processed through the first one is read, with
// its result (a streamed payload, larger than the inline limit), through
// the second one: the state and the bytes are in the database.
func TestServeOnPostgres(t *testing.T) {
	db := pgtest.NewDatabase(t)
	dir := t.TempDir()
	gA, hA, gB, hB := freePort(t), freePort(t), freePort(t), freePort(t)
	a := startProc(t, "serve", "--store", db, "--grpc-addr", gA, "--http-addr", hA, "--data-dir", filepath.Join(dir, "a"))
	waitHealthy(t, a, "http://"+hA)
	b := startProc(t, "serve", "--store", db, "--grpc-addr", gB, "--http-addr", hB, "--data-dir", filepath.Join(dir, "b"))
	waitHealthy(t, b, "http://"+hB)

	subA := subscribe(t, "http://"+hA)
	subB := subscribe(t, "http://"+hB)

	in := filepath.Join(dir, "in.txt")
	content := strings.Repeat("the quick brown fox jumps over the lazy dog\n", 3000) // 132 KB: a streamed payload
	if err := os.WriteFile(in, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run(t, nil, "submit", "--addr", gA, in)
	if code != 0 {
		t.Fatalf("submit: exit %d %s\n%s", code, stderr, a.logs.String())
	}
	id := strings.TrimSpace(out)
	if out, stderr, code := run(t, nil, "watch", "--addr", gA, id); code != 0 || !strings.Contains(out, "SUCCEEDED") {
		t.Fatalf("watch: exit %d\n%s%s\n%s", code, out, stderr, a.logs.String())
	}
	if out, _, code := run(t, nil, "get", "--addr", gB, id); code != 0 || !strings.Contains(out, `"state": "SUCCEEDED"`) {
		t.Fatalf("get through the second gateway: exit %d\n%s", code, out)
	}
	res := filepath.Join(dir, "out.bin")
	if _, stderr, code := run(t, nil, "result", "--addr", gB, "-o", res, id); code != 0 {
		t.Fatalf("result through the second gateway: exit %d %s\n%s", code, stderr, b.logs.String())
	}
	if got, _ := os.ReadFile(res); string(got) != content {
		t.Fatalf("result through the second gateway is %d bytes, want the %d input bytes", len(got), len(content))
	}
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var docs, chunks int
	if err := conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM documents WHERE id = $1),
		(SELECT count(*) FROM blob_chunks)`, id).Scan(&docs, &chunks); err != nil {
		t.Fatal(err)
	}
	if docs != 1 || chunks == 0 {
		t.Fatalf("database holds %d rows of the document and %d payload chunks; want 1 and some", docs, chunks)
	}
	// Both gateways' live subscribers (REST NDJSON, from cursor 0) see
	// the same gapless sequence: the one that drove the document and the
	// one that learned of it through LISTEN/NOTIFY.
	var last uint64
	if err := conn.QueryRow(context.Background(), "SELECT last_seq FROM meta").Scan(&last); err != nil || last == 0 {
		t.Fatalf("last_seq %d, %v", last, err)
	}
	for name, sub := range map[string]<-chan uint64{"first": subA, "second": subB} {
		for want := uint64(1); want <= last; want++ {
			select {
			case got := <-sub:
				if got != want {
					t.Fatalf("%s gateway's subscriber: seq %d, want %d (gap, duplicate or reorder)", name, got, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s gateway's subscriber: no seq %d within 30s (last_seq %d)", name, want, last)
			}
		}
	}
}

var seqField = regexp.MustCompile(`"seq":\s*"?(\d+)`)

// subscribe follows base's event stream from cursor 0 and sends each
// event's seq; the stream ends with the test.
func subscribe(t *testing.T, base string) <-chan uint64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/events:subscribe?cursor=0", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		cancel()
		t.Fatalf("subscribe: %s", resp.Status)
	}
	out := make(chan uint64, 1024)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			if m := seqField.FindSubmatch(sc.Bytes()); m != nil {
				n, _ := strconv.ParseUint(string(m[1]), 10, 64)
				select {
				case out <- n:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// TestStoreFlagRefusesUnknownBackend: a --store that is neither empty nor
// postgres:// exits at once with what to write instead, and does not echo
// a password.
func TestStoreFlagRefusesUnknownBackend(t *testing.T) {
	code, stderr, _ := runRefused(t, "serve", "--store", "mysql://root:secret@db/x", "--data-dir", t.TempDir(),
		"--grpc-addr", freePort(t), "--http-addr", freePort(t))
	if code == 0 || !strings.Contains(stderr, "postgres://user:password@host:port/database") {
		t.Fatalf("exit %d, stderr %q; want a refusal naming the postgres:// form", code, stderr)
	}
	if strings.Contains(stderr, "secret") {
		t.Fatalf("the password is echoed: %q", stderr)
	}
}
