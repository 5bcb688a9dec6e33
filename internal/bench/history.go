package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// history is issue 25's "flat with history" phase: the small-document
// gRPC rate (submit -> SUCCEEDED, the small phase's path) on a store that
// already holds N documents, for each N of Options.HistoryDocs in
// ascending order, in one run and one data dir: it loads the store up to
// the next size (the documents the measurements submitted count too),
// starts a gateway on it, measures, stops it, and goes on. The first size
// (0 by default: an empty store) is the baseline of the ratios.
//
// The loaded documents have the rows of a real small document
// (history-loader): a SUCCEEDED document row with a time-ordered id, its
// root entity, its content and result inline (Options.SmallBytes each)
// and six events, written straight into the SQLite store in large
// concurrent groups (minutes for a million on 2 cores, not the hours the
// gateway would take).
func (b *runner) history(ctx context.Context) error {
	if b.o.GRPCAddr != "" {
		return errors.New("the history phase loads its own store: run it without --grpc-addr/--http-addr")
	}
	dir, have, err := b.historyStore()
	if err != nil {
		return err
	}
	if b.o.HistoryDir == "" {
		defer os.RemoveAll(dir)
	}
	data := filepath.Join(dir, "data")
	payload := patternBlock[:b.o.SmallBytes]
	if first := b.o.HistoryDocs[0]; first < have {
		// The kept store is past the baseline size: measure the baseline
		// on a fresh store of its own, in this run.
		if err := b.historyBaseline(ctx, first, payload); err != nil {
			return err
		}
	}
	for _, n := range b.o.HistoryDocs {
		if n < have {
			b.note("history: %d documents skipped (the kept store already holds %d)", n, have)
			continue
		}
		if n > have {
			b.progress("  loading %d documents (store: %d -> %d)", n-have, have, n)
			t0 := time.Now()
			if err := loadHistoryDocs(ctx, data, have, n-have, len(payload)); err != nil {
				return fmt.Errorf("load the store: %w", err)
			}
			b.note("history: loaded %d documents (store %d -> %d) in %.1f s", n-have, have, n, time.Since(t0).Seconds())
			have = n
			if err := b.historyRetention(ctx, data); err != nil {
				return err
			}
			if err := saveHistoryCount(dir, have); err != nil {
				return err
			}
		}
		done, err := b.historyAt(ctx, dir, have, payload)
		if err != nil {
			return err
		}
		have += done
		if err := saveHistoryCount(dir, have); err != nil {
			return err
		}
	}
	b.ratios("history")
	return nil
}

// historyBaseline measures the first size on a fresh temporary store.
func (b *runner) historyBaseline(ctx context.Context, n int, payload []byte) error {
	dir, err := os.MkdirTemp("", "gateway-bench-history-base-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if n > 0 {
		if err := loadHistoryDocs(ctx, filepath.Join(dir, "data"), 0, n, len(payload)); err != nil {
			return fmt.Errorf("load the baseline store: %w", err)
		}
		if err := b.historyRetention(ctx, filepath.Join(dir, "data")); err != nil {
			return err
		}
	}
	_, err = b.historyAt(ctx, dir, n, payload)
	return err
}

// historyRetention brings a loaded store to where a gateway that wrote it
// would have left it: the loader appends events without the retention
// passes a running gateway makes every PruneEveryEvents appends, so the
// passes' work is done here, with the gateway's default retention, before
// the gateway starts (else its first minutes would measure a catch-up of
// millions of deletions, not the rate with history).
func (b *runner) historyRetention(ctx context.Context, dataDir string) error {
	t0 := time.Now()
	st, err := sqlite.Open(ctx, dataDir, sqlite.Options{Synchronous: "NORMAL"})
	if err != nil {
		return err
	}
	defer st.Close()
	lg, err := eventlog.New(ctx, st, eventlog.Options{DisablePruner: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer lg.Close()
	rep, err := lg.Prune(ctx)
	if err != nil {
		return fmt.Errorf("retention pass on the loaded store: %w", err)
	}
	b.note("history: a retention pass (the gateway's defaults) removed %d events (%s) below seq %d in %.1f s before the gateway started",
		rep.Removed, rep.Reason, rep.KeepFrom, time.Since(t0).Seconds())
	return nil
}

// historyStore is the phase's data dir and how many documents it holds:
// Options.HistoryDir as an earlier run left it, or a new temporary dir.
func (b *runner) historyStore() (string, int, error) {
	if b.o.HistoryDir == "" {
		dir, err := os.MkdirTemp("", "gateway-bench-history-")
		return dir, 0, err
	}
	raw, err := os.ReadFile(filepath.Join(b.o.HistoryDir, historyCountFile))
	if errors.Is(err, os.ErrNotExist) {
		return b.o.HistoryDir, 0, os.MkdirAll(b.o.HistoryDir, 0o755)
	}
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", filepath.Join(b.o.HistoryDir, historyCountFile), err)
	}
	b.note("history: reusing the store in %s (%d documents)", b.o.HistoryDir, n)
	return b.o.HistoryDir, n, nil
}

// historyCountFile records in a kept history dir how many documents its
// store holds.
const historyCountFile = "history-docs"

func saveHistoryCount(dir string, n int) error {
	return os.WriteFile(filepath.Join(dir, historyCountFile), []byte(strconv.Itoa(n)+"\n"), 0o644)
}

// historyAt starts a gateway on the store in dir (holding have documents),
// measures the small-document gRPC path and stops the gateway. It returns
// how many documents the measurement added.
func (b *runner) historyAt(ctx context.Context, dir string, have int, payload []byte) (int, error) {
	g, err := connectGatewayIn(ctx, b.o, dir)
	if err != nil {
		return 0, err
	}
	g.keepDir = true // the phase removes dir itself
	defer g.close()
	// Idle first, as on every size: startup work on the store (recovery,
	// the first retention pass) is not the rate with history.
	select {
	case <-time.After(historySettle):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	b.progress("  gateway gRPC Submit -> SUCCEEDED on %d stored documents, %d in flight, %s", have, b.o.Concurrency, b.o.Duration)
	var (
		lat  []time.Duration
		secs float64
	)
	ps, ok, err := g.measure(func() (err error) {
		lat, secs, err = g.smallDocs(ctx, "grpc", payload, b.o.Concurrency, b.o.Duration)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("small documents on %d stored: %w", have, err)
	}
	r := latResult("history", fmt.Sprintf("gRPC Submit -> SUCCEEDED, %s documents stored", countStr(have)), have == b.o.HistoryDocs[0], lat, secs)
	fill(&r, ps, ok, int64(len(lat)), secs)
	if fi, err := os.Stat(filepath.Join(dir, "data", "gateway.db")); err == nil {
		r.Note = fmt.Sprintf("gateway.db %.0f MiB before", float64(fi.Size())/(1<<20))
	}
	b.add(r)
	return len(lat), nil
}

// historySettle is how long the history phase leaves a started gateway
// idle before it measures.
const historySettle = 3 * time.Second

// countStr writes n as 0, 100k, 1M, 2.5M.
func countStr(n int) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return fmt.Sprintf("%gM", float64(n)/1e6)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// loadHistoryDocs adds n documents (numbered from first) to the SQLite
// store in dataDir with 64 goroutines, so that the store's writer groups
// them into large transactions. Their create times lie in the past, one
// millisecond apart, before anything the gateway will write.
func loadHistoryDocs(ctx context.Context, dataDir string, first, n, size int) error {
	st, err := sqlite.Open(ctx, dataDir, sqlite.Options{Synchronous: "NORMAL"})
	if err != nil {
		return err
	}
	defer st.Close()
	base := time.Now().Add(-time.Duration(first+n) * time.Millisecond)
	body := patternBlock[:size]
	const workers = 64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := commitHistoryDoc(ctx, st, base.Add(time.Duration(i)*time.Millisecond), body); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// historyID is a document id of the gateway's form (bridge newDocID): 12
// hex digits of Unix milliseconds, then 16 random hex digits.
func historyID(t time.Time) string {
	var b [14]byte
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(b[:6], ms[2:])
	_, _ = rand.Read(b[6:])
	return hex.EncodeToString(b[:])
}

// commitHistoryDoc commits one finished small document with the rows the
// gateway writes for one: the document, its root entity, content and
// result inline, and its six events (PENDING, RUNNING, entity PROCESSING
// and COMPLETE, result, SUCCEEDED).
func commitHistoryDoc(ctx context.Context, st *sqlite.Store, t time.Time, body []byte) error {
	id := historyID(t)
	ct := timestamppb.New(t)
	rec := &store.DocumentRecord{BodyHash: []byte(id), ResultContentType: "application/octet-stream", DispatchAttempts: 1,
		Doc: &gatewayv1.Document{Id: id, State: gatewayv1.State_SUCCEEDED, Rev: 4, ContentType: "application/octet-stream",
			SizeBytes: uint64(len(body)), CreateTime: ct, UpdateTime: ct}}
	ent := &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE, SizeBytes: uint64(len(body)), Attempts: 1}
	ev := func(rev uint64, kind string, f func(*gatewayv1.Event)) store.EventAppend {
		e := &gatewayv1.Event{Time: ct, Kind: kind, DocumentId: id, Rev: rev}
		if f != nil {
			f(e)
		}
		return store.EventAppend{Event: e}
	}
	doc := func(s gatewayv1.State) func(*gatewayv1.Event) { return func(e *gatewayv1.Event) { e.State = s } }
	ent1 := func(s gatewayv1.EntityStatus) func(*gatewayv1.Event) {
		return func(e *gatewayv1.Event) { e.EntityId, e.EntityStatus = 1, s }
	}
	_, err := st.Commit(ctx, &store.Batch{
		Create:   rec,
		Entities: []store.EntityRecord{{DocID: id, Entity: ent, Attempt: 1}},
		Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadContent, Body: body}, {DocID: id, Kind: store.PayloadResult, Body: body}},
		Events: []store.EventAppend{
			ev(1, "#document", doc(gatewayv1.State_PENDING)),
			ev(2, "#document", doc(gatewayv1.State_RUNNING)),
			ev(2, "#status", ent1(gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING)),
			ev(3, "#status", ent1(gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE)),
			ev(3, "#document", nil),
			ev(4, "#document", doc(gatewayv1.State_SUCCEEDED)),
		},
	})
	return err
}
