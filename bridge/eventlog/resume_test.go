package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestReconnectNoGapNoDuplicate: consumers disconnect and resume with a
// cursor while writers append concurrently; across all sessions each
// consumer sees every event of its tenant exactly once, in order. The tail
// is tiny so resumption crosses store replay -> tail switches constantly.
func TestReconnectNoGapNoDuplicate(t *testing.T) {
	e := open(t, t.TempDir(), eventlog.Options{TailEvents: 16})
	const writers, perWriter = 4, 150
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := []string{"a", "b"}[w%2]
			for i := range perWriter {
				if _, err := e.log.Append(context.Background(), batch(tenant, eventlog.KindStatus, "d", time.Now(), 1+i%3)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	want := 0
	for w := range writers {
		if w%2 == 0 {
			for i := range perWriter {
				want += 1 + i%3
			}
		}
	}
	// Resume style: "last" = the draft's rule (cursor = last processed seq,
	// which comes again and is skipped by seq); "next" = last+1 while that
	// is not a future cursor. Both consumers run while the writers append.
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()
	results := make(chan []uint64, 2)
	for _, style := range []string{"last", "next"} {
		go func() { results <- consume(t, e, style, want, writersDone) }()
	}
	got := [][]uint64{<-results, <-results}
	<-writersDone
	if t.Failed() {
		return
	}
	s := subscribe(e, "a", ptr(0), eventlog.Filter{})
	all := s.seqs(t, want)
	s.stop(t)
	for _, g := range got {
		if !eq(g, all) {
			t.Fatalf("resumed stream (%d events) differs from the log (%d events)", len(g), len(all))
		}
	}
}

// consume reads tenant "a" in short sessions until it has want events and
// returns the seqs it processed; it fails on any duplicate or disorder.
func consume(t *testing.T, e *env, style string, want int, writersDone <-chan struct{}) []uint64 {
	var got []uint64
	cursor := ptr(0)
	for sessions := 1; len(got) < want; sessions++ {
		if sessions > 100000 {
			t.Errorf("%s: no progress: %d events", style, len(got))
			return nil
		}
		// A session ends after a few events, or when the consumer has
		// everything (without that, a last session that needs fewer events
		// than its disconnect count waited live forever: the hang this test
		// once showed), or after 5 s without an event.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// A session that starts after the writers finished has every event
		// published already; only then is an empty session a gap (during the
		// writes, a starved writer explains it).
		var allPublished bool
		select {
		case <-writersDone:
			allPublished = true
		default:
		}
		n, first := 0, true
		skipFirst := len(got) > 0 && *cursor == got[len(got)-1] // the cursor's event comes again
		var bad error
		err := e.log.Subscribe(ctx, "a", "consumer-"+style, cursor, eventlog.Filter{}, func(ev *gatewayv1.Event) error {
			if first && skipFirst {
				first = false
				if ev.GetSeq() != *cursor {
					bad = fmt.Errorf("%s: resumed at %d with cursor %d", style, ev.GetSeq(), *cursor)
					return bad
				}
				return nil
			}
			first = false
			if ev.GetKind() == eventlog.KindInfo || (len(got) > 0 && ev.GetSeq() <= got[len(got)-1]) {
				bad = fmt.Errorf("%s: got %v after seq %v", style, ev, got[len(got)-1])
				return bad
			}
			got = append(got, ev.GetSeq())
			if n++; n == 1+sessions%37 || len(got) == want {
				cancel() // disconnect after a few events, or when done
			}
			return nil
		})
		cancel()
		if bad != nil {
			t.Error(bad)
			return nil
		}
		if errors.Is(err, context.DeadlineExceeded) && n == 0 && allPublished {
			t.Errorf("%s: stuck after %d of %d events (latest %d, last %v): a gap", style, len(got), want, e.log.Latest(), got[max(len(got)-3, 0):])
			return nil
		}
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, eventlog.ErrConsumerTooSlow) {
			t.Error(err)
			return nil
		}
		if len(got) > 0 {
			last := got[len(got)-1]
			cursor = ptr(last)
			if style == "next" && last < e.log.Latest() {
				cursor = ptr(last + 1)
			}
		}
	}
	return got
}

// TestSlowConsumer: a live subscriber that stops reading is cut off with
// ErrConsumerTooSlow once the tail passes it, and holds no memory while
// writers continue (no per-subscriber queue).
func TestSlowConsumer(t *testing.T) {
	e := open(t, t.TempDir(), eventlog.Options{TailEvents: 64})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.log.Subscribe(context.Background(), "t", "slow", nil, eventlog.Filter{}, func(*gatewayv1.Event) error {
			<-release
			return nil
		})
	}()
	waitSubscribed(t, e, 1)
	e.appendN("t", 1, eventlog.KindStatus, "d") // the subscriber blocks in send on this one
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const n, size = 2000, 1000 // 2 MB of events while the subscriber is stuck
	for range n / 50 {
		b := batch("t", eventlog.KindStatus, "d", time.Now(), 50)
		for _, a := range b.Events {
			a.Event.Message = string(make([]byte, size))
		}
		if _, err := e.log.Append(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	grown := int64(heap()) - int64(before)
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, eventlog.ErrConsumerTooSlow) {
			t.Fatalf("got %v, want ErrConsumerTooSlow", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("slow consumer not cut off")
	}
	// The tail holds at most 64 events (~64 KB); anything near the 2 MB
	// appended means events piled up for the stuck subscriber.
	if grown > 1<<20 {
		t.Fatalf("heap grew %d bytes while a subscriber was stuck", grown)
	}
	t.Logf("heap growth while stuck: %d bytes for %d bytes appended", grown, n*size)
}
