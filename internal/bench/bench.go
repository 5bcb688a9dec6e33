// Package bench is `gateway bench`: it measures the gateway's paths (bulk
// upload, small documents, entity churn, control frames, event fan-out)
// against bare quic-go and grpc-go baselines run in the same process and the
// same run, and reports rates, latency percentiles, ratios, and the gateway
// process's peak RSS and CPU. docs/performance.md has the numbers and how
// to read them.
//
// By default it starts the real binary (`<this executable> serve`) as a
// subprocess with an embedded peer in a temporary data directory, so the
// gateway's resident memory (VmHWM) and CPU time (utime+stime) can be read
// from /proc/<pid> without counting the load generator. With GRPCAddr and
// HTTPAddr it drives a running gateway instead (no RSS/CPU figures then).
package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

// Phases in the order they run.
// "store" runs only with Options.Store and is the default phase then.
var Phases = []string{"bulk", "small", "churn", "control", "fanout", "store", "snapshot", "history"}

// optIn are the phases that run only when named in Only.
var optIn = []string{"store", "snapshot", "history"}

// Options configure a run. Zero values take the defaults in params.go.
type Options struct {
	// GRPCAddr and HTTPAddr select a running gateway (both or neither);
	// empty: start one. Token is sent as a bearer token to it.
	GRPCAddr, HTTPAddr, Token string
	// ServeCommand is the argv prefix that starts a gateway (default:
	// this executable and "serve"); the bench appends listen addresses,
	// data dir and limits.
	ServeCommand []string
	// PprofAddr, when set, is passed to the started gateway as
	// --pprof-addr so it can be profiled while the bench runs.
	PprofAddr string
	// EmbeddedPeerTransport is passed to the started gateway as
	// --embedded-peer-transport (inproc or quic; empty: the gateway's
	// default, inproc).
	EmbeddedPeerTransport string
	// CPUProfile, when set, writes a CPU profile of the bench process
	// (baselines, churn and control phases run in it).
	CPUProfile string
	// ProfileDir, when set, receives a CPU profile of the started gateway
	// over each gateway path of the small phase, small-grpc.pb.gz and
	// small-rest.pb.gz (read with `go tool pprof`). The gateway is given a
	// --pprof-addr on a free loopback port unless PprofAddr is set.
	ProfileDir string
	// Only lists the phases to run (default: all but store, snapshot and history; with Store:
	// store alone).
	Only []string
	// Store is a postgres:// URL: the store phase compares the
	// small-document path on SQLite and on this database, back to back,
	// counting the PostgreSQL server's CPU too (it must run on this
	// machine).
	Store string

	BulkBytes, SmallBytes, EntityBytes int64
	Concurrency                        int
	Duration                           time.Duration
	Subscribers                        int
	FanoutDocsPerSec                   int
	// SnapshotDocs is how many documents the snapshot phase loads.
	SnapshotDocs int
	// SnapshotDir, when set, keeps the snapshot phase's store there: the
	// first run loads it, later runs reuse it (start time without the load).
	SnapshotDir string
	// HistoryDocs are the store sizes of the history phase, ascending
	// (default DefaultHistoryDocs): the small-document rate is measured
	// on a store preloaded with each many documents.
	HistoryDocs []int
	// HistoryDir, when set, keeps the history phase's store there; a later
	// run goes on from the documents it holds (sizes below are skipped).
	HistoryDir string

	// JetStreamDir is the bench/jetstream module (the durable-intake
	// baseline of the small phase: NATS JetStream on file storage, fsync
	// before each ack); empty turns the baseline off.
	JetStreamDir string

	// Progress receives progress lines (default io.Discard).
	Progress io.Writer
}

// checkStore validates Options.Store against the selected phases.
func (o *Options) checkStore() error {
	wantStore := slices.Contains(o.Only, "store")
	switch {
	case wantStore && o.Store == "":
		return errors.New("phase store needs --store postgres://user:password@host:port/database (a PostgreSQL server on this machine)")
	case !wantStore && o.Store != "":
		return errors.New("--store runs the store phase: add store to --only, or leave --only empty")
	case o.Store != "" && !strings.HasPrefix(o.Store, "postgres://") && !strings.HasPrefix(o.Store, "postgresql://"):
		return fmt.Errorf("--store must be a postgres:// URL (the store phase compares PostgreSQL with SQLite), not %q", redact(o.Store))
	case wantStore && o.GRPCAddr != "":
		return errors.New("the store phase starts its own gateways (one per backend): leave --grpc-addr/--http-addr empty")
	}
	return nil
}

// redact hides a URL's password.
func redact(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	userinfo, host, ok2 := strings.Cut(rest, "@")
	if !ok || !ok2 {
		return url
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return scheme + "://" + user + ":***@" + host
	}
	return url
}

func (o *Options) setDefaults() error {
	if (o.GRPCAddr == "") != (o.HTTPAddr == "") {
		return errors.New("set both --grpc-addr and --http-addr to drive a running gateway, or neither to start one")
	}
	if err := o.setProfileDir(); err != nil {
		return err
	}
	o.setSizes()
	if len(o.HistoryDocs) == 0 {
		o.HistoryDocs = slices.Clone(DefaultHistoryDocs)
	}
	if !slices.IsSorted(o.HistoryDocs) || o.HistoryDocs[0] < 0 {
		return fmt.Errorf("history sizes must be ascending and not negative: %v", o.HistoryDocs)
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if len(o.Only) == 0 {
		o.Only = slices.DeleteFunc(slices.Clone(Phases), func(p string) bool { return slices.Contains(optIn, p) })
		if o.Store != "" {
			o.Only = []string{"store"}
		}
	}
	for _, p := range o.Only {
		if !slices.Contains(Phases, p) {
			return fmt.Errorf("unknown phase %q: pick from %s", p, strings.Join(Phases, ","))
		}
	}
	if err := o.checkStore(); err != nil {
		return err
	}
	if len(o.ServeCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this executable to start the gateway: %w", err)
		}
		o.ServeCommand = []string{exe, "serve"}
	}
	return nil
}

// setProfileDir checks --profile-dir and picks a pprof address for the
// gateway the bench starts.
func (o *Options) setProfileDir() error {
	if o.ProfileDir == "" {
		return nil
	}
	if o.GRPCAddr != "" {
		return errors.New("--profile-dir profiles the gateway the bench starts; to profile a running one, start it with --pprof-addr and fetch /debug/pprof/profile")
	}
	if err := os.MkdirAll(o.ProfileDir, 0o750); err != nil {
		return fmt.Errorf("--profile-dir: %w", err)
	}
	if o.PprofAddr == "" {
		a, err := freePort()
		if err != nil {
			return err
		}
		o.PprofAddr = a
	}
	return nil
}

// setSizes fills the sizes, rates and counts left at zero.
func (o *Options) setSizes() {
	if o.BulkBytes <= 0 {
		o.BulkBytes = DefaultBulkBytes
	}
	if o.SmallBytes <= 0 {
		o.SmallBytes = DefaultSmallBytes
	}
	if o.EntityBytes <= 0 {
		o.EntityBytes = DefaultEntityBytes
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Duration <= 0 {
		o.Duration = DefaultDuration
	}
	if o.Subscribers <= 0 {
		o.Subscribers = DefaultSubscribers
	}
	if o.FanoutDocsPerSec <= 0 {
		o.FanoutDocsPerSec = DefaultFanoutDocs
	}
	if o.SnapshotDocs <= 0 {
		o.SnapshotDocs = DefaultSnapshotDocs
	}
}

// Result is one measured path.
type Result struct {
	Phase string `json:"phase"`
	Path  string `json:"path"`
	// Baseline marks a bare quic-go / grpc-go reference run.
	Baseline bool    `json:"baseline"`
	Unit     string  `json:"unit"`
	Rate     float64 `json:"rate"`
	Count    int64   `json:"count"`
	Seconds  float64 `json:"seconds"`
	// Latency percentiles in milliseconds (small documents).
	P50ms  float64 `json:"p50_ms,omitempty"`
	P99ms  float64 `json:"p99_ms,omitempty"`
	P999ms float64 `json:"p999_ms,omitempty"`
	// Ratios of Rate to each baseline of the phase.
	Ratios []Ratio `json:"ratios,omitempty"`
	// Gateway process figures during this path (started gateway only).
	PeakRSSMiB   float64 `json:"gateway_peak_rss_mib,omitempty"`
	CPUPerOpUs   float64 `json:"gateway_cpu_us_per_op,omitempty"`
	GatewayCPUPc float64 `json:"gateway_cpu_percent,omitempty"`
	// CPURatio is CPUPerOpUs over the baseline's (store phase: PostgreSQL
	// over SQLite, database server CPU included).
	CPURatio float64 `json:"cpu_per_op_x,omitempty"`
	// ServerCPUPerOpUs is the part of CPUPerOpUs spent in a separate
	// database server's processes (store phase, PostgreSQL).
	ServerCPUPerOpUs float64 `json:"db_server_cpu_us_per_op,omitempty"`
	Note             string  `json:"note,omitempty"`
}

// Ratio compares a path with one baseline.
type Ratio struct {
	Baseline string  `json:"baseline"`
	X        float64 `json:"x"`
}

// Report is the outcome of Run.
type Report struct {
	Machine string   `json:"machine"`
	Gateway string   `json:"gateway"`
	Results []Result `json:"results"`
	Notes   []string `json:"notes,omitempty"`
}

// Run runs the selected phases and returns their results. It stops the
// gateway it started before returning.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	r := &Report{Machine: machine()}
	b := &runner{o: o, rep: r}
	needGateway := slices.ContainsFunc(o.Only, func(p string) bool { return p == "bulk" || p == "small" || p == "fanout" })
	if needGateway {
		g, err := connectGateway(ctx, o)
		if err != nil {
			return nil, err
		}
		defer g.close()
		b.gw = g
		r.Gateway = g.describe()
		if g.cmd != nil {
			r.Notes = append(r.Notes, "the bench started its own gateway with --rate-limit 0 (the default per-tenant limit of 200 req/s would cap the small-document and fan-out phases) and without upload or subscriber caps; its embedded peer over --embedded-peer-transport "+cmp.Or(o.EmbeddedPeerTransport, "inproc"))
		} else {
			r.Notes = append(r.Notes, "driving a running gateway: its --rate-limit (default 200 req/s per tenant) and subscriber caps apply; start it with --rate-limit 0 --max-subscribers-per-tenant 0 to measure the gateway itself")
		}
	}
	for _, p := range Phases {
		if !slices.Contains(o.Only, p) {
			continue
		}
		b.progress("phase %s", p)
		var err error
		switch p {
		case "bulk":
			err = b.bulk(ctx)
		case "small":
			err = b.small(ctx)
		case "churn":
			err = b.churn(ctx)
		case "control":
			err = b.control(ctx)
		case "fanout":
			err = b.fanout(ctx)
		case "store":
			err = b.store(ctx)
		case "snapshot":
			err = b.snapshot(ctx)
		case "history":
			err = b.history(ctx)
		}
		if err != nil {
			return r, fmt.Errorf("phase %s: %w", p, err)
		}
	}
	return r, nil
}

// runner carries the state shared by the phases.
type runner struct {
	o   Options
	rep *Report
	gw  *gatewayProc
}

func (b *runner) progress(format string, args ...any) {
	fmt.Fprintf(b.o.Progress, "bench: "+format+"\n", args...)
}

// note adds a line to the report's notes.
func (b *runner) note(format string, args ...any) {
	b.rep.Notes = append(b.rep.Notes, fmt.Sprintf(format, args...))
}

func (b *runner) add(r Result) {
	b.rep.Results = append(b.rep.Results, r)
	b.progress("  %-34s %10.1f %s", r.Path, r.Rate, r.Unit)
}

// ratios fills the Ratios of every non-baseline result of phase against
// every baseline of the phase.
func (b *runner) ratios(phase string) {
	var base []Result
	for _, r := range b.rep.Results {
		if r.Phase == phase && r.Baseline && r.Rate > 0 {
			base = append(base, r)
		}
	}
	for i := range b.rep.Results {
		r := &b.rep.Results[i]
		if r.Phase != phase || r.Baseline {
			continue
		}
		r.Ratios = r.Ratios[:0]
		for _, bl := range base {
			if bl.Unit == r.Unit {
				r.Ratios = append(r.Ratios, Ratio{Baseline: bl.Path, X: r.Rate / bl.Rate})
			}
		}
	}
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok && model == "" {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
			}
		}
		if strings.Contains(string(b), " sha_ni") {
			model += ", sha_ni"
		} else {
			model += ", no sha_ni"
		}
	}
	return fmt.Sprintf("%s/%s, %d CPUs, %s, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), model, runtime.Version())
}

// since is the elapsed time since t in seconds, never zero.
func since(t time.Time) float64 { return max(time.Since(t).Seconds(), 1e-9) }
