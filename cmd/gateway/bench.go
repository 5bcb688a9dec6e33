package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/pipestream/gateway/internal/bench"
)

const benchHelp = `Measure the gateway against bare quic-go and grpc-go baselines in one run
(docs/performance.md). Phases: bulk (one large upload over REST and gRPC vs
a raw quic-go stream copy and a grpc-go TLS stream), small (4 KiB documents
submit -> SUCCEEDED over gRPC and REST vs a grpc-go unary call), churn
(whole entities over one quicpeer connection vs raw quic-go stream churn),
control (STATUS frames/s over one connection), fanout (events delivered to
1,000 WebSocket subscribers), store (with --store: the small-document gRPC
path on SQLite, then on the PostgreSQL database of --store, back to back;
CPU per document counts the gateway plus every PostgreSQL server process,
so the server must run on this machine), snapshot (streaming a preloaded
store of --snapshot-docs documents) and history (the small-document gRPC rate
on stores preloaded with each of --history-docs documents, one run, ratios
against the first size).

Without --grpc-addr/--http-addr it starts this binary as 'gateway serve'
with an embedded peer in a temporary data dir, with --rate-limit 0 (the
default 200 req/s per tenant would cap the phases) and no upload or
subscriber caps, and reports that process's peak RSS and CPU. Progress goes
to stderr, the table (or --json) to stdout.

Example:
  gateway bench
  gateway bench --only bulk --bulk-bytes 1GiB
  gateway bench --only small,fanout --duration 10s --json
  gateway bench --only snapshot --snapshot-docs 1000000
  gateway bench --only history --history-docs 0,100k,1M --duration 5s
  gateway bench --store postgres://postgres@127.0.0.1:5432/bench --duration 5s`

func runBench(args []string) int {
	fs := newFlags("bench", "gateway bench [flags]", benchHelp)
	grpcAddr := fs.String("grpc-addr", "GATEWAY_BENCH_GRPC_ADDR", "", "gRPC address of a running gateway (with --http-addr; empty: start one)")
	httpAddr := fs.String("http-addr", "GATEWAY_BENCH_HTTP_ADDR", "", "HTTP address of a running gateway (with --grpc-addr)")
	token := fs.String("token", "GATEWAY_TOKEN", "", "bearer token for a running gateway")
	only := fs.String("only", "GATEWAY_BENCH_ONLY", "", "comma list of phases to run, from "+strings.Join(bench.Phases, ",")+" (empty: all but store and snapshot; with --store: store)")
	store := fs.String("store", "GATEWAY_BENCH_STORE", "", "postgres:// URL of a PostgreSQL server on this machine: run the store phase (small documents on SQLite, then on this database, CPU of the gateway plus the PostgreSQL server)")
	bulkBytes := fs.Int64("bulk-bytes", "GATEWAY_BENCH_BULK_BYTES", bench.DefaultBulkBytes, "size of the bulk document")
	smallBytes := fs.Int64("small-bytes", "GATEWAY_BENCH_SMALL_BYTES", bench.DefaultSmallBytes, "size of each small document")
	entityBytes := fs.Int64("entity-bytes", "GATEWAY_BENCH_ENTITY_BYTES", bench.DefaultEntityBytes, "payload of each entity in the churn phase")
	conc := fs.Uint("concurrency", "GATEWAY_BENCH_CONCURRENCY", bench.DefaultConcurrency, "operations in flight (small and churn phases)")
	dur := fs.Duration("duration", "GATEWAY_BENCH_DURATION", bench.DefaultDuration, "length of each timed run (small, churn, control, fanout; every path and baseline)")
	subs := fs.Uint("subscribers", "GATEWAY_BENCH_SUBSCRIBERS", bench.DefaultSubscribers, "WebSocket subscribers in the fanout phase")
	rate := fs.Uint("fanout-docs", "GATEWAY_BENCH_FANOUT_DOCS", bench.DefaultFanoutDocs, "documents per second submitted in the fanout phase")
	snapDocs := fs.Uint("snapshot-docs", "GATEWAY_BENCH_SNAPSHOT_DOCS", bench.DefaultSnapshotDocs, "documents the snapshot phase loads before it starts the gateway")
	histDocs := fs.String("history-docs", "GATEWAY_BENCH_HISTORY_DOCS", "0,100k,1M", "store sizes of the history phase, ascending (comma list; k and M suffixes): the small-document gRPC rate on a store preloaded with each many documents, the first size the baseline")
	histDir := fs.String("history-dir", "GATEWAY_BENCH_HISTORY_DIR", "", "keep the history phase's store in this directory; a later run goes on from what it holds (empty: a temporary one)")
	snapDir := fs.String("snapshot-dir", "GATEWAY_BENCH_SNAPSHOT_DIR", "", "keep the snapshot phase's store in this directory and reuse it in later runs (empty: a temporary one)")
	jsDir := fs.String("jetstream-dir", "GATEWAY_BENCH_JETSTREAM_DIR", bench.DefaultJetStreamDir, "module of the durable-intake baseline (NATS JetStream, fsync before each ack) run with `go run` in the small phase; empty: skip it")
	asJSON := fs.Bool("json", "GATEWAY_BENCH_JSON", false, "print JSON instead of the table")
	pprofAddr := fs.String("pprof-addr", "GATEWAY_BENCH_PPROF_ADDR", "", "pass --pprof-addr to the started gateway (profile it while the bench runs)")
	embedded := fs.String("embedded-peer-transport", "GATEWAY_BENCH_EMBEDDED_PEER_TRANSPORT", "inproc", "pass --embedded-peer-transport to the started gateway: inproc (its default) or quic (the embedded peer on a loopback UDP port)")
	cpuProfile := fs.String("cpuprofile", "GATEWAY_BENCH_CPUPROFILE", "", "write a CPU profile of the bench process (baselines, churn, control) to this file")
	profileDir := fs.String("profile-dir", "GATEWAY_BENCH_PROFILE_DIR", "", "write a CPU profile of the started gateway over each gateway path of the small phase to this directory (small-grpc.pb.gz, small-rest.pb.gz; read with go tool pprof)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gateway bench: unexpected argument %q (flags only; see --help)\n", fs.Arg(0))
		return 2
	}
	history, err := parseCounts(*histDocs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway bench: --history-docs: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, bench.Options{
		GRPCAddr: *grpcAddr, HTTPAddr: *httpAddr, Token: *token,
		PprofAddr: *pprofAddr, EmbeddedPeerTransport: *embedded, CPUProfile: *cpuProfile, ProfileDir: *profileDir,
		Only: splitList(*only), Store: *store,
		BulkBytes: *bulkBytes, SmallBytes: *smallBytes, EntityBytes: *entityBytes,
		Concurrency: int(*conc), Duration: *dur, Subscribers: int(*subs), FanoutDocsPerSec: int(*rate),
		SnapshotDocs: int(min(*snapDocs, 1<<30)), SnapshotDir: *snapDir, HistoryDocs: history, HistoryDir: *histDir,
		JetStreamDir: *jsDir,
		Progress:     os.Stderr,
	})
	if err != nil {
		if rep != nil && len(rep.Results) > 0 {
			_ = rep.WriteTable(os.Stderr)
		}
		return fail(os.Stderr, "bench", err)
	}
	if *asJSON {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteTable(os.Stdout)
	}
	if err != nil {
		return fail(os.Stderr, "bench", err)
	}
	return 0
}

// parseCounts parses a comma list of document counts such as "0,100k,1M".
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, v := range splitList(s) {
		mul := 1
		switch {
		case strings.HasSuffix(v, "k"):
			mul, v = 1000, strings.TrimSuffix(v, "k")
		case strings.HasSuffix(v, "M"):
			mul, v = 1_000_000, strings.TrimSuffix(v, "M")
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 0 || n*float64(mul) > 1<<30 {
			return nil, fmt.Errorf("%q is not a document count from 0 to 2^30 (such as 0, 100k or 1M)", v)
		}
		out = append(out, int(n*float64(mul)))
	}
	return out, nil
}

// splitList splits a comma list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
