package quicpeer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Concurrent SendStatus callers on one session share stream 0: every
// frame arrives intact (no interleaving inside a frame), and each entity's
// statuses arrive in the order its sender sent them (Section 6.2.3; a
// reordering would also break the receiver's transition check and close
// the connection).
func TestConcurrentStatusSenders(t *testing.T) {
	const senders, cycles = 8, 100
	p := newPair(t, cborMode)
	ctx := context.Background()
	ids := make([]uint32, senders)
	for i := range ids {
		id, err := p.client.AssignID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	// Each sender: PROCESSING, then (CHECKPOINT, PROCESSING) x cycles,
	// then COMPLETE; the receiver checks the sequence per entity.
	want := func(i int) wire.Status {
		switch {
		case i == 0:
			return wire.StatusProcessing
		case i == 2*cycles+1:
			return wire.StatusComplete
		case i%2 == 1:
			return wire.StatusCheckpoint
		default:
			return wire.StatusProcessing
		}
	}
	const perSender = 2*cycles + 2
	got := make(chan error, 1)
	go func() {
		next := map[uint32]int{}
		for n := 0; n < senders*perSender; {
			var f wire.StatusFrame
			select {
			case f = <-p.sr.statuses:
			case <-time.After(waitFor):
				t.Errorf("timed out after %d of %d STATUS frames", n, senders*perSender)
				got <- nil
				return
			}
			if f.EntityID == wire.ConnectionEntity {
				continue // cursor update
			}
			i, ok := next[f.EntityID]
			if !ok && len(next) == senders {
				got <- nil
				t.Errorf("STATUS for entity %d, which no sender used", f.EntityID)
				return
			}
			if f.Status != want(i) || f.ScopeID != 0 || f.Depth != 0 || f.HasExt {
				t.Errorf("entity %d frame %d: got %+v, want status %s", f.EntityID, i, f, want(i))
			}
			next[f.EntityID] = i + 1
			n++
		}
		got <- nil
	}()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			for i := range perSender {
				if err := p.client.SendStatus(wire.StatusFrame{Status: want(i), EntityID: id}); err != nil {
					t.Errorf("entity %d frame %d: %v", id, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	<-got
}
