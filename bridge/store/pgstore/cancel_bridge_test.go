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

// A cancel through a replica that does not drive the document is carried
// to the one that does (NOTIFY pipestream_cancels) and answers once the
// cancel is committed: the next GetDocument on either replica shows
// CANCELLED, 10 times out of 10. A cancel of a finished document through
// the other replica is FAILED_PRECONDITION.
func TestCancelThroughNonOwner(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, p.Addr().String(), p.CertPEM())
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())
	ctx := context.Background()
	var docID string
	for i := range 10 {
		docID, _ = submitDeferred(t, a, fmt.Appendf(nil, "cancelled through B %d", i))
		c, err := b.Cancel(ctx, "", docID)
		if err != nil || c.GetState() != gatewayv1.State_CANCELLED {
			t.Fatalf("run %d: Cancel through B: %v %v, want CANCELLED", i, c.GetState(), err)
		}
		for name, r := range map[string]*bridge.Bridge{"A": a, "B": b} {
			if d, err := r.GetDocument(ctx, "", docID, false); err != nil || d.GetState() != gatewayv1.State_CANCELLED {
				t.Fatalf("run %d: GetDocument on %s right after B's cancel answered: %v %v", i, name, d.GetState(), err)
			}
		}
	}
	if _, err := b.Cancel(ctx, "", docID); !errors.Is(err, bridge.ErrFailedPrecondition) {
		t.Fatalf("cancel of a cancelled document through B: %v, want ErrFailedPrecondition", err)
	}
}
