package eventlog_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// BenchmarkSnapshotLargeStore loads SNAPSHOT_BENCH_DOCS small documents
// (default 1,000,000) with one event each into a SQLite store (64
// concurrent commits, grouped by the store's writer), reopens it, and
// reports the start time (store open + event log load), the heap and RSS
// when idle after the start, and the throughput of streaming the whole
// snapshot (encoded chunk bytes per second, every chunk proto-marshaled as
// the gRPC transport would):
//
//	go test -run '^$' -bench BenchmarkSnapshotLargeStore -benchtime 1x ./bridge/eventlog
func BenchmarkSnapshotLargeStore(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("SNAPSHOT_BENCH_DOCS")); err == nil && v > 0 {
		n = v
	}
	page := 500
	if v, err := strconv.Atoi(os.Getenv("SNAPSHOT_BENCH_PAGE")); err == nil && v > 0 {
		page = v
	}
	dir := b.TempDir()
	ctx := context.Background()
	load := time.Now()
	loadDocs(b, dir, n)
	b.Logf("loaded %d documents in %v", n, time.Since(load).Round(time.Millisecond))

	runtime.GC()
	debug.FreeOSMemory()
	rss0 := rssBytes()
	t0 := time.Now()
	st, err := sqlite.Open(ctx, dir, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	l, err := eventlog.New(ctx, st, eventlog.Options{DisablePruner: true})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	startTime := time.Since(t0)
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	idleHeap, idleRSS := ms.HeapInuse, rssBytes()

	b.ResetTimer()
	var bytes, docs int64
	for range b.N {
		err := l.StreamSnapshot(ctx, "t", page, func(seq uint64, page []*gatewayv1.Document) error {
			c, err := proto.Marshal(&gatewayv1.SnapshotChunk{Seq: seq, Documents: page})
			bytes += int64(len(c))
			docs += int64(len(page))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	el := b.Elapsed()
	if docs != int64(n)*int64(b.N) {
		b.Fatalf("streamed %d documents, want %d", docs, int64(n)*int64(b.N))
	}
	b.ReportMetric(startTime.Seconds(), "start-s")
	b.ReportMetric(float64(idleHeap)/(1<<20), "idle-heap-MiB")
	b.ReportMetric(float64(idleRSS-rss0)/(1<<20), "idle-rss-growth-MiB")
	b.ReportMetric(float64(idleRSS)/(1<<20), "idle-rss-MiB")
	b.ReportMetric(float64(bytes)/el.Seconds()/1e6, "snapshot-MB/s")
	b.ReportMetric(float64(docs)/el.Seconds(), "docs/s")
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-after-stream-MiB")
}

// loadDocs writes n small documents with one #document event each.
func loadDocs(b *testing.B, dir string, n int) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, dir, sqlite.Options{Synchronous: "NORMAL"})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	created := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	const workers = 64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				id := fmt.Sprintf("d-%08d", i)
				ct := timestamppb.New(created.Add(time.Duration(i) * time.Millisecond))
				rec := &store.DocumentRecord{Tenant: "t", BodyHash: []byte(id), ContentPayload: true, Doc: &gatewayv1.Document{
					Name: "documents/" + id, Id: id, State: gatewayv1.State_SUCCEEDED, Rev: 1, ContentType: "text/plain",
					DisplayName: id + ".txt", SizeBytes: 42, CreateTime: ct, UpdateTime: ct}}
				ev := &gatewayv1.Event{Time: ct, Kind: "#document", DocumentId: id, Rev: 1}
				if _, err := st.Commit(ctx, &store.Batch{Create: rec, Events: []store.EventAppend{{Tenant: "t", Event: ev}}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// rssBytes is this process's resident set size (Linux).
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
