package eventlog_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// scriptPush is a Push that records the calls it gets (with the idle
// hook's) and answers Flush from a script.
type scriptPush struct {
	mu    sync.Mutex
	calls []string
	flush []bool // answers, in turn; true once it runs out
	err   error  // Flush's error
}

func (p *scriptPush) note(s string)  { p.mu.Lock(); p.calls = append(p.calls, s); p.mu.Unlock() }
func (p *scriptPush) Pushable() bool { return true }
func (p *scriptPush) Begin()         { p.note("begin") }
func (p *scriptPush) Flush() (bool, error) {
	p.note("flush")
	p.mu.Lock()
	defer p.mu.Unlock()
	ok := true
	if len(p.flush) > 0 {
		ok, p.flush = p.flush[0], p.flush[1:]
	}
	return ok, p.err
}

func (p *scriptPush) log() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

// TestPushHandsBackWhatItCannotWrite: a caught-up push subscriber's
// events are sent by a worker (Begin, sends, Flush); when Flush could not
// write everything the subscription goes back to its goroutine, whose
// next call is the idle hook (the write that may wait, under the
// transport's deadline), before any further worker turn; every event
// arrives once, in order.
func TestPushHandsBackWhatItCannotWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := open(t, t.TempDir(), eventlog.Options{})
		p := &scriptPush{flush: []bool{true, false, true}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var got []uint64
		ctx = eventlog.WithPush(eventlog.WithIdle(ctx, func() error { p.note("idle"); return nil }), p)
		done := make(chan error, 1)
		go func() {
			done <- e.log.Subscribe(ctx, "t", "", nil, eventlog.Filter{}, func(ev *gatewayv1.Event) error {
				got = append(got, ev.GetSeq())
				p.note("send")
				return nil
			})
		}()
		synctest.Wait()
		for range 4 { // four commits of two events
			if _, err := e.log.Append(context.Background(), batch("t", eventlog.KindStatus, "d", e.now(), 2)); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		want := []string{"idle", // caught up at the start: parks
			"begin", "send", "send", "flush", // written by a worker
			"begin", "send", "send", "flush", "idle", // not all written: the goroutine writes the rest
			"begin", "send", "send", "flush",
			"begin", "send", "send", "flush"}
		if c := p.log(); !slicesEqual(c, want) {
			t.Errorf("calls %v\nwant  %v", c, want)
		}
		if !slicesEqual(got, []uint64{1, 2, 3, 4, 5, 6, 7, 8}) {
			t.Errorf("sent %v, want seqs 1 to 8 once each", got)
		}
		cancel() // parked: the goroutine takes it back and ends
		synctest.Wait()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("parked subscription ended with %v, want context.Canceled", err)
		}
	})
}

// TestPushErrorsEndTheSubscription: an error from a send or from Flush on
// a worker ends the subscription with that error, on its goroutine.
func TestPushErrorsEndTheSubscription(t *testing.T) {
	for _, where := range []string{"send", "flush"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := open(t, t.TempDir(), eventlog.Options{})
				boom := errors.New("boom")
				p := &scriptPush{}
				if where == "flush" {
					p.err = boom
				}
				ctx := eventlog.WithPush(eventlog.WithIdle(context.Background(), func() error { return nil }), p)
				done := make(chan error, 1)
				go func() {
					done <- e.log.Subscribe(ctx, "t", "", nil, eventlog.Filter{}, func(*gatewayv1.Event) error {
						if where == "send" {
							return boom
						}
						return nil
					})
				}()
				synctest.Wait()
				e.appendN("t", 1, eventlog.KindStatus, "d")
				synctest.Wait()
				select {
				case err := <-done:
					if !errors.Is(err, boom) {
						t.Errorf("ended with %v, want boom", err)
					}
				default:
					t.Fatal("the subscription did not end")
				}
				if c := p.log(); len(c) == 0 || c[0] != "begin" {
					t.Errorf("calls %v: the error did not come from a worker's turn", c)
				}
			})
		})
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCloseRacesTheFirstPark: Close while the first push subscriber parks
// (and so starts the fan-out's workers). Workers may be added to the log's
// WaitGroup only before Close's Wait can begin; under -race an Add that
// races the Wait is reported (CI saw it when a gateway shut down as a
// WebSocket subscriber caught up). Every subscription ends with ErrClosed
// and no worker outlives the log (goleak in TestMain).
func TestCloseRacesTheFirstPark(t *testing.T) {
	for i := range 24 {
		e := open(t, t.TempDir(), eventlog.Options{})
		ctx := eventlog.WithPush(eventlog.WithIdle(context.Background(), func() error { return nil }), &scriptPush{})
		done := make(chan error, 1)
		l := e.log // e.close clears the field
		go func() {
			done <- l.Subscribe(ctx, "t", "", nil, eventlog.Filter{}, func(*gatewayv1.Event) error { return nil })
		}()
		if i%2 == 1 {
			runtime.Gosched() // half the runs let the subscriber get further first
		}
		e.close()
		if err := <-done; !errors.Is(err, eventlog.ErrClosed) {
			t.Fatalf("run %d: subscription ended with %v, want ErrClosed", i, err)
		}
	}
}
