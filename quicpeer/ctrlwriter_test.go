package quicpeer

import (
	"encoding/binary"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// gateWriter records every Write; while gate is set each Write first waits
// for a token, so the test controls when a Write in flight returns.
type gateWriter struct {
	mu     sync.Mutex
	data   []byte
	writes int
	gate   chan struct{}
	failAt int // 1-based Write that fails (0: none)
}

var errInjected = errors.New("injected stream-0 write failure")

func (g *gateWriter) Write(p []byte) (int, error) {
	if g.gate != nil {
		<-g.gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writes++
	if g.writes == g.failAt {
		return 0, errInjected
	}
	g.data = append(g.data, p...)
	return len(p), nil
}

// rec is one 8-octet test frame: sender, sequence number.
func rec(b []byte, sender, seq uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, sender)
	return binary.BigEndian.AppendUint32(b, seq)
}

// Frames of concurrent callers are coalesced while a Write is in flight,
// all arrive intact and each caller's frames keep its order.
func TestCtrlWriterCoalescesInOrder(t *testing.T) {
	const senders, per = 8, 200
	g := &gateWriter{gate: make(chan struct{})}
	var last atomic.Int64
	c := newCtrlWriter(g, &last)
	stop := make(chan struct{})
	go func() {
		// Hold the first Write until the other senders queued a frame
		// each behind it, then release Writes one by one.
		for {
			c.mu.Lock()
			n := len(c.buf)
			c.mu.Unlock()
			if n >= (senders-1)*8 {
				break
			}
			runtime.Gosched()
		}
		for {
			select {
			case g.gate <- struct{}{}:
			case <-stop:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range per {
				if err := c.commit(rec(c.begin(), uint32(s), uint32(i))); err != nil {
					t.Errorf("sender %d frame %d: %v", s, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	if len(g.data) != senders*per*8 {
		t.Fatalf("got %d octets, want %d", len(g.data), senders*per*8)
	}
	next := make([]uint32, senders)
	for b := g.data; len(b) > 0; b = b[8:] {
		s, i := binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
		if s >= senders || i != next[s] {
			t.Fatalf("sender %d: frame %d arrived, want %d (frames mangled or reordered)", s, i, next[s])
		}
		next[s]++
	}
	if g.writes >= senders*per {
		t.Errorf("%d Writes for %d frames: nothing was coalesced", g.writes, senders*per)
	}
	if last.Load() == 0 {
		t.Error("lastSent was not updated")
	}
	t.Logf("%d frames in %d Writes", senders*per, g.writes)
}

// A failed Write is reported to the callers whose frames it carried and
// to later callers (stream 0 does not recover); earlier callers succeed.
func TestCtrlWriterReportsErrors(t *testing.T) {
	g := &gateWriter{failAt: 2}
	var last atomic.Int64
	c := newCtrlWriter(g, &last)
	if err := c.commit(rec(c.begin(), 0, 0)); err != nil {
		t.Fatalf("first frame: %v", err)
	}
	if err := c.commit(rec(c.begin(), 0, 1)); !errors.Is(err, errInjected) {
		t.Fatalf("second frame: got %v, want the Write's error", err)
	}
	if err := c.commit(rec(c.begin(), 0, 2)); !errors.Is(err, errInjected) {
		t.Fatalf("frame after the failure: got %v, want the first failure", err)
	}
	if g.writes != 2 {
		t.Errorf("%d Writes, want 2 (nothing is written after a failure)", g.writes)
	}
	if len(g.data) != 8 {
		t.Errorf("%d octets written, want only the first frame's 8", len(g.data))
	}
}

// The queue is bounded: a caller waits for room while ctrlBatchMax octets
// are queued behind the Write in flight.
func TestCtrlWriterBounded(t *testing.T) {
	g := &gateWriter{gate: make(chan struct{})}
	var last atomic.Int64
	c := newCtrlWriter(g, &last)
	first := make(chan error, 1)
	go func() { first <- c.commit(rec(c.begin(), 0, 0)) }()
	// Wait until the first Write is in flight.
	for {
		c.mu.Lock()
		w := c.writing
		c.mu.Unlock()
		if w {
			break
		}
		runtime.Gosched()
	}
	big := make([]byte, ctrlBatchMax)
	second := make(chan error, 1)
	go func() { second <- c.commit(append(c.begin(), big...)) }()
	for { // the big batch is queued
		c.mu.Lock()
		n := len(c.buf)
		c.mu.Unlock()
		if n == ctrlBatchMax {
			break
		}
		runtime.Gosched()
	}
	entered := make(chan struct{})
	third := make(chan error, 1)
	go func() {
		b := c.begin()
		close(entered)
		third <- c.commit(rec(b, 0, 2))
	}()
	select {
	case <-entered:
		t.Fatal("begin returned while the queue was full")
	default:
	}
	// Release Writes until all three returned (the third frame may join
	// the big batch once the first Write returned).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case g.gate <- struct{}{}:
			case <-stop:
				return
			}
		}
	}()
	for i, ch := range []chan error{first, second, third} {
		if err := <-ch; err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	<-entered
	if want := 16 + ctrlBatchMax; len(g.data) != want {
		t.Fatalf("%d octets, want %d", len(g.data), want)
	}
}
