package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// flushRecorder is a ResponseWriter that records what was flushed.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes int
	flushed int // bytes of the body at the last flush
}

func (f *flushRecorder) Flush() {
	f.flushes++
	f.flushed = f.Body.Len()
}

// serveBurst serves an NDJSON event subscription whose handler offers n
// events back to back (its sender waits for nothing but Recv); step runs
// for each event once Recv took it and it was written into rec (step
// flushes). It
// returns what reached the writer and the stream's writer.
func serveBurst(t *testing.T, n int, step func(i int, st *localEventStream, sw *streamWriter, rec *flushRecorder)) (*flushRecorder, *streamWriter) {
	t.Helper()
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodGet, "/v1/events:subscribe", nil)
	var sw *streamWriter
	streamFraming(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw = w.(*streamWriter)
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		st := &localEventStream{ctx: ctx, cancel: cancel, events: make(chan *gatewayv1.Event), done: make(chan struct{})}
		setFlushHint(ctx, st.eventWaiting)
		go func() {
			for i := range n {
				_ = st.send(&gatewayv1.Event{Seq: uint64(i + 1)})
			}
		}()
		for i := range n {
			ev, err := st.Recv()
			if err != nil || ev.Seq != uint64(i+1) {
				t.Errorf("Recv %d: %v %v", i, ev, err)
				return
			}
			fmt.Fprintf(w, "{\"seq\":%d}\n", ev.Seq)
			step(i, st, sw, rec)
		}
	})).ServeHTTP(rec, r)
	return rec, sw
}

// TestNDJSONFlushWaitsOnlyForAnOfferedEvent: the NDJSON writer of an
// in-process subscription skips a flush exactly while the handler is
// offering the next event (which the next Recv takes at once), and flushes
// everything once nothing is offered: a burst goes out in one write, and
// no event is ever left in the buffer of an idle stream.
func TestNDJSONFlushWaitsOnlyForAnOfferedEvent(t *testing.T) {
	const n = 4
	rec, sw := serveBurst(t, n, func(i int, st *localEventStream, sw *streamWriter, rec *flushRecorder) {
		if i < n-1 {
			// The sender offers the next event (an event, not a sleep).
			for !st.eventWaiting() {
				runtime.Gosched()
			}
		}
		before := rec.flushes
		_ = sw.FlushError()
		if i < n-1 && rec.flushes != before {
			t.Errorf("event %d flushed while event %d was offered", i+1, i+2)
		}
		if i == n-1 && rec.flushed != rec.Body.Len() {
			t.Errorf("the last event of the burst left %d bytes unflushed", rec.Body.Len()-rec.flushed)
		}
		if i == n-1 && st.eventWaiting() {
			t.Error("an event counted as offered after the burst was taken")
		}
	})
	if sw == nil || sw.more == nil {
		t.Fatal("the subscription's writer got no flush hint")
	}
	if rec.flushes != 1 {
		t.Errorf("%d flushes for a burst of 4 events offered back to back, want 1", rec.flushes)
	}
}

// A burst the handler has ready (its sender never waits for anything but
// Recv) goes out in few writes without the reader waiting for the offer
// itself: the writer yields once before it flushes, so the handler that
// Recv made runnable offers the next event first. Before the yield every
// event of such a burst was flushed on its own (the REST event stream of
// `gateway bench`: about one write per event). One P, so that the run
// does not depend on which P the handler lands on: with two, the handler
// sometimes runs on the other one and offers a moment late (2% to 6% of
// the events flushed with the yield, about half without). On one P: 1.5%
// to 2% with the yield, half without; the bound is 5%.
func TestNDJSONFlushCoalescesAReadyBurst(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 1000
	rec, _ := serveBurst(t, n, func(_ int, _ *localEventStream, sw *streamWriter, _ *flushRecorder) { _ = sw.FlushError() })
	if rec.flushed != rec.Body.Len() {
		t.Errorf("the burst's last event left %d bytes unflushed", rec.Body.Len()-rec.flushed)
	}
	if rec.flushes > n/20 {
		t.Errorf("%d flushes for a ready burst of %d events, want at most %d", rec.flushes, n, n/20)
	}
	t.Logf("%d flushes for %d events", rec.flushes, n)
}

// Other routes (and other stream forms) get no hint: every flush flushes.
func TestNDJSONFlushHintOnlyOnSubscribe(t *testing.T) {
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodGet, "/v1/documents/x:watch", nil)
	streamFraming(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setFlushHint(r.Context(), func() bool { return true })
		_, _ = w.Write([]byte("{}\n"))
		_ = w.(*streamWriter).FlushError()
	})).ServeHTTP(rec, r)
	if rec.flushes != 1 {
		t.Errorf("a watch stream's flush was skipped (%d flushes)", rec.flushes)
	}
}
