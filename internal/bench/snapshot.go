package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// snapshot is issue 24's large-store phase: it writes SnapshotDocs small
// documents (one #document event each) straight into a SQLite store in
// big concurrent batches, starts a gateway on that data dir, and reports
// the start time (process start to /healthz 200), the idle RSS, and the
// throughput of streaming the whole snapshot over REST (NDJSON bytes) and
// gRPC (message bytes). It needs a gateway it starts itself.
func (b *runner) snapshot(ctx context.Context) error {
	if b.o.GRPCAddr != "" {
		return errors.New("the snapshot phase loads its own store: run it without --grpc-addr/--http-addr")
	}
	dir, keep := b.o.SnapshotDir, b.o.SnapshotDir != ""
	if !keep {
		var err error
		if dir, err = os.MkdirTemp("", "gateway-bench-snapshot-"); err != nil {
			return err
		}
	}
	n := b.o.SnapshotDocs
	if _, err := os.Stat(filepath.Join(dir, "data", "gateway.db")); keep && err == nil {
		b.note("snapshot: reusing the store in %s (loaded by an earlier run with --snapshot-docs %d)", dir, n)
	} else {
		b.progress("  loading %d documents", n)
		t0 := time.Now()
		if err := loadSnapshotDocs(ctx, filepath.Join(dir, "data"), n); err != nil {
			if !keep {
				os.RemoveAll(dir)
			}
			return err
		}
		b.note("snapshot: loaded %d documents (one event each) into the SQLite store in %.1f s", n, time.Since(t0).Seconds())
	}
	t0 := time.Now()
	g, err := connectGatewayIn(ctx, b.o, dir)
	if err != nil {
		return err
	}
	g.keepDir = keep
	defer g.close()
	start := time.Since(t0)
	b.add(Result{Phase: "snapshot", Path: "start (process to /healthz 200)", Unit: "s", Rate: start.Seconds(), Count: int64(n), Seconds: start.Seconds()})
	select { // idle: let the first retention pass and the GC settle
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	if rss, ok := g.rss(); ok {
		b.add(Result{Phase: "snapshot", Path: "idle RSS", Unit: "MiB", Rate: float64(rss) / (1 << 20), Count: int64(n)})
	}
	if err := b.snapshotREST(ctx, g, n); err != nil {
		return err
	}
	return b.snapshotGRPC(ctx, g, n)
}

func (b *runner) snapshotREST(ctx context.Context, g *gatewayProc, n int) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+g.httpAddr+"/v1/events:streamSnapshot", nil)
	if err != nil {
		return err
	}
	g.authorize(req)
	s0, _ := g.stats()
	t0 := time.Now()
	resp, err := g.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("GET /v1/events:streamSnapshot: HTTP %d %s", resp.StatusCode, body)
	}
	var bytes int64
	var last []byte
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		bytes += int64(len(sc.Bytes())) + 1
		last = append(last[:0], sc.Bytes()...)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	el := time.Since(t0)
	var tail struct {
		Result struct {
			Last           bool
			TotalDocuments string
		}
	}
	if err := json.Unmarshal(last, &tail); err != nil || !tail.Result.Last || tail.Result.TotalDocuments != strconv.Itoa(n) {
		return fmt.Errorf("REST snapshot incomplete: last line %.200s", last)
	}
	r := Result{Phase: "snapshot", Path: "REST NDJSON GET /v1/events:streamSnapshot", Unit: "MB/s",
		Rate: float64(bytes) / el.Seconds() / 1e6, Count: bytes, Seconds: el.Seconds(),
		Note: fmt.Sprintf("%d documents, %.0f documents/s", n, float64(n)/el.Seconds())}
	b.procFigures(g, s0, &r, n)
	b.add(r)
	return nil
}

// snapshotGRPC streams the snapshot over gRPC and counts the message
// bytes. The client receives each chunk undecoded (rawCodec) and walks
// only its top-level fields (documents counted, last and total read), as
// the REST client only splits lines: the figure is the server's, not the
// client's protobuf decoding.
func (b *runner) snapshotGRPC(ctx context.Context, g *gatewayProc, n int) error {
	s0, _ := g.stats()
	t0 := time.Now()
	cs, err := g.conn.NewStream(g.ctx(ctx), &grpc.StreamDesc{ServerStreams: true},
		"/pipestream.gateway.v1.EventService/StreamSnapshot", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	req := []byte{} // StreamSnapshotRequest{}: the default chunk size
	if err := cs.SendMsg(&req); err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	var bytes int64
	var docs int
	for {
		var msg []byte
		err := cs.RecvMsg(&msg)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		bytes += int64(len(msg))
		c, err := chunkFields(msg)
		if err != nil {
			return err
		}
		docs += c.docs
		if c.last && (c.total != uint64(n) || docs != n) {
			return fmt.Errorf("gRPC snapshot: %d documents, total %d; want %d", docs, c.total, n)
		}
	}
	el := time.Since(t0)
	r := Result{Phase: "snapshot", Path: "gRPC StreamSnapshot", Unit: "MB/s",
		Rate: float64(bytes) / el.Seconds() / 1e6, Count: bytes, Seconds: el.Seconds(),
		Note: fmt.Sprintf("%d documents, %.0f documents/s", docs, float64(docs)/el.Seconds())}
	b.procFigures(g, s0, &r, n)
	b.add(r)
	return nil
}

// snapshotChunkFields are the top-level fields of an encoded SnapshotChunk.
type snapshotChunkFields struct {
	docs  int
	last  bool
	total uint64
}

// chunkFields walks an encoded SnapshotChunk's top-level fields (2
// documents, 3 last, 4 total_documents) without decoding the documents.
func chunkFields(b []byte) (snapshotChunkFields, error) {
	var c snapshotChunkFields
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return c, protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		if typ == protowire.VarintType {
			if v, n = protowire.ConsumeVarint(b); n < 0 {
				return c, protowire.ParseError(n)
			}
		} else if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return c, protowire.ParseError(n)
		}
		switch num {
		case 2:
			c.docs++
		case 3:
			c.last = v != 0
		case 4:
			c.total = v
		}
		b = b[n:]
	}
	return c, nil
}

// procFigures fills the gateway's peak RSS and CPU per document.
func (b *runner) procFigures(g *gatewayProc, s0 procStats, r *Result, n int) {
	if s1, ok := g.stats(); ok {
		r.PeakRSSMiB = float64(s1.peakRSS) / (1 << 20)
		r.CPUPerOpUs = float64((s1.cpu - s0.cpu).Microseconds()) / float64(n)
		r.GatewayCPUPc = 100 * (s1.cpu - s0.cpu).Seconds() / r.Seconds
	}
}

// rss is the started gateway's current resident set size.
func (g *gatewayProc) rss() (int64, bool) {
	if g.cmd == nil {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, true
		}
	}
	return 0, false
}

// loadSnapshotDocs writes n small SUCCEEDED documents of the default
// tenant with one #document event each, committed by 64 goroutines so
// that the store's writer groups them into large transactions.
func loadSnapshotDocs(ctx context.Context, dataDir string, n int) error {
	st, err := sqlite.Open(ctx, dataDir, sqlite.Options{Synchronous: "NORMAL"})
	if err != nil {
		return err
	}
	defer st.Close()
	created := time.Now().Add(-time.Duration(n) * time.Millisecond)
	const workers = 64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := commitSnapshotDoc(ctx, st, i, created); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func commitSnapshotDoc(ctx context.Context, st *sqlite.Store, i int, created time.Time) error {
	id := fmt.Sprintf("snap-%08d", i)
	ct := timestamppb.New(created.Add(time.Duration(i) * time.Millisecond))
	rec := &store.DocumentRecord{BodyHash: []byte(id), ContentPayload: true, Doc: &gatewayv1.Document{
		Id: id, State: gatewayv1.State_SUCCEEDED, Rev: 1, ContentType: "text/plain",
		DisplayName: id + ".txt", SizeBytes: 42, CreateTime: ct, UpdateTime: ct}}
	ev := &gatewayv1.Event{Time: ct, Kind: "#document", DocumentId: id, Rev: 1}
	_, err := st.Commit(ctx, &store.Batch{Create: rec, Events: []store.EventAppend{{Event: ev}}})
	return err
}
