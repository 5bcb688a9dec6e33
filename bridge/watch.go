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
// (inclusive). Each update carries the event and the document after it:
// a replay rebuilds the document as of each event from the events
// (docAsOf, watchstate.go), not the document as it is now. It returns nil
// after the update that shows a terminal state.
func (b *Bridge) Watch(ctx context.Context, t Tenant, id string, cursor uint64, send func(*gatewayv1.WatchDocumentResponse) error) error {
	if _, err := b.GetDocument(ctx, t, id, false); err != nil {
		return err
	}
	var cur *uint64
	if cursor > 0 {
		cur = &cursor
	}
	var lastRev, stopAt uint64
	var asOf *docAsOf
	onStart := func(uint64) error {
		SubscriptionStarted(ctx)
		doc, err := b.GetDocument(ctx, t, id, false)
		if err != nil {
			return err
		}
		if cursor > 0 {
			asOf = newDocAsOf(doc)
			if err := b.foldBefore(ctx, t, id, cursor, asOf); err != nil {
				return err
			}
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
			stopAt, err = b.watchFinished(ctx, t, id, cursor, doc, send)
		}
		return err
	}
	err := b.ev.SubscribeDocument(ctx, string(t), "", id, cur, onStart, func(ev *gatewayv1.Event) error {
		if cursor == 0 && ev.GetKind() != eventlog.KindInfo && ev.GetRev() > 0 && ev.GetRev() <= lastRev {
			// (rev 0: an event outside the document's revision chain, a
			// claim redeemed through another replica, remoteclaims.go)
			return nil // already part of the first update
		}
		doc, err := b.docAfter(ctx, t, id, asOf, ev)
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
	return b.mapEventErr(err, cursor)
}

// watchFinished starts a watch from cursor of a finished document: the
// document's events from the cursor are replayed, and the watch stops at the
// newest of them (returned). Some of them may be committed but not yet on
// the log's tail (published after the subscription started: the stored
// document is terminal before the tail has its terminal event), so the
// stop is the store's newest event of the document, not the tail's latest
// seq: those events come live, with their seqs, as a resumed client needs
// them. With nothing to replay it sends the document as it is, with the
// OutdatedCursor notice when the cursor's events were pruned (the answer
// then is not "nothing happened"), and ends the watch (errWatchDone).
func (b *Bridge) watchFinished(ctx context.Context, t Tenant, id string, cursor uint64, doc *gatewayv1.Document,
	send func(*gatewayv1.WatchDocumentResponse) error) (uint64, error) {
	last, err := b.newestEventFrom(ctx, t, id, cursor)
	if err != nil || last > 0 {
		return last, err
	}
	info, err := b.ev.Outdated(ctx, cursor)
	if err != nil {
		return 0, err
	}
	if err := send(&gatewayv1.WatchDocumentResponse{Event: info, Document: doc}); err != nil {
		return 0, err
	}
	return 0, errWatchDone
}

// newestEventFrom returns the seq of the document's newest stored event at
// or after from (0: none).
func (b *Bridge) newestEventFrom(ctx context.Context, t Tenant, id string, from uint64) (uint64, error) {
	var last uint64
	for {
		evs, err := b.st.ReadEvents(ctx, store.EventQuery{From: from, Tenant: string(t), DocID: id})
		if err != nil {
			return 0, mapStoreErr("events of document "+id, err)
		}
		if len(evs) == 0 {
			return last, nil
		}
		last = evs[len(evs)-1].Seq
		from = last + 1
	}
}

// docAfter returns the document after ev: the stored one for live
// watching (asOf nil), else the fold's (refreshing the stored document
// the fold ends with once ev is newer than it).
func (b *Bridge) docAfter(ctx context.Context, t Tenant, id string, asOf *docAsOf, ev *gatewayv1.Event) (*gatewayv1.Document, error) {
	if asOf == nil {
		return b.GetDocument(ctx, t, id, false)
	}
	if ev.GetRev() > asOf.cur.GetRev() {
		cur, err := b.GetDocument(ctx, t, id, false)
		if err != nil {
			return nil, err
		}
		asOf.setCurrent(cur)
	}
	return asOf.apply(ev), nil
}

// mapEventErr maps event log errors to the bridge's. The event log's
// FutureCursor and ConsumerTooSlow errors already name the condition (their
// sentinels share the bridge's text), so they are not wrapped in a second
// copy of it (sentinelErr); FutureCursor gets a message that says which
// cursor to use (futureCursorErr).
func (b *Bridge) mapEventErr(err error, cursor uint64) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, eventlog.ErrFutureCursor):
		return &futureCursorErr{cursor: cursor, latest: b.ev.Latest(), err: err}
	case errors.Is(err, eventlog.ErrConsumerTooSlow):
		return &sentinelErr{err: err, sentinel: ErrConsumerTooSlow}
	case errors.Is(err, eventlog.ErrClosed):
		return fmt.Errorf("the event log is closed (shutting down): %w", ErrUnavailable)
	}
	return err
}

// sentinelErr is err (whose message already says what happened) that also
// matches a bridge sentinel with errors.Is.
type sentinelErr struct {
	err      error
	sentinel error
}

func (e *sentinelErr) Error() string   { return e.err.Error() }
func (e *sentinelErr) Unwrap() []error { return []error{e.err, e.sentinel} }

// futureCursorErr is the AT sync FutureCursor error (draft-holmgren-at-
// synchronization-00, "Cursors and Resumption"): the cursor is above the
// latest seq. It matches ErrFutureCursor and the event log's error.
type futureCursorErr struct {
	cursor, latest uint64
	err            error // the event log's
}

func (e *futureCursorErr) Error() string {
	if e.latest >= e.cursor {
		// The log moved past the cursor since the subscription was refused.
		return fmt.Sprintf("FutureCursor: cursor %d was ahead of the latest seq when the subscription started; the latest seq is now %d: subscribe again", e.cursor, e.latest)
	}
	return fmt.Sprintf("FutureCursor: cursor %d is ahead of the latest seq %d: use a cursor <= %d (the seq of the last event you received), 0 for the whole retained window, or no cursor for live events only",
		e.cursor, e.latest, e.latest)
}

func (e *futureCursorErr) Unwrap() []error { return []error{e.err, ErrFutureCursor} }

// Events gives access to the event log.
func (b *Bridge) Events() EventLog { return events{b} }

type events struct{ b *Bridge }

func (e events) Subscribe(ctx context.Context, t Tenant, clientKey string, cursor *uint64, f EventFilter, send func(*gatewayv1.Event) error) error {
	var c uint64
	if cursor != nil {
		c = *cursor
	}
	err := e.b.ev.Follow(ctx, eventlog.Subscription{Tenant: string(t), ClientKey: clientKey, Cursor: cursor,
		Filter:  eventlog.Filter{Kinds: f.Kinds, DocumentID: f.DocumentID},
		OnStart: func(uint64) error { SubscriptionStarted(ctx); return nil }}, send)
	return e.b.mapEventErr(err, c)
}

func (e events) Window(ctx context.Context) (*gatewayv1.EventWindow, error) {
	w, err := e.b.ev.Window(ctx)
	return w, e.b.mapEventErr(err, 0)
}

func (e events) Snapshot(ctx context.Context, t Tenant) (*gatewayv1.Snapshot, error) {
	s, err := e.b.ev.Snapshot(ctx, string(t))
	if err != nil {
		return nil, e.b.mapEventErr(err, 0)
	}
	for _, d := range s.Documents {
		d.Name = "documents/" + d.Id
		for _, c := range d.ClaimChecks {
			c.Name = "claims/" + c.ClaimId
		}
	}
	return s, nil
}
