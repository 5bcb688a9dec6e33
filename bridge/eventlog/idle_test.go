package eventlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestIdleHookAfterEachCaughtUpBatch: eventlog.WithIdle's hook runs when
// the subscriber has sent everything committed so far and is about to wait
// (a transport writes the batch out then): never while events it has not
// sent are committed, once per wait; an error from it ends the
// subscription with that error.
func TestIdleHookAfterEachCaughtUpBatch(t *testing.T) {
	e := open(t, t.TempDir(), eventlog.Options{})
	e.appendN("t", 5, eventlog.KindStatus, "d1")
	errStop := errors.New("stop")
	var sent []uint64
	idles := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	appended := make(chan struct{})
	go func() {
		ctx := eventlog.WithIdle(ctx, func() error {
			idles++
			if last := sent[len(sent)-1]; last != e.log.Latest() {
				t.Errorf("idle after seq %d with seq %d committed", last, e.log.Latest())
			}
			switch idles {
			case 1: // after the replayed window; then one commit of 3 more
				if len(sent) != 5 {
					t.Errorf("first idle after %d events, want 5", len(sent))
				}
				close(appended)
			case 2:
				return errStop
			}
			return nil
		})
		done <- e.log.Subscribe(ctx, "t", "", ptr(0), eventlog.Filter{}, func(ev *gatewayv1.Event) error {
			sent = append(sent, ev.GetSeq())
			return nil
		})
	}()
	select {
	case <-appended:
	case err := <-done:
		t.Fatalf("subscription ended before its first idle: %v", err)
	case <-time.After(30 * time.Second): // a failsafe: the hook comes at once
		t.Fatal("the idle hook was not called after the replayed window")
	}
	if _, err := e.log.Append(context.Background(), batch("t", eventlog.KindStatus, "d1", e.now(), 3)); err != nil { // one commit of 3
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, errStop) {
		t.Fatalf("subscription ended with %v, want the idle hook's error", err)
	}
	if !eq(sent, seqRange(1, 8)) || idles != 2 {
		t.Fatalf("sent %v with %d idles, want 1..8 and 2", sent, idles)
	}
}
