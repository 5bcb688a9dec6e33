package bridge

import (
	"context"
	"errors"
	"fmt"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// CancelForwarder is the optional part of a Store shared by several
// gateway replicas (pgstore) that carries a cancel request to the replica
// driving the document (docs/scale-out.md, Cancel across replicas).
type CancelForwarder interface {
	// SetCancelRequestedHook sets the function told of the cancel requests
	// of other replicas for the documents this replica drives; it must not
	// block.
	SetCancelRequestedHook(func(tenant, docID string))
	// RequestCancel asks the replica driving docID to cancel it.
	RequestCancel(ctx context.Context, tenant, docID string) error
}

// errCancelSeen ends cancelElsewhere's subscription.
var errCancelSeen = errors.New("terminal state seen")

// cancelElsewhere cancels document id, which another replica drives: it
// follows the document's events, asks that replica to cancel it, and
// answers once the terminal #document event is committed (so every
// replica's next read shows it): the document when it is CANCELLED,
// FAILED_PRECONDITION when it finished otherwise first, UNAVAILABLE when
// nothing happened within durableWait (the driving replica is down or
// paused; once another takes the document over, a retry cancels it).
func (b *Bridge) cancelElsewhere(ctx context.Context, t Tenant, id string) (*gatewayv1.Document, error) {
	cf, ok := b.st.(CancelForwarder)
	if !ok {
		return nil, fmt.Errorf("document %s is driven by another gateway replica, which alone can cancel it: retry: %w", id, ErrUnavailable)
	}
	wctx, cancel := context.WithTimeout(ctx, durableWait)
	defer cancel()
	var final gatewayv1.State
	onStart := func(uint64) error {
		// Every event after this point is delivered: ask only now.
		if err := cf.RequestCancel(wctx, string(t), id); err != nil {
			return mapStoreErr("cancel of document "+id, err)
		}
		rec, err := b.st.GetDocument(wctx, string(t), id, false)
		if err != nil {
			return mapStoreErr("document "+id, err)
		}
		if s := rec.Doc.GetState(); store.IsTerminal(s) {
			final = s
			return errCancelSeen
		}
		return nil
	}
	err := b.ev.SubscribeDocument(wctx, string(t), "", id, nil, onStart, func(ev *gatewayv1.Event) error {
		if ev.GetKind() == kindDocument && store.IsTerminal(ev.GetState()) {
			final = ev.GetState()
			return errCancelSeen
		}
		return nil
	})
	switch {
	case errors.Is(err, errCancelSeen) && final == gatewayv1.State_CANCELLED:
		return b.GetDocument(ctx, t, id, false)
	case errors.Is(err, errCancelSeen):
		return nil, fmt.Errorf("document %s is already %s; only PENDING or RUNNING documents can be cancelled: %w", id, final, ErrFailedPrecondition)
	case wctx.Err() != nil && ctx.Err() == nil:
		return nil, fmt.Errorf("document %s is driven by another gateway replica, which did not cancel it within %v (it may be down or paused; "+
			"once another replica takes the document over, a retry cancels it): %w", id, durableWait, ErrUnavailable)
	}
	return nil, b.mapEventErr(err, 0)
}

// cancelRequested is the store's CancelForwarder hook: another replica was
// asked to cancel docID, which this gateway drives.
func (b *Bridge) cancelRequested(tenant, docID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx.Err() != nil {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		if _, err := b.Cancel(b.ctx, Tenant(tenant), docID); err != nil {
			b.log.Info("bridge: a cancel another replica forwarded did not apply", "doc", docID, "err", err)
		}
	}()
}
