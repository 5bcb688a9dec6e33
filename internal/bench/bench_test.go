package bench_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pipestream/gateway/internal/bench"
	"github.com/pipestream/gateway/internal/pgtest"
)

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	// pgtest.Run stops the throwaway cluster of TestBenchStorePostgres
	// before goleak looks.
	goleak.VerifyTestMain(pgRunner{m})
}

// pgRunner runs the tests through pgtest.Run so the cluster is stopped.
type pgRunner struct{ m *testing.M }

func (r pgRunner) Run() int { return pgtest.Run(r.m) }

func buildGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/pipestream/gateway/cmd/gateway").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestBenchTiny runs every phase of `gateway bench` with tiny sizes against
// the real binary started as a subprocess, and checks that each phase
// reports its paths, baselines, ratios and the gateway's figures. It checks
// that the bench works, not how fast anything is.
func TestBenchTiny(t *testing.T) {
	bin := buildGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := bench.Run(ctx, bench.Options{
		ServeCommand: []string{bin, "serve"},
		BulkBytes:    4 << 20, Duration: 300 * time.Millisecond, Concurrency: 8,
		Subscribers: 20, FanoutDocsPerSec: 20,
		JetStreamDir: "../../bench/jetstream",
		Progress:     &progress,
	})
	if err != nil {
		t.Fatalf("bench: %v\nprogress:\n%s", err, progress.String())
	}
	checkBenchResults(t, rep.Results)
	checkJetStreamRatios(t, rep.Results)
	checkBenchOutput(t, rep)
}

// checkBenchResults checks that every phase reported its paths with
// positive figures, ratios against the baselines, the gateway's peak RSS
// and ordered percentiles.
func checkBenchResults(t *testing.T, results []bench.Result) {
	t.Helper()
	byPhase := map[string][]bench.Result{}
	for _, r := range results {
		if r.Rate <= 0 || r.Count <= 0 {
			t.Errorf("%s/%s: rate %v count %d, want > 0", r.Phase, r.Path, r.Rate, r.Count)
		}
		byPhase[r.Phase] = append(byPhase[r.Phase], r)
	}
	want := map[string]int{"bulk": 5, "small": 5, "churn": 6, "control": 1, "fanout": 1, "store": 0}
	for p, n := range want {
		if len(byPhase[p]) != n {
			t.Errorf("phase %s: %d results, want %d", p, len(byPhase[p]), n)
		}
	}
	for _, p := range []string{"bulk", "small", "churn"} {
		for _, r := range byPhase[p] {
			if !r.Baseline && len(r.Ratios) == 0 {
				t.Errorf("%s/%s: no ratio against a baseline", p, r.Path)
			}
		}
	}
	for _, p := range []string{"bulk", "small", "fanout"} {
		for _, r := range byPhase[p] {
			if !r.Baseline && r.PeakRSSMiB <= 0 {
				t.Errorf("%s/%s: no gateway peak RSS", p, r.Path)
			}
		}
	}
	for _, r := range byPhase["fanout"] {
		if !strings.Contains(r.Note, "events per gateway write call") {
			t.Errorf("fanout/%s: note %q lacks the events per write", r.Path, r.Note)
		}
	}
	for _, r := range byPhase["churn"] {
		if !strings.Contains(r.Note, "µs of CPU per entity") {
			t.Errorf("churn/%s: note %q lacks the CPU per entity", r.Path, r.Note)
		}
		if !strings.Contains(r.Note, "QUIC packets per entity") {
			t.Errorf("churn/%s: note %q lacks the packets per entity", r.Path, r.Note)
		}
		if r.Path == "quicpeer whole document -> COMPLETE (peer)" && len(r.Ratios) != 2 {
			t.Errorf("churn/%s: ratios %v, want one against each raw baseline (one-way, request/response)", r.Path, r.Ratios)
		}
	}
	for _, r := range byPhase["small"] {
		if r.P50ms <= 0 || r.P99ms < r.P50ms || r.P999ms < r.P99ms {
			t.Errorf("small/%s: percentiles p50 %v p99 %v p99.9 %v", r.Path, r.P50ms, r.P99ms, r.P999ms)
		}
	}
}

// checkJetStreamRatios checks that the small phase ran both JetStream
// baselines (fsync before each ack, and none) and that every gateway path
// has its ratio against each (issue 25: the durable-intake baseline in
// every run).
func checkJetStreamRatios(t *testing.T, results []bench.Result) {
	t.Helper()
	var base []string
	for _, r := range results {
		if r.Phase == "small" && r.Baseline && strings.HasPrefix(r.Path, "JetStream") {
			base = append(base, r.Path)
		}
	}
	if len(base) != 2 {
		t.Fatalf("JetStream baselines %q, want fsync-each and no-fsync", base)
	}
	for _, r := range results {
		if r.Phase != "small" || r.Baseline {
			continue
		}
		for _, b := range base {
			found := false
			for _, q := range r.Ratios {
				found = found || (q.Baseline == b && q.X > 0)
			}
			if !found {
				t.Errorf("small/%s: no ratio against %q (ratios %v)", r.Path, b, r.Ratios)
			}
		}
	}
}

// checkBenchOutput checks the report's notes, table and JSON.
func checkBenchOutput(t *testing.T, rep *bench.Report) {
	t.Helper()
	if n := strings.Count(strings.Join(rep.Notes, "\n"), "from the upload's answer to SUCCEEDED"); n != 2 {
		t.Errorf("notes %q: %d bulk tail notes, want REST and gRPC", rep.Notes, n)
	}
	if !strings.Contains(strings.Join(rep.Notes, " "), "--rate-limit 0") {
		t.Errorf("notes %q do not say the started gateway runs with --rate-limit 0", rep.Notes)
	}
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "raw quic-go") || !strings.Contains(table.String(), "x quic-go") {
		t.Errorf("table lacks the baseline or ratio columns:\n%s", table.String())
	}
	// Each row's note is printed too: the small phase's client CPU and the
	// budget the 0.3x target leaves the gateway (issue 25's bound, in
	// every run).
	for _, want := range []string{"note: small, bare grpc-go unary (plaintext): ", "note: small, gateway gRPC Submit -> SUCCEEDED: the bench's client: ", "leaving the gateway", "note: small, gateway REST POST -> SUCCEEDED: the bench's client: "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back bench.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(rep.Results) {
		t.Errorf("JSON round trip: %v, %d results", err, len(back.Results))
	}
}

// TestBenchProfileDir runs the small phase with --profile-dir and checks
// that a CPU profile of the gateway was written for each gateway path
// (gzip-compressed, as net/http/pprof serves it), and that the option is
// refused for a running gateway.
func TestBenchProfileDir(t *testing.T) {
	bin := buildGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "profiles")
	var progress bytes.Buffer
	if _, err := bench.Run(ctx, bench.Options{
		ServeCommand: []string{bin, "serve"}, Only: []string{"small"},
		Duration: 300 * time.Millisecond, Concurrency: 4, ProfileDir: dir, Progress: &progress,
	}); err != nil {
		t.Fatalf("bench: %v\nprogress:\n%s", err, progress.String())
	}
	for _, name := range []string{"small-grpc.pb.gz", "small-rest.pb.gz"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v\nprogress:\n%s", name, err, progress.String())
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: not gzip: %v", name, err)
		}
		n, err := io.Copy(io.Discard, zr)
		f.Close()
		if err != nil || n == 0 {
			t.Fatalf("%s: %d bytes, %v; want a profile", name, n, err)
		}
	}
	if _, err := bench.Run(ctx, bench.Options{GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2", ProfileDir: dir}); err == nil || !strings.Contains(err.Error(), "--profile-dir") {
		t.Fatalf("ProfileDir with a running gateway: %v, want the --profile-dir refusal", err)
	}
}

func TestBenchOptionErrors(t *testing.T) {
	for _, o := range []bench.Options{
		{Only: []string{"nope"}},
		{GRPCAddr: "127.0.0.1:1"},
		{Only: []string{"store"}},
		{Only: []string{"small"}, Store: "postgres://x@127.0.0.1:1/db"},
		{Store: "mysql://x@127.0.0.1:1/db"},
		{Store: "postgres://x@127.0.0.1:1/db", GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2"},
	} {
		if _, err := bench.Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v) = nil error", o)
		}
	}
}

// TestBenchStorePostgres runs the store phase with tiny sizes: a gateway on
// SQLite, then one on a fresh database of a throwaway PostgreSQL cluster
// (internal/pgtest), and checks both rows, the docs/s and CPU-per-document
// ratios, that the PostgreSQL row's CPU includes the server's, and that the
// table prints it all.
func TestBenchStorePostgres(t *testing.T) {
	bin := buildGateway(t)
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := bench.Run(ctx, bench.Options{
		ServeCommand: []string{bin, "serve"},
		Store:        dsn, Duration: 300 * time.Millisecond, Concurrency: 8,
		Progress: &progress,
	})
	if err != nil {
		t.Fatalf("bench: %v\nprogress:\n%s", err, progress.String())
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results, want SQLite, PostgreSQL and the takeover: %+v", len(rep.Results), rep.Results)
	}
	sq, pg, tk := rep.Results[0], rep.Results[1], rep.Results[2]
	checkTakeover(t, tk)
	rep.Results = rep.Results[:2]
	if !strings.HasSuffix(sq.Path, "SQLite") || !sq.Baseline || !strings.HasSuffix(pg.Path, "PostgreSQL") || pg.Baseline {
		t.Errorf("rows %q (baseline %v), %q (baseline %v); want the SQLite baseline, then PostgreSQL", sq.Path, sq.Baseline, pg.Path, pg.Baseline)
	}
	for _, r := range rep.Results {
		if r.Phase != "store" || r.Rate <= 0 || r.Count <= 0 || r.CPUPerOpUs <= 0 || r.P50ms <= 0 {
			t.Errorf("%s/%s: rate %v count %d CPU %v µs/doc p50 %v ms; want all > 0", r.Phase, r.Path, r.Rate, r.Count, r.CPUPerOpUs, r.P50ms)
		}
	}
	if pg.ServerCPUPerOpUs <= 0 || pg.ServerCPUPerOpUs >= pg.CPUPerOpUs {
		t.Errorf("PostgreSQL server CPU %v µs/doc of %v total: want a positive part of it", pg.ServerCPUPerOpUs, pg.CPUPerOpUs)
	}
	if len(pg.Ratios) != 1 || pg.Ratios[0].Baseline != sq.Path {
		t.Fatalf("PostgreSQL ratios %+v, want one against %q", pg.Ratios, sq.Path)
	}
	if want := pg.Rate / sq.Rate; pg.Ratios[0].X != want {
		t.Errorf("docs/s ratio %v, want %v", pg.Ratios[0].X, want)
	}
	if want := pg.CPUPerOpUs / sq.CPUPerOpUs; pg.CPURatio != want {
		t.Errorf("CPU/doc ratio %v, want %v", pg.CPURatio, want)
	}
	if !strings.Contains(pg.Note, "PostgreSQL server") || !strings.Contains(sq.Note, "gateway process only") {
		t.Errorf("notes %q / %q do not say what the CPU counts", sq.Note, pg.Note)
	}
	rep.Results = append(rep.Results, tk)
	checkStoreOutput(t, rep)
}

// checkTakeover checks the takeover row: every held document taken over by
// the other gateway once the killed one's leases expired (10 s after its last
// renewal, at most 3 s before the kill), within the bench's bound.
func checkTakeover(t *testing.T, tk bench.Result) {
	t.Helper()
	if tk.Phase != "store" || !strings.HasPrefix(tk.Path, "takeover after kill -9") || tk.Unit != "s" || tk.Count != 8 {
		t.Errorf("takeover row %+v: want phase store, path takeover after kill -9, unit s, 8 documents", tk)
	}
	if tk.Rate < 7 || tk.Rate > 90 {
		t.Errorf("all taken over after %.1f s: want no sooner than the lease allows (10 s from the last renewal, renewed every 3 s) and within the bench's 90 s bound", tk.Rate)
	}
	if !strings.Contains(tk.Note, "all terminal") {
		t.Errorf("takeover note %q lacks the time until all were terminal", tk.Note)
	}
}

// checkStoreOutput checks the notes and the table of a store-phase report.
func checkStoreOutput(t *testing.T, rep *bench.Report) {
	t.Helper()
	notes := strings.Join(rep.Notes, "\n")
	for _, want := range []string{"CPU per document on PostgreSQL is", "the gateway process alone", "postmaster pid", "fsync=off", "takeover after kill -9 of a gateway holding 8"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[base] gateway gRPC Submit -> SUCCEEDED, SQLite", "gateway gRPC Submit -> SUCCEEDED, PostgreSQL", "x SQLite docs/s", "CPU/doc ", "takeover after kill -9, 8 held docs"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

// TestBenchSnapshotTiny runs the snapshot phase on 3,000 documents: it
// loads them, starts the gateway on them and streams the whole snapshot
// over REST and gRPC (each path checks that the last chunk carries the
// total); every figure is positive.
func TestBenchSnapshotTiny(t *testing.T) {
	bin := buildGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := bench.Run(ctx, bench.Options{ServeCommand: []string{bin, "serve"}, Only: []string{"snapshot"},
		SnapshotDocs: 3000, Progress: &progress})
	if err != nil {
		t.Fatalf("bench: %v\nprogress:\n%s", err, progress.String())
	}
	want := map[string]string{"start (process to /healthz 200)": "s", "idle RSS": "MiB",
		"REST NDJSON GET /v1/events:streamSnapshot": "MB/s", "gRPC StreamSnapshot": "MB/s"}
	for _, r := range rep.Results {
		if u, ok := want[r.Path]; !ok || r.Unit != u || r.Rate <= 0 {
			t.Errorf("result %+v: unexpected, or not a positive %s", r, u)
		}
		delete(want, r.Path)
	}
	if len(want) > 0 {
		t.Errorf("missing results: %v", want)
	}
	if _, err := bench.Run(ctx, bench.Options{Only: []string{"snapshot"}, GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2"}); err == nil {
		t.Error("the snapshot phase against a running gateway: nil error, want one (it loads its own store)")
	}
}

// TestBenchHistoryTiny runs the history phase on an empty store and on
// stores of 2,000 and 5,000 loaded documents in one run: one row per size,
// the first the baseline, the others with their ratio to it and the
// gateway's CPU per document; a kept --history-dir is reused by a second
// run, which skips the sizes below what the store holds but measures its
// baseline on a fresh store.
func TestBenchHistoryTiny(t *testing.T) {
	bin := buildGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var progress bytes.Buffer
	o := bench.Options{ServeCommand: []string{bin, "serve"}, Only: []string{"history"}, HistoryDocs: []int{0, 2000, 5000},
		HistoryDir: dir, Duration: 300 * time.Millisecond, Concurrency: 8, Progress: &progress}
	rep, err := bench.Run(ctx, o)
	if err != nil {
		t.Fatalf("bench: %v\nprogress:\n%s", err, progress.String())
	}
	paths := []string{"gRPC Submit -> SUCCEEDED, 0 documents stored", "gRPC Submit -> SUCCEEDED, 2k documents stored", "gRPC Submit -> SUCCEEDED, 5k documents stored"}
	if len(rep.Results) != len(paths) {
		t.Fatalf("results %+v, want %d rows", rep.Results, len(paths))
	}
	for i, r := range rep.Results {
		if r.Phase != "history" || r.Path != paths[i] || r.Unit != "docs/s" || r.Rate <= 0 || r.CPUPerOpUs <= 0 || r.Baseline != (i == 0) {
			t.Errorf("row %d: %+v, want %q, a positive docs/s rate and CPU per document", i, r, paths[i])
		}
		if i > 0 && (len(r.Ratios) != 1 || r.Ratios[0].Baseline != paths[0]) {
			t.Errorf("row %d: ratios %v, want one against the empty store", i, r.Ratios)
		}
	}
	o.HistoryDocs = []int{0, 5000, 6000}
	rep, err = bench.Run(ctx, o)
	if err != nil {
		t.Fatalf("second run: %v\nprogress:\n%s", err, progress.String())
	}
	if len(rep.Results) != 2 || rep.Results[0].Path != paths[0] || !rep.Results[0].Baseline ||
		!strings.Contains(rep.Results[1].Path, "6k documents stored") || len(rep.Results[1].Ratios) != 1 {
		t.Errorf("second run on the kept store: %+v, want the baseline on a fresh store and the 6k row (5k is below what it holds)", rep.Results)
	}
	if _, err := bench.Run(ctx, bench.Options{Only: []string{"history"}, GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2"}); err == nil {
		t.Error("the history phase against a running gateway: nil error, want one (it loads its own store)")
	}
}
