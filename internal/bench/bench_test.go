package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pipestream/gateway/internal/bench"
)

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	goleak.VerifyTestMain(m)
}

// TestBenchTiny runs every phase of `gateway bench` with tiny sizes against
// the real binary started as a subprocess, and checks that each phase
// reports its paths, baselines, ratios and the gateway's figures. It checks
// that the bench works, not how fast anything is.
func TestBenchTiny(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/pipestream/gateway/cmd/gateway").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := bench.Run(ctx, bench.Options{
		ServeCommand: []string{bin, "serve"},
		BulkBytes:    4 << 20, Duration: 300 * time.Millisecond, Concurrency: 8,
		Subscribers: 20, FanoutDocsPerSec: 20,
		Progress: &progress,
	})
	if err != nil {
		t.Fatalf("bench: %v\nprogress:\n%s", err, progress.String())
	}
	checkBenchResults(t, rep.Results)
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
	want := map[string]int{"bulk": 5, "small": 3, "churn": 3, "control": 1, "fanout": 1}
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
	for _, r := range byPhase["small"] {
		if r.P50ms <= 0 || r.P99ms < r.P50ms || r.P999ms < r.P99ms {
			t.Errorf("small/%s: percentiles p50 %v p99 %v p99.9 %v", r.Path, r.P50ms, r.P99ms, r.P999ms)
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
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back bench.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(rep.Results) {
		t.Errorf("JSON round trip: %v, %d results", err, len(back.Results))
	}
}

func TestBenchOptionErrors(t *testing.T) {
	for _, o := range []bench.Options{
		{Only: []string{"nope"}},
		{GRPCAddr: "127.0.0.1:1"},
	} {
		if _, err := bench.Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v) = nil error", o)
		}
	}
}
