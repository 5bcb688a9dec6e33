package quicpeer

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// idleStream is a receiveStream the workers test hands around by identity.
type idleStream struct{ id int64 }

func (s *idleStream) Read([]byte) (int, error)          { return 0, nil }
func (s *idleStream) CancelRead(wire.ErrorCode)         {}
func (s *idleStream) StreamID() int64                   { return s.id }
func (s *idleStream) SetReadDeadline(t time.Time) error { return nil }

func (w *entityWorkers) counts() (alive int, parked int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.alive, w.parked.Load()
}

// TestEntityWorkersReuseAndRetire: a stream goes to a parked worker when
// there is one (no new goroutine); workers that no stream needed for a
// whole trim period exit within two periods, a worker busy across a trim
// is not touched, the trim stops once no worker is left and starts again
// with the next one, and closing ends every parked worker. Every stream
// handed in is handled exactly once.
func TestEntityWorkersReuseAndRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			handled = map[int64]int{}
			hold    = map[int64]chan struct{}{}
		)
		w := newEntityWorkers(func(rs receiveStream) {
			mu.Lock()
			handled[rs.StreamID()]++
			ch := hold[rs.StreamID()]
			mu.Unlock()
			if ch != nil {
				<-ch
			}
		})
		blocked := func(id int64) (receiveStream, chan struct{}) {
			ch := make(chan struct{})
			mu.Lock()
			hold[id] = ch
			mu.Unlock()
			return &idleStream{id}, ch
		}
		// Three streams at once: three workers.
		var release []chan struct{}
		for id := int64(1); id <= 3; id++ {
			rs, ch := blocked(id)
			w.dispatch(rs)
			release = append(release, ch)
		}
		synctest.Wait()
		if alive, parked := w.counts(); alive != 3 || parked != 0 {
			t.Fatalf("three held streams: %d workers alive, %d parked; want 3, 0", alive, parked)
		}
		for _, ch := range release {
			close(ch)
		}
		synctest.Wait()
		// A fourth stream reuses a parked worker.
		w.dispatch(&idleStream{4})
		synctest.Wait()
		if alive, parked := w.counts(); alive != 3 || parked != 3 {
			t.Fatalf("after a fourth stream: %d workers alive, %d parked; want 3 (reused), 3", alive, parked)
		}
		// Hold one worker busy across the trims.
		busy, stop := blocked(5)
		w.dispatch(busy)
		synctest.Wait()
		// The first trim (one period after the first worker started) saw
		// every worker busy at some point: it retires none.
		time.Sleep(workerIdle - time.Nanosecond)
		synctest.Wait()
		if alive, _ := w.counts(); alive != 3 {
			t.Fatalf("before the first trim: %d workers alive, want 3", alive)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if alive, _ := w.counts(); alive != 3 {
			t.Fatalf("after the first trim: %d workers alive, want 3 (each was needed in that period)", alive)
		}
		// The second trim retires the two idle ones, not the busy one.
		time.Sleep(workerIdle)
		synctest.Wait()
		if alive, parked := w.counts(); alive != 1 || parked != 0 {
			t.Fatalf("after the second trim: %d workers alive, %d parked; want the busy one only", alive, parked)
		}
		close(stop)
		synctest.Wait()
		time.Sleep(2 * workerIdle)
		synctest.Wait()
		if alive, _ := w.counts(); alive != 0 {
			t.Fatalf("two periods after the last stream: %d workers alive, want 0", alive)
		}
		time.Sleep(workerIdle)
		synctest.Wait()
		w.mu.Lock()
		trimming := w.trimmer != nil
		w.mu.Unlock()
		if trimming {
			t.Fatal("no worker left, yet a trim is still scheduled")
		}
		// A new stream starts a worker and the trim again; close ends it.
		w.dispatch(&idleStream{6})
		synctest.Wait()
		if alive, parked := w.counts(); alive != 1 || parked != 1 {
			t.Fatalf("a stream after the trims: %d workers alive, %d parked; want 1, 1", alive, parked)
		}
		w.close()
		synctest.Wait()
		if alive, _ := w.counts(); alive != 0 {
			t.Fatalf("after close: %d workers alive, want 0", alive)
		}
		time.Sleep(3 * workerIdle) // a trim after close must not send on the closed channel
		mu.Lock()
		defer mu.Unlock()
		for id := int64(1); id <= 6; id++ {
			if handled[id] != 1 {
				t.Errorf("stream %d handled %d times, want once", id, handled[id])
			}
		}
	})
}
