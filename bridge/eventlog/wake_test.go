package eventlog_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestLiveSubscribersWakeNoGapNoDuplicate: live subscribers wait for
// commits without a lock (the tail's latest seq and wake channel are
// atomics; the log's Close closes the wake channel): under a seeded
// workload of concurrent writers committing batches of 1 to 6 events at
// random moments, every subscriber (live-only, the whole window, or
// resuming from a cursor inside it; with and without a kind filter; with
// and without an idle hook; a quarter served by the log's fan-out workers
// while caught up (WithPush), handed back to their goroutines at random) gets exactly the matching events from its
// start, in seq order, no gap, no duplicate. It runs in a synctest bubble:
// once the writers are done and every goroutine is blocked, a subscriber
// that missed a wake-up is blocked short of the latest seq, which the
// check below reports (no timeout decides it). Then Close ends every
// subscription with ErrClosed. A failure prints the seed.
func TestLiveSubscribersWakeNoGapNoDuplicate(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for round := range 4 {
		synctest.Test(t, func(t *testing.T) {
			wakeRound(t, seed+uint64(round))
		})
		if t.Failed() {
			t.Fatalf("seed %d round %d (replay: seed+round)", seed, round)
		}
	}
}

// testPush is a Push whose Pushable and Flush say no at random (a
// transport that cannot always write without blocking): the subscription
// moves between its goroutine and the workers.
type testPush struct {
	mu  sync.Mutex
	rng *rand.Rand
	in  bool // between Begin and Flush
}

func (p *testPush) Pushable() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.rng.IntN(4) != 0 }
func (p *testPush) Begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.in = true
}
func (p *testPush) Flush() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.in {
		panic("Flush without Begin")
	}
	p.in = false
	return p.rng.IntN(3) != 0, nil
}

// wakeSub is one subscription of wakeRound and what it got.
type wakeSub struct {
	cursor *uint64
	kinds  []string
	done   chan error

	mu    sync.Mutex // the subscription's goroutine writes, the test reads
	start uint64     // OnStart's latest
	got   []uint64
	idles int
}

func wakeRound(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	e := open(t, t.TempDir(), eventlog.Options{})
	kinds := []string{eventlog.KindStatus, eventlog.KindDocument, eventlog.KindClaim}

	var mu sync.Mutex
	kindOf := map[uint64]string{} // every committed seq's kind
	commit := func(r *rand.Rand, n int) {
		b := batch("t", kinds[0], "d", e.now(), n)
		for i := range b.Events {
			b.Events[i].Event.Kind = kinds[r.IntN(len(kinds))]
		}
		res, err := e.log.Append(context.Background(), b)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		for i, s := range res.Seqs {
			kindOf[s] = b.Events[i].Event.GetKind()
		}
		mu.Unlock()
	}
	for range 20 { // a window to replay and resume in
		commit(rng, 1+rng.IntN(3))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subs := make([]*wakeSub, 24)
	for i := range subs {
		s := &wakeSub{done: make(chan error, 1)}
		switch i % 3 {
		case 1:
			s.cursor = ptr(0)
		case 2:
			s.cursor = ptr(1 + rng.Uint64N(e.log.Latest()))
		}
		if rng.IntN(3) == 0 {
			s.kinds = []string{kinds[rng.IntN(len(kinds))]}
		}
		sctx := ctx
		if i%2 == 0 {
			sctx = eventlog.WithIdle(ctx, func() error {
				s.mu.Lock()
				s.idles++
				s.mu.Unlock()
				return nil
			})
		}
		if i%4 == 0 { // served by the log's workers while caught up
			sctx = eventlog.WithPush(sctx, &testPush{rng: rand.New(rand.NewPCG(seed, uint64(200+i)))})
		}
		subs[i] = s
		go func() {
			s.done <- e.log.Follow(sctx, eventlog.Subscription{Tenant: "t", Cursor: s.cursor,
				Filter:  eventlog.Filter{Kinds: s.kinds},
				OnStart: func(latest uint64) error { s.mu.Lock(); s.start = latest; s.mu.Unlock(); return nil }},
				func(ev *gatewayv1.Event) error {
					s.mu.Lock()
					s.got = append(s.got, ev.GetSeq())
					s.mu.Unlock()
					return nil
				})
		}()
	}

	// Writers commit while the subscribers replay, catch up and wait;
	// their pauses (fake time) let every subscriber reach its wait between
	// some commits and not between others.
	var wg sync.WaitGroup
	for w := range 3 {
		wr := rand.New(rand.NewPCG(seed, uint64(100+w)))
		wg.Go(func() {
			for range 40 {
				if wr.IntN(2) == 0 {
					time.Sleep(time.Duration(wr.IntN(3)) * time.Millisecond)
				}
				commit(wr, 1+wr.IntN(6))
			}
		})
	}
	wg.Wait()
	synctest.Wait() // every subscriber has sent all it will send without another wake-up

	latest := e.log.Latest()
	for i, s := range subs {
		select {
		case err := <-s.done:
			t.Fatalf("seed %d: subscriber %d ended early: %v", seed, i, err)
		default:
		}
		s.mu.Lock()
		got, start, idles := slices.Clone(s.got), s.start, s.idles
		s.mu.Unlock()
		from := start + 1
		if s.cursor != nil {
			from = max(*s.cursor, 1)
		}
		var want []uint64
		for seq := from; seq <= latest; seq++ {
			if len(s.kinds) == 0 || slices.Contains(s.kinds, kindOf[seq]) {
				want = append(want, seq)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d: subscriber %d (cursor %v, kinds %v, start %d) got %d events %v..., want %d from %d to %d",
				seed, i, s.cursor, s.kinds, start, len(got), got[:min(len(got), 8)], len(want), from, latest)
		}
		if i%2 == 0 && idles == 0 {
			t.Fatalf("seed %d: subscriber %d with an idle hook was never idle", seed, i)
		}
	}

	e.log.Close() // wakes every waiting subscriber for good
	for i, s := range subs {
		if err := <-s.done; !errors.Is(err, eventlog.ErrClosed) {
			t.Fatalf("seed %d: subscriber %d ended with %v after Close, want ErrClosed", seed, i, err)
		}
	}
}
