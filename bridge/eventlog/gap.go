package eventlog

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Gaps. Seqs are dense (Store): every seq up to LastSeq was committed. A
// seq that never reaches the log is a gap: with a store shared by several
// replicas (pgstore), another replica may prune events before this one's
// store delivered them (a replica paused past a prune). The log never
// skips such a range silently: publishLocked puts a gap item on the tail
// in its place, and every subscriber that reaches it is sent an #info
// OutdatedCursor event naming the missing range before the next event,
// whatever its filter (the range may hold any tenant's, document's or
// kind's events). A replay from the store checks the store's oldest
// retained seq after each page (replayPage) for the same reason.

// gapItem is the tail item for the missing seqs from..to.
func (l *Log) gapItem(from, to uint64) *item {
	l.opts.Logger.Warn("eventlog: committed events never reached this replica (pruned by another before it read them); subscribers are told",
		"from", from, "to", to)
	return &item{seq: from, gapTo: to, t: l.opts.Now()}
}

// gapEvent is the #info OutdatedCursor event announcing that the events
// from..to are missing from the stream.
func (l *Log) gapEvent(from, to uint64) *gatewayv1.Event {
	return &gatewayv1.Event{
		Kind: KindInfo,
		Time: timestamppb.New(l.opts.Now()),
		Name: InfoOutdatedCursor,
		Message: fmt.Sprintf("events %d to %d were pruned before this gateway could deliver them, so this stream skips them; "+
			"resync from the snapshot (GetSnapshot, GET /v1/events:snapshot) and resume from its seq, "+
			"or continue with the events that follow", from, to),
	}
}

// sendGap tells the subscriber of the missing seqs from..to (once it
// needs them: next <= to) and moves it past them.
func (sub *subscriber) sendGap(from, to uint64) error {
	if sub.next > to {
		return nil
	}
	from = max(from, sub.next)
	sub.next = to + 1
	return sub.send(sub.l.gapEvent(from, to))
}

// storeOldest is the oldest seq the store retains now (LastSeq+1 when it
// retains none): every event below it is gone, whichever replica pruned it.
func (l *Log) storeOldest(ctx context.Context) (uint64, error) {
	st, err := l.st.EventStats(ctx)
	if err != nil {
		return 0, err
	}
	if st.OldestSeq == 0 {
		return st.LatestSeq + 1, nil
	}
	return st.OldestSeq, nil
}

// Outdated returns the #info OutdatedCursor event a subscription from
// cursor would start with (its events were pruned, by this replica or
// another sharing the store), or nil when cursor is 0 or retained. For
// callers that answer from a cursor without following the log (a watch of
// a finished document).
func (l *Log) Outdated(ctx context.Context, cursor uint64) (*gatewayv1.Event, error) {
	if cursor == 0 {
		return nil, nil
	}
	l.pubMu.Lock()
	oldest := l.oldestLocked()
	l.pubMu.Unlock()
	so, err := l.storeOldest(ctx)
	if err != nil {
		return nil, err
	}
	if oldest = max(oldest, so); cursor >= oldest {
		return nil, nil
	}
	if l.m != nil {
		l.m.OutdatedCursor.Inc()
	}
	return outdatedEvent(l.opts.Now(), cursor, oldest), nil
}
