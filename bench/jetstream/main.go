// Command jetstream is the durable-intake baseline of `gateway bench`: an
// embedded NATS server with JetStream on file storage, every message synced
// to disk before its ack (SyncAlways), and N publishers of fixed-size
// messages waiting for each ack. It prints one JSON object: the publish
// rate and latency percentiles.
//
// It is its own module so that the gateway binary and go.mod never link
// nats-server; `gateway bench` runs it with `go run -C bench/jetstream .`.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Result is what the command prints (internal/bench decodes it).
type Result struct {
	Path    string  `json:"path"`
	Count   int64   `json:"count"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	P999ms  float64 `json:"p999_ms"`
}

func main() {
	conc := flag.Int("c", 64, "publishers, each waiting for its ack before the next publish")
	size := flag.Int("size", 4096, "message size in bytes")
	dur := flag.Duration("d", 10*time.Second, "how long to publish")
	sync := flag.Bool("sync", true, "fsync every message before its ack (JetStream sync_always)")
	flag.Parse()
	if *conc < 1 || *size < 1 || *dur <= 0 {
		fmt.Fprintln(os.Stderr, "jetstream: -c, -size and -d must be positive")
		os.Exit(2)
	}
	res, err := run(*conc, *size, *dur, *sync)
	if err != nil {
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(1)
	}
}

func run(conc, size int, d time.Duration, syncAlways bool) (Result, error) {
	dir, err := os.MkdirTemp("", "bench-jetstream-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	ns, err := startServer(dir, syncAlways)
	if err != nil {
		return Result{}, err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Result{}, err
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage}); err != nil {
		return Result{}, fmt.Errorf("create stream: %w", err)
	}
	lat, secs, err := publish(ctx, js, conc, make([]byte, size), d)
	if err != nil {
		return Result{}, err
	}
	path := "JetStream publish+ack, file, fsync each"
	if !syncAlways {
		path = "JetStream publish+ack, file, no fsync"
	}
	return summarize(path, lat, secs), nil
}

func startServer(dir string, syncAlways bool) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		SyncAlways: syncAlways, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("nats-server not ready in 10 s")
	}
	return ns, nil
}

// publish runs conc closed-loop publishers for d and returns every
// publish-to-ack latency; the first error stops all.
func publish(ctx context.Context, js jetstream.JetStream, conc int, msg []byte, d time.Duration) ([]time.Duration, float64, error) {
	var (
		mu    sync.Mutex
		all   []time.Duration
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for i := range conc {
		subject := fmt.Sprintf("bench.%d", i)
		wg.Go(func() {
			var lat []time.Duration
			var err error
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if _, err = js.Publish(ctx, subject, msg); err != nil {
					break
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, time.Since(start).Seconds(), first
}

func summarize(path string, lat []time.Duration, secs float64) Result {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	return Result{Path: path, Count: int64(len(lat)), Seconds: secs, Rate: float64(len(lat)) / secs,
		P50ms: pct(0.5), P99ms: pct(0.99), P999ms: pct(0.999)}
}
