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

// TestNDJSONFlushWaitsOnlyForAnOfferedEvent: the NDJSON writer of an
// in-process subscription skips a flush exactly while the handler is
// offering the next event (which the next Recv takes at once), and flushes
// everything once nothing is offered: a burst goes out in one write, and
// no event is ever left in the buffer of an idle stream.
func TestNDJSONFlushWaitsOnlyForAnOfferedEvent(t *testing.T) {
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodGet, "/v1/events:subscribe", nil)
	var sw *streamWriter
	streamFraming(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw = w.(*streamWriter)
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		st := &localEventStream{ctx: ctx, cancel: cancel, events: make(chan *gatewayv1.Event), done: make(chan struct{})}
		setFlushHint(ctx, st.eventWaiting)
		const n = 4
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
		}
		if st.eventWaiting() {
			t.Error("an event counted as offered after the burst was taken")
		}
	})).ServeHTTP(rec, r)
	if sw == nil || sw.more == nil {
		t.Fatal("the subscription's writer got no flush hint")
	}
	if rec.flushes != 1 {
		t.Errorf("%d flushes for a burst of 4 events offered back to back, want 1", rec.flushes)
	}
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
