package bridge

import (
	"context"
	"errors"
	"fmt"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// errWatchDone ends a Watch after the terminal update.
var errWatchDone = errors.New("watch done")

// Watch streams one document: without a cursor, first its current state,
// then every later event; with a cursor, the events from that seq
// (inclusive). Each update carries the event and the document after it. It
// returns nil after the update that shows a terminal state.
func (b *Bridge) Watch(ctx context.Context, t Tenant, id string, cursor uint64, send func(*gatewayv1.WatchDocumentResponse) error) error {
	if _, err := b.GetDocument(ctx, t, id, false); err != nil {
		return err
	}
	var cur *uint64
	if cursor > 0 {
		cur = &cursor
	}
	var lastRev, stopAt uint64
	onStart := func(latest uint64) error {
		doc, err := b.GetDocument(ctx, t, id, false)
		if err != nil {
			return err
		}
		terminal := store.IsTerminal(doc.GetState())
		if cursor == 0 {
			lastRev = doc.GetRev()
			if err := send(&gatewayv1.WatchDocumentResponse{Document: doc}); err != nil {
				return err
			}
			if terminal {
				return errWatchDone
			}
			return nil
		}
		if terminal {
			// Replay what is left from the cursor, then stop.
			evs, err := b.st.ReadEvents(ctx, store.EventQuery{From: cursor, Limit: 1, Tenant: string(t), DocID: id})
			if err != nil {
				return err
			}
			if len(evs) == 0 || evs[0].Seq > latest {
				if err := send(&gatewayv1.WatchDocumentResponse{Document: doc}); err != nil {
					return err
				}
				return errWatchDone
			}
			stopAt = latest
		}
		return nil
	}
	err := b.ev.SubscribeDocument(ctx, string(t), "", id, cur, onStart, func(ev *gatewayv1.Event) error {
		if cursor == 0 && ev.GetKind() != eventlog.KindInfo && ev.GetRev() <= lastRev {
			return nil // already part of the first update
		}
		doc, err := b.GetDocument(ctx, t, id, false)
		if err != nil {
			return err
		}
		if err := send(&gatewayv1.WatchDocumentResponse{Event: ev, Document: doc}); err != nil {
			return err
		}
		if (ev.GetKind() == kindDocument && store.IsTerminal(ev.GetState())) || (stopAt > 0 && ev.GetSeq() >= stopAt) {
			return errWatchDone
		}
		return nil
	})
	if errors.Is(err, errWatchDone) {
		return nil
	}
	return mapEventErr(err)
}

// mapEventErr maps event log errors to the bridge's.
func mapEventErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, eventlog.ErrFutureCursor):
		return fmt.Errorf("%v: %w", err, ErrFutureCursor)
	case errors.Is(err, eventlog.ErrConsumerTooSlow):
		return fmt.Errorf("%v: %w", err, ErrConsumerTooSlow)
	case errors.Is(err, eventlog.ErrClosed):
		return fmt.Errorf("the event log is closed (shutting down): %w", ErrUnavailable)
	}
	return err
}

// Events gives access to the event log.
func (b *Bridge) Events() EventLog { return events{b} }

type events struct{ b *Bridge }

func (e events) Subscribe(ctx context.Context, t Tenant, clientKey string, cursor *uint64, f EventFilter, send func(*gatewayv1.Event) error) error {
	return mapEventErr(e.b.ev.Subscribe(ctx, string(t), clientKey, cursor, eventlog.Filter{Kinds: f.Kinds, DocumentID: f.DocumentID}, send))
}

func (e events) Window(ctx context.Context) (*gatewayv1.EventWindow, error) {
	w, err := e.b.ev.Window(ctx)
	return w, mapEventErr(err)
}

func (e events) Snapshot(ctx context.Context, t Tenant) (*gatewayv1.Snapshot, error) {
	s, err := e.b.ev.Snapshot(ctx, string(t))
	if err != nil {
		return nil, mapEventErr(err)
	}
	for _, d := range s.Documents {
		d.Name = "documents/" + d.Id
		for _, c := range d.ClaimChecks {
			c.Name = "claims/" + c.ClaimId
		}
	}
	return s, nil
}
