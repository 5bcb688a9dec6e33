package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	b.note("store: CPU per document on PostgreSQL is %.2fx SQLite's (%.0f µs, of which the PostgreSQL server %.0f, vs %.0f µs; target <= 1.5x), docs/s %.2fx (%.0f vs %.0f)",
		postgres.CPURatio, postgres.CPUPerOpUs, postgres.ServerCPUPerOpUs, sqlite.CPUPerOpUs, rateX(postgres), postgres.Rate, sqlite.Rate)
	b.note("store: CPU = gateway process utime+stime; on PostgreSQL plus the PostgreSQL server's (postmaster pid %d and all its children, live ones from /proc/<pid>/stat, exited ones through the postmaster's cutime/cstime) over the same interval; %s", pg.postmaster, pg.settings)
	return nil
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
func (b *runner) storeRun(ctx context.Context, name string, extra []string, pg *pgServer, withPG bool, payload []byte) (Result, error) {
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
	pgBefore, err := pg.cpu()
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
	pgAfter, err := pg.cpu()
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
		r.Note = fmt.Sprintf("CPU: gateway process + PostgreSQL server (postmaster %d and children); the server alone: %.0f µs/doc", pg.postmaster, r.ServerCPUPerOpUs)
	}
	return r, nil
}

func perOp(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}

// pgServer is the local PostgreSQL server behind a --store URL.
type pgServer struct {
	postmaster int
	settings   string // fsync and synchronous_commit as the server reports them
}

// findPostgres connects to url, asks for the backend's pid and takes its
// parent as the postmaster. It refuses a server whose processes it cannot
// see in /proc (another machine or another pid namespace): its CPU could
// not be counted.
func findPostgres(ctx context.Context, url string) (*pgServer, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("--store: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	var (
		backend           int
		fsync, syncCommit string
	)
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&backend, &fsync, &syncCommit); err != nil {
		return nil, fmt.Errorf("--store: ask PostgreSQL for its backend pid: %w", err)
	}
	notLocal := fmt.Errorf("--store: PostgreSQL backend pid %d is not a postgres process on this machine; the store bench counts the server's CPU from /proc, so run PostgreSQL here (same pid namespace)", backend)
	st, err := readStat(backend)
	if err != nil || !strings.HasPrefix(st.comm, "postgres") {
		return nil, notLocal
	}
	pm, err := readStat(st.ppid)
	if err != nil || !strings.HasPrefix(pm.comm, "postgres") {
		return nil, notLocal
	}
	return &pgServer{postmaster: st.ppid, settings: fmt.Sprintf("server fsync=%s synchronous_commit=%s", fsync, syncCommit)}, nil
}

// cpu is the CPU time of the postmaster, its live children and its reaped
// children so far.
func (p *pgServer) cpu() (time.Duration, error) {
	pm, err := readStat(p.postmaster)
	if err != nil {
		return 0, fmt.Errorf("PostgreSQL postmaster %d: %w", p.postmaster, err)
	}
	ticks := pm.utime + pm.stime + pm.cutime + pm.cstime
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s, err := readStat(pid)
		if err != nil || s.ppid != p.postmaster {
			continue // gone meanwhile, or not a child
		}
		ticks += s.utime + s.stime
	}
	return time.Duration(ticks) * time.Second / clkTck, nil
}

// procStat holds the fields of /proc/<pid>/stat the bench uses.
type procStat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseStat parses /proc/<pid>/stat: "pid (comm) state ppid ... utime
// stime cutime cstime ..." (fields 14 to 17); comm may hold spaces and
// parentheses, so the fields after it are found from the last ')'.
func parseStat(b []byte) (procStat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, errors.New("malformed /proc stat line")
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return procStat{}, errors.New("short /proc stat line")
	}
	s := procStat{comm: string(b[open+1 : end])}
	var err error
	num := func(i int) int64 {
		v, e := strconv.ParseInt(f[i], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("/proc stat field %d: %w", i+3, e)
		}
		return v
	}
	// f[0] is field 3 (state): field n is f[n-3].
	s.ppid = int(num(1))
	s.utime, s.stime, s.cutime, s.cstime = num(11), num(12), num(13), num(14)
	return s, err
}
