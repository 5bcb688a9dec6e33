package bridge_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/eventlog"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestEventLogOptionsReachTheLog: Options.EventLog configures the bridge's
// event log. With a 2-event tail, a live subscriber that blocks on its first
// event while documents complete is cut off with ErrConsumerTooSlow (the
// default 65,536-event tail would keep it going).
func TestEventLogOptionsReachTheLog(t *testing.T) {
	e := newEnv(t, withBridgeOpts(func(o *bridge.Options) {
		o.EventLog = eventlog.Options{TailEvents: 2}
	}))
	e.waitReady()
	release := make(chan struct{})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		ctx := bridge.WithStartHook(context.Background(), func() { close(started) })
		done <- e.b.Events().Subscribe(ctx, "", "slow", nil, bridge.EventFilter{}, func(*gatewayv1.Event) error {
			<-release
			return nil
		})
	}()
	<-started
	for range 3 {
		e.wait(e.submit([]byte("hello"), nil).GetId(), 20*time.Second)
	}
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, bridge.ErrConsumerTooSlow) {
			t.Fatalf("subscriber ended with %v, want ErrConsumerTooSlow (tail option not applied?)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber still running: the 2-event tail option did not reach the event log")
	}
	w, err := e.b.Events().Window(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if w.GetSnapshotBytes() == 0 {
		t.Errorf("window reports snapshotBytes 0 with 3 documents stored: %v", w)
	}
}
