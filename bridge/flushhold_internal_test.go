package bridge

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestFlushHoldTimer: a committed document whose only changes are progress
// is held out of a flush for flushHold after its first change and no
// longer: the hold timer wakes the flusher exactly then, and the next flush
// takes it. A scope digest is never held, and a flush of everything (all)
// takes held documents at once. The hold timer runs on synctest's fake
// clock; no store or peer is needed to decide what a flush takes
// (TestHeldProgressCommitsWithoutFurtherChange covers the same rule end to
// end over QUIC).
func TestFlushHoldTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := newPlan(&gatewayv1.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reg := &registry{docs: map[string]*docRun{}}
		b := &Bridge{docEnv: &docEnv{reg: reg, ctx: context.Background(), flushCh: make(chan struct{}, 1)}, registry: reg}
		progress := func(id string) *docRun {
			d := b.newDocRun(id, "", p)
			d.committed = true
			d.out.markDirty(time.Now())
			b.docs[id] = d
			return d
		}
		take := func(all bool) []string {
			t.Helper()
			_, took := b.takeFlush(all, time.Now())
			var ids []string
			for _, f := range took {
				ids = append(ids, f.d.id)
			}
			return ids
		}
		kicked := func() bool {
			select {
			case <-b.flushCh:
				return true
			default:
				return false
			}
		}
		defer func() {
			if b.holdTimer != nil {
				b.holdTimer.Stop()
			}
		}()

		progress("held")
		if got := take(false); len(got) != 0 {
			t.Fatalf("a flush right after a progress change took %v, want it held for flushHold", got)
		}
		time.Sleep(flushHold / 2)
		progress("later") // its own hold ends later: the armed wake-up stays
		if got := take(false); len(got) != 0 {
			t.Fatalf("a flush within flushHold took %v, want both held", got)
		}
		time.Sleep(flushHold/2 - time.Nanosecond)
		synctest.Wait()
		if kicked() {
			t.Fatal("the hold timer woke the flusher before flushHold passed")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait() // the hold timer fires
		if !kicked() {
			t.Fatal("no flusher wake-up flushHold after the first held change: held progress would wait for another change")
		}
		if got := take(false); len(got) != 1 || got[0] != "held" {
			t.Fatalf("the flush at flushHold took %v, want [held]", got)
		}
		time.Sleep(flushHold / 2)
		synctest.Wait()
		if !kicked() {
			t.Fatal("no flusher wake-up for the document held second")
		}
		if got := take(false); len(got) != 1 || got[0] != "later" {
			t.Fatalf("the second flush took %v, want [later]", got)
		}

		digest := progress("digest")
		digest.out.putDigest(1, scopeKey{}, &gatewayv1.ScopeDigest{ScopeId: 1})
		progress("progress")
		if got := take(false); len(got) != 1 || got[0] != "digest" {
			t.Errorf("a flush took %v, want [digest]: a scope digest is never held, progress is", got)
		}
		if got := take(true); len(got) != 1 || got[0] != "progress" {
			t.Errorf("a flush of everything took %v, want [progress]: held documents go too", got)
		}
	})
}
