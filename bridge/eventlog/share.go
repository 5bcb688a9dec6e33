package eventlog

import (
	"context"
	"fmt"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog/internal/retention"
	"github.com/pipestream/gateway/bridge/store"
)

// PositionSharer is the optional part of a Store that several event logs
// share, one per gateway replica (pgstore; docs/scale-out.md, Retention
// across replicas). Each log prunes the one shared log but tracks only its
// own clients, so with a PositionSharer every retention pass (and every
// Options.PositionShareInterval) publishes this log's counting clients and
// prunes by the lowest position over its own clients and the other logs'
// published ones. The SQLite store, one process by construction, does not
// implement it.
type PositionSharer interface {
	// SharePositions publishes mine, valid for ttl on the store's clock,
	// and returns the other logs' unexpired positions combined: the lowest
	// Min of those with clients and the sum of their Clients.
	SharePositions(ctx context.Context, mine store.RetentionPositions, ttl time.Duration) (store.RetentionPositions, error)
}

// sharePositions publishes this log's counting clients and returns the
// other logs' (nil without a PositionSharer or without adaptive
// retention, where positions do not count).
func (l *Log) sharePositions(ctx context.Context) ([]retention.Remote, error) {
	ps, ok := l.st.(PositionSharer)
	if !ok || !l.ret.Config().Adaptive {
		return nil, nil
	}
	lowest, n := l.ret.Counting(l.opts.Now(), l.knownSnapshotBytes())
	others, err := ps.SharePositions(ctx, store.RetentionPositions{Min: lowest, Clients: n}, l.positionTTL())
	if err != nil {
		return nil, fmt.Errorf("eventlog: share retention positions: %w", err)
	}
	return []retention.Remote{{Min: others.Min, Clients: others.Clients}}, nil
}

// positionTTL is how long a published position row stays valid:
// positionTTLIntervals share intervals, so a few missed ones cost nothing
// and a dead replica's clients stop counting soon after.
func (l *Log) positionTTL() time.Duration {
	return positionTTLIntervals * l.opts.PositionShareInterval
}

// shareLoop refreshes this log's published positions every
// PositionShareInterval until Close (PositionSharer stores with adaptive
// retention only), between the retention passes, which share too.
func (l *Log) shareLoop() {
	defer l.wg.Done()
	t := time.NewTicker(l.opts.PositionShareInterval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	failing := false
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		_, err := l.sharePositions(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			l.opts.Logger.Warn("eventlog: sharing retention positions failed; retrying every interval", "err", err)
			failing = true
		case err == nil:
			failing = false
		}
	}
}
