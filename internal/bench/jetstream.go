package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// DefaultJetStreamDir is where `gateway bench` looks for the durable-intake
// baseline's module, relative to the working directory (the repository
// root when run as `go run ./cmd/gateway bench`).
const DefaultJetStreamDir = "bench/jetstream"

// jetStreamResult is what bench/jetstream prints.
type jetStreamResult struct {
	Path    string  `json:"path"`
	Count   int64   `json:"count"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	P999ms  float64 `json:"p999_ms"`
}

// jetStreamBaseline runs the durable-intake baseline (bench/jetstream, its
// own module so the gateway never links nats-server) with the small phase's
// concurrency, message size and duration, and returns it as a baseline of
// the small phase. The first run compiles nats-server (about a minute on
// two cores), which the measurement does not include: the command measures
// itself once its server is up.
func (b *runner) jetStreamBaseline(ctx context.Context, fsync bool) (Result, error) {
	dir, err := filepath.Abs(b.o.JetStreamDir)
	if err != nil {
		return Result{}, err
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return Result{}, fmt.Errorf("%w: no go.mod in %s (run from the repository root, or pass --jetstream-dir)", errNoJetStream, dir)
	}
	args := []string{"run", "-C", dir, ".",
		"-c", strconv.Itoa(b.o.Concurrency), "-size", strconv.FormatInt(b.o.SmallBytes, 10),
		"-d", b.o.Duration.String(), "-sync=" + strconv.FormatBool(fsync)}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.WaitDelay = 10 * time.Second
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return Result{}, fmt.Errorf("go %v: %w: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var r jetStreamResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return Result{}, fmt.Errorf("bench/jetstream printed %q: %w", out.String(), err)
	}
	if r.Count == 0 {
		return Result{}, errors.New("bench/jetstream published nothing")
	}
	return Result{Phase: "small", Path: r.Path, Baseline: true, Unit: "docs/s", Rate: r.Rate,
		Count: r.Count, Seconds: r.Seconds, P50ms: r.P50ms, P99ms: r.P99ms, P999ms: r.P999ms}, nil
}

// errNoJetStream marks a missing baseline module: the bench notes it and
// goes on (an installed binary has no source tree).
var errNoJetStream = errors.New("JetStream baseline unavailable")

// jetStreamBaselines adds the fsync-per-ack and the no-fsync JetStream
// baselines to the small phase, or a note saying why they are missing.
func (b *runner) jetStreamBaselines(ctx context.Context) error {
	if b.o.JetStreamDir == "" {
		b.note("JetStream baseline off (--jetstream-dir empty)")
		return nil
	}
	for _, fsync := range []bool{true, false} {
		b.progress("  JetStream publish+ack (fsync each: %v), %d publishers, %s", fsync, b.o.Concurrency, b.o.Duration)
		r, err := b.jetStreamBaseline(ctx, fsync)
		if errors.Is(err, errNoJetStream) {
			b.note("%v", err)
			return nil
		}
		if err != nil {
			return fmt.Errorf("JetStream baseline: %w", err)
		}
		b.add(r)
	}
	return nil
}
