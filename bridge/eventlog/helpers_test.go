package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable clock for Options.Now.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock        { c := &clock{}; c.ns.Store(t.UnixNano()); return c }
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type env struct {
	t   testing.TB
	dir string
	st  *sqlite.Store
	log *eventlog.Log
	clk *clock
}

// open opens a real store in dir and a Log over it (pruner off unless the
// options say otherwise).
func open(t testing.TB, dir string, opts eventlog.Options) *env {
	return openSync(t, dir, opts, "NORMAL")
}

// openSync is open with the store's synchronous mode (FULL survives power
// loss; NORMAL survives process crashes).
func openSync(t testing.TB, dir string, opts eventlog.Options, sync string) *env {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, dir, sqlite.Options{Synchronous: sync})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, st: st}
	if opts.Now == nil {
		e.clk = newClock(epoch)
		opts.Now = e.clk.Now
	}
	if opts.PruneInterval == 0 {
		opts.DisablePruner = true
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	e.log, err = eventlog.New(ctx, st, opts)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	if e.log != nil {
		e.log.Close()
		e.st.Close()
		e.log = nil
	}
}

// appendN appends n single-event batches for tenant and returns their seqs.
func (e *env) appendN(tenant string, n int, kind, doc string) []uint64 {
	e.t.Helper()
	var seqs []uint64
	for range n {
		res, err := e.log.Append(context.Background(), batch(tenant, kind, doc, e.now(), 1))
		if err != nil {
			e.t.Fatal(err)
		}
		seqs = append(seqs, res.Seqs...)
	}
	return seqs
}

func (e *env) now() time.Time {
	if e.clk != nil {
		return e.clk.Now()
	}
	return time.Now()
}

// createDoc stores a document whose encoding is about size bytes, so the
// snapshot (the retention byte cap) has that size.
func (e *env) createDoc(tenant, id string, size int) {
	e.t.Helper()
	_, err := e.log.Append(context.Background(), &store.Batch{Create: &store.DocumentRecord{Tenant: tenant,
		Doc: &gatewayv1.Document{Id: id, State: gatewayv1.State_PENDING, CreateTime: timestamppb.New(e.now()),
			Error: strings.Repeat("x", size)}}})
	if err != nil {
		e.t.Fatal(err)
	}
}

func batch(tenant, kind, doc string, at time.Time, n int) *store.Batch {
	b := &store.Batch{}
	for range n {
		b.Events = append(b.Events, store.EventAppend{Tenant: tenant, Event: &gatewayv1.Event{
			Time: timestamppb.New(at), Kind: kind, DocumentId: doc, Rev: 1,
		}})
	}
	return b
}

// sub runs a subscription in a goroutine and exposes what it receives.
type sub struct {
	ch     chan *gatewayv1.Event
	done   chan error
	cancel context.CancelFunc
}

func subscribe(e *env, tenant string, cursor *uint64, f eventlog.Filter) *sub {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sub{ch: make(chan *gatewayv1.Event, 1<<16), done: make(chan error, 1), cancel: cancel}
	go func() {
		s.done <- e.log.Subscribe(ctx, tenant, "client-"+tenant, cursor, f, func(ev *gatewayv1.Event) error {
			s.ch <- ev
			return nil
		})
	}()
	return s
}

// next waits for the next event.
func (s *sub) next(t testing.TB) *gatewayv1.Event {
	t.Helper()
	select {
	case ev := <-s.ch:
		return ev
	case err := <-s.done:
		t.Fatalf("subscription ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return nil
}

// seqs waits for n events and returns their seqs.
func (s *sub) seqs(t testing.TB, n int) []uint64 {
	t.Helper()
	var out []uint64
	for range n {
		out = append(out, s.next(t).GetSeq())
	}
	return out
}

// none asserts nothing more arrives: once every goroutine of the test's
// synctest bubble is idle, nothing is queued for s. Call it inside
// synctest.Test only (the subscription is started in the bubble too).
func (s *sub) none(t testing.TB) {
	t.Helper()
	synctest.Wait()
	select {
	case ev := <-s.ch:
		t.Fatalf("unexpected event %v", ev)
	default:
	}
}

func (s *sub) stop(t testing.TB) {
	t.Helper()
	s.cancel()
	if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("subscription ended with %v", err)
	}
}

func ptr(v uint64) *uint64 { return &v }

func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func eq(a, b []uint64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
