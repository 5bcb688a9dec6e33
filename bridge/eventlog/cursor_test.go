package eventlog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// cursorEnv has events 1..20 of tenant "t", pruned so the window is 15..20
// (no clients: min_serial = 20, minus the default margin 5).
func cursorEnv(t *testing.T) *env {
	e := open(t, t.TempDir(), eventlog.Options{})
	e.createDoc("t", "d1", 1<<16)
	e.appendN("t", 20, eventlog.KindStatus, "d1")
	e.clk.Advance(48 * time.Hour) // older than MinAge
	rep, err := e.log.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.KeepFrom != 15 || rep.Removed != 14 {
		t.Fatalf("setup prune: %+v", rep)
	}
	return e
}

// TestCursorRules: the five cases of the AT sync draft, "Cursors and
// Resumption".
func TestCursorRules(t *testing.T) {
	t.Run("no cursor: live only", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := cursorEnv(t)
			s := subscribe(e, "t", nil, eventlog.Filter{})
			waitSubscribed(t, e, 1)
			s.none(t)
			e.appendN("t", 2, eventlog.KindStatus, "d1")
			if got := s.seqs(t, 2); !eq(got, []uint64{21, 22}) {
				t.Fatalf("got %v, want [21 22]", got)
			}
			s.stop(t)
		})
	})
	t.Run("cursor in window: replay inclusive then live", func(t *testing.T) {
		e := cursorEnv(t)
		s := subscribe(e, "t", ptr(17), eventlog.Filter{})
		if got := s.seqs(t, 4); !eq(got, seqRange(17, 20)) {
			t.Fatalf("got %v, want 17..20", got)
		}
		e.appendN("t", 1, eventlog.KindStatus, "d1")
		if got := s.next(t).GetSeq(); got != 21 {
			t.Fatalf("live: got %d, want 21", got)
		}
		s.stop(t)
	})
	t.Run("oldest retained cursor is in the window", func(t *testing.T) {
		e := cursorEnv(t)
		s := subscribe(e, "t", ptr(15), eventlog.Filter{})
		if got := s.next(t); got.GetKind() != eventlog.KindStatus || got.GetSeq() != 15 {
			t.Fatalf("got %v, want seq 15 without #info", got)
		}
		s.stop(t)
	})
	t.Run("outdated cursor: info then whole window", func(t *testing.T) {
		e := cursorEnv(t)
		s := subscribe(e, "t", ptr(3), eventlog.Filter{})
		info := s.next(t)
		if info.GetKind() != "#info" || info.GetName() != "OutdatedCursor" || info.GetSeq() != 0 ||
			!strings.Contains(info.GetMessage(), "snapshot") {
			t.Fatalf("first event %v, want #info OutdatedCursor telling to resync from the snapshot", info)
		}
		if got := s.seqs(t, 6); !eq(got, seqRange(15, 20)) {
			t.Fatalf("got %v, want the whole window 15..20", got)
		}
		e.appendN("t", 1, eventlog.KindStatus, "d1")
		if got := s.next(t).GetSeq(); got != 21 {
			t.Fatalf("live after window: got %d", got)
		}
		s.stop(t)
	})
	t.Run("cursor 0: whole window, no info", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := cursorEnv(t)
			s := subscribe(e, "t", ptr(0), eventlog.Filter{})
			if got := s.seqs(t, 6); !eq(got, seqRange(15, 20)) {
				t.Fatalf("got %v, want 15..20", got)
			}
			s.none(t)
			s.stop(t)
		})
	})
	t.Run("future cursor: error before anything", func(t *testing.T) {
		e := cursorEnv(t)
		for _, c := range []uint64{21, 1000, 1 << 53, 1<<64 - 1} {
			sent := 0
			err := e.log.Subscribe(context.Background(), "t", "k", ptr(c), eventlog.Filter{}, func(*gatewayv1.Event) error {
				sent++
				return nil
			})
			if !errors.Is(err, eventlog.ErrFutureCursor) || sent != 0 {
				t.Fatalf("cursor %d: err %v after %d events, want ErrFutureCursor before any", c, err, sent)
			}
		}
	})
	t.Run("empty log", func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{})
		s := subscribe(e, "t", ptr(0), eventlog.Filter{})
		waitSubscribed(t, e, 1)
		e.appendN("t", 1, eventlog.KindStatus, "d1")
		if got := s.next(t).GetSeq(); got != 1 {
			t.Fatalf("got %d, want 1", got)
		}
		s.stop(t)
		if err := e.log.Subscribe(context.Background(), "t", "", ptr(2), eventlog.Filter{}, nil); !errors.Is(err, eventlog.ErrFutureCursor) {
			t.Fatalf("got %v", err)
		}
	})
}

// waitSubscribed waits until n subscriptions are open (metrics-free: via
// the Window's view is not enough, so poll a live-only probe).
func waitSubscribed(t *testing.T, e *env, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.log.Subscribers() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers, want %d", e.log.Subscribers(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFiltersAndTenants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{TailEvents: 2})
		e.appendN("a", 1, eventlog.KindStatus, "d1")   // 1
		e.appendN("b", 1, eventlog.KindStatus, "d1")   // 2 other tenant
		e.appendN("a", 1, eventlog.KindDocument, "d2") // 3
		e.appendN("", 1, eventlog.KindStatus, "d1")    // 4 tenant ""
		e.appendN("a", 1, eventlog.KindClaim, "d1")    // 5
		e.appendN("a", 1, eventlog.KindDocument, "d1") // 6
		for _, c := range []struct {
			tenant string
			f      eventlog.Filter
			want   []uint64
		}{
			{"a", eventlog.Filter{}, []uint64{1, 3, 5, 6}},
			{"b", eventlog.Filter{}, []uint64{2}},
			{"", eventlog.Filter{}, []uint64{4}},
			{"a", eventlog.Filter{DocumentID: "d1"}, []uint64{1, 5, 6}},
			{"a", eventlog.Filter{Kinds: []string{"#document", "#claim"}}, []uint64{3, 5, 6}},
			{"a", eventlog.Filter{Kinds: []string{"#document"}, DocumentID: "d1"}, []uint64{6}},
		} {
			// From the store (tail empty after reopen) and from the tail.
			s := subscribe(e, c.tenant, ptr(0), c.f)
			if got := s.seqs(t, len(c.want)); !eq(got, c.want) {
				t.Fatalf("tenant %q filter %+v: got %v, want %v", c.tenant, c.f, got, c.want)
			}
			s.none(t)
			s.stop(t)
		}
	})
}

func TestSubscribeDocumentOnStart(t *testing.T) {
	e := open(t, t.TempDir(), eventlog.Options{})
	e.appendN("a", 3, eventlog.KindStatus, "doc")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := errors.New("terminal")
	var started uint64
	var got []uint64
	done := make(chan error, 1)
	go func() {
		done <- e.log.SubscribeDocument(ctx, "a", "watcher", "doc", nil, func(latest uint64) error {
			started = latest
			return nil
		}, func(ev *gatewayv1.Event) error {
			got = append(got, ev.GetSeq())
			if ev.GetKind() == eventlog.KindDocument {
				return stop
			}
			return nil
		})
	}()
	waitSubscribed(t, e, 1)
	e.appendN("a", 1, eventlog.KindStatus, "other")
	e.appendN("a", 1, eventlog.KindStatus, "doc")
	e.appendN("a", 1, eventlog.KindDocument, "doc")
	if err := <-done; !errors.Is(err, stop) {
		t.Fatalf("got %v, want the send error back", err)
	}
	if started != 3 || !eq(got, []uint64{5, 6}) {
		t.Fatalf("onStart latest %d, events %v; want 3 and [5 6]", started, got)
	}
}
