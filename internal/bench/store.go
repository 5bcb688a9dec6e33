package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pipestream/gateway/internal/cputime"
)

// store compares the small-document path on the two store backends in one
// run: a gateway on SQLite in its data dir, then a gateway on the
// PostgreSQL database of Options.Store, each fed 4 KiB documents over gRPC
// SubmitDocument -> SUCCEEDED at Options.Concurrency for Options.Duration.
//
// CPU per document counts everything that serves the document: for SQLite
// the gateway process (the database is a library inside it); for
// PostgreSQL the gateway process plus the PostgreSQL server, i.e. the
// postmaster and all its children (backends, WAL writer, checkpointer, ...)
// read from /proc/<pid>/stat, with exited children counted through the
// postmaster's cutime/cstime. The server must therefore run on this machine.
func (b *runner) store(ctx context.Context) error {
	pg, err := findPostgres(ctx, b.o.Store)
	if err != nil {
		return err
	}
	payload := patternBlock[:b.o.SmallBytes]
	base := "gateway gRPC Submit -> SUCCEEDED, "
	var sqlite, postgres Result
	for _, backend := range []string{"sqlite", "postgres"} {
		var extra []string
		name := base + "SQLite"
		if backend == "postgres" {
			extra = []string{"--store", b.o.Store}
			name = base + "PostgreSQL"
		}
		b.progress("  %s: start a gateway, %d in flight, %s", name, b.o.Concurrency, b.o.Duration)
		r, err := b.storeRun(ctx, name, extra, pg, backend == "postgres", payload)
		if err != nil {
			return fmt.Errorf("%s: %w", backend, err)
		}
		if backend == "sqlite" {
			sqlite = r
		} else {
			postgres = r
		}
	}
	sqlite.Baseline = true
	if sqlite.Rate > 0 {
		postgres.Ratios = []Ratio{{Baseline: sqlite.Path, X: postgres.Rate / sqlite.Rate}}
	}
	if sqlite.CPUPerOpUs > 0 {
		postgres.CPURatio = postgres.CPUPerOpUs / sqlite.CPUPerOpUs
	}
	b.add(sqlite)
	b.add(postgres)
	b.progress("  takeover: two gateways on the store, %d held documents, kill -9 one", takeoverDocs)
	tk, err := b.takeover(ctx)
	if err != nil {
		return fmt.Errorf("takeover: %w", err)
	}
	b.add(tk)
	gatewayOnly := postgres.CPUPerOpUs - postgres.ServerCPUPerOpUs
	b.note("store: CPU per document on PostgreSQL is %.2fx SQLite's (%.0f µs, of which the PostgreSQL server %.0f, vs %.0f µs; target <= 1.5x); the gateway process alone %.0f µs, %.2fx; docs/s %.2fx (%.0f vs %.0f)",
		postgres.CPURatio, postgres.CPUPerOpUs, postgres.ServerCPUPerOpUs, sqlite.CPUPerOpUs,
		gatewayOnly, ratio(gatewayOnly, sqlite.CPUPerOpUs), rateX(postgres), postgres.Rate, sqlite.Rate)
	b.note("store: CPU = gateway process utime+stime; on PostgreSQL plus the PostgreSQL server's (postmaster pid %d and all its children, live ones from /proc/<pid>/stat, exited ones through the postmaster's cutime/cstime) over the same interval; %s", pg.Postmaster, pg.Settings)
	return nil
}

// ratio is a/b, 0 when b is.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func rateX(r Result) float64 {
	if len(r.Ratios) == 0 {
		return 0
	}
	return r.Ratios[0].X
}

// storeRun starts a gateway with extra serve flags, runs the small-document
// load over gRPC and returns its row; with withPG the PostgreSQL server's
// CPU is added to the gateway's.
func (b *runner) storeRun(ctx context.Context, name string, extra []string, pg *cputime.Postgres, withPG bool, payload []byte) (Result, error) {
	o := b.o
	o.GRPCAddr, o.HTTPAddr = "", ""
	g, err := connectGateway(ctx, o, extra...)
	if err != nil {
		return Result{}, err
	}
	defer g.close()
	var (
		lat  []time.Duration
		secs float64
	)
	pgBefore, err := pg.CPU()
	if err != nil {
		return Result{}, err
	}
	ps, ok, err := g.measure(func() (err error) {
		lat, secs, err = g.smallDocs(ctx, "grpc", payload, o.Concurrency, o.Duration)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("%w\n%s", err, g.logTail())
	}
	pgAfter, err := pg.CPU()
	if err != nil {
		return Result{}, err
	}
	if withPG {
		ps.cpu += pgAfter - pgBefore
	}
	r := latResult("store", name, false, lat, secs)
	fill(&r, ps, ok, int64(len(lat)), secs)
	r.Note = "CPU: gateway process only (SQLite runs inside it)"
	if withPG {
		r.ServerCPUPerOpUs = perOp(pgAfter-pgBefore, len(lat))
		r.Note = fmt.Sprintf("CPU: gateway process + PostgreSQL server (postmaster %d and children); the server alone: %.0f µs/doc", pg.Postmaster, r.ServerCPUPerOpUs)
	}
	return r, nil
}

// findPostgres is cputime.FindPostgres for the --store URL, bounded by startTimeout.
func findPostgres(ctx context.Context, url string) (*cputime.Postgres, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	pg, err := cputime.FindPostgres(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	return pg, nil
}

func perOp(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}
