package quicpeer_test

import (
	"context"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestClientGoAwaySkipsDetached: the client's GOAWAY drain ignores
// entities detached with SetDetached (a DEFERRED document whose claim
// outlives the session, profile 7), as the server's does; an assigned ID
// that was never sent or reported still holds it.
func TestClientGoAwaySkipsDetached(t *testing.T) {
	p := newPair(t, cborMode, layers(true, true))
	ctx := context.Background()
	deferred, _ := p.client.AssignID(ctx)
	unsent, _ := p.client.AssignID(ctx)
	cext := wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: 7, ExpiryMicros: 1_800_000_000_000_000})
	for _, f := range []wire.StatusFrame{
		status(wire.StatusProcessing, deferred),
		{Status: wire.StatusDeferred, EntityID: deferred, HasExt: true, Ext: cext},
	} {
		if err := p.server.SendStatus(f); err != nil {
			t.Fatal(err)
		}
	}
	for nextStatus(t, p.cr).Status != wire.StatusDeferred {
	}
	if err := p.client.SetDetached(0, deferred, true); err != nil {
		t.Fatal(err)
	}

	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gerr := make(chan error, 1)
	go func() { gerr <- p.client.GoAway(gctx) }()
	recv(t, p.sr.goaways, "GOAWAY at the server")
	select {
	case err := <-gerr:
		t.Fatalf("GoAway returned (%v) while assigned ID %d was neither sent nor resolved", err, unsent)
	case <-time.After(300 * time.Millisecond):
	}
	complete(t, p.server, unsent)
	start := time.Now()
	if err := recv(t, gerr, "GoAway"); err != nil {
		t.Fatalf("GoAway with only a detached entity left: %v, want nil (drained)", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("GoAway took %v after the last attached entity resolved", d)
	}
}
