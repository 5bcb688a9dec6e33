package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/pgtest"
)

// Read your writes: once Cancel answered, the very next GetDocument on the
// replica that cancelled and on another replica shows CANCELLED, 20 times
// out of 20 (the cancel answers once it is durable).
func TestCancelThenGetShowsCancelOnEveryReplica(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, p.Addr().String(), p.CertPEM())
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())
	ctx := context.Background()
	for i := range 20 {
		docID, _ := submitDeferred(t, a, fmt.Appendf(nil, "cancelled %d", i))
		c, err := a.Cancel(ctx, "", docID)
		if err != nil || c.GetState() != gatewayv1.State_CANCELLED {
			t.Fatalf("run %d: Cancel: %v %v", i, c.GetState(), err)
		}
		for name, r := range map[string]*bridge.Bridge{"A": a, "B": b} {
			d, err := r.GetDocument(ctx, "", docID, false)
			if err != nil || d.GetState() != gatewayv1.State_CANCELLED {
				t.Fatalf("run %d: GetDocument on %s right after Cancel answered: %v %v, want CANCELLED", i, name, d.GetState(), err)
			}
		}
	}
}

// A cancel through a replica that does not drive the document changes
// nothing and says so with a retryable UNAVAILABLE, not the contradictory
// "already RUNNING; only RUNNING documents can be cancelled".
func TestCancelThroughNonOwnerIsRetryable(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, p.Addr().String(), p.CertPEM())
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())
	docID, _ := submitDeferred(t, a, []byte("cancelled through B"))
	_, err := b.Cancel(context.Background(), "", docID)
	if !errors.Is(err, bridge.ErrUnavailable) || errors.Is(err, bridge.ErrFailedPrecondition) {
		t.Fatalf("Cancel through B: %v, want ErrUnavailable (retry)", err)
	}
	if d, err := b.GetDocument(context.Background(), "", docID, false); err != nil || d.GetState() != gatewayv1.State_RUNNING {
		t.Fatalf("after the refused cancel: %v %v, want RUNNING", d.GetState(), err)
	}
}
