package eventlog

import (
	"context"
	"fmt"
	"time"
)

// PruneReport is the outcome of one retention pass.
type PruneReport struct {
	// KeepFrom: every event below it is gone (0 when the log is empty).
	KeepFrom uint64
	// Reason names the rule that set KeepFrom (min_position, keep_newest,
	// min_age, snapshot_size, max_age, max_bytes, no_adaptive).
	Reason string
	// MinPosition is the lowest counting client position before the safety
	// margin (the draft's min_serial); Clients is how many counted (with a
	// PositionSharer store, the other replicas' clients included).
	MinPosition uint64
	Clients     int
	// Removed events and bytes.
	Removed      uint64
	RemovedBytes uint64
	// RetainedBytes after the pass; SizeOnlyRetainedBytes is what RFC
	// 8182's size-only policy would keep (the metric bytes_saved is the
	// difference).
	RetainedBytes, SizeOnlyRetainedBytes uint64
	SnapshotBytes                        uint64
}

// Prune runs one retention pass now (the background pass calls it every
// PruneInterval and after PruneEveryEvents appends): it measures the
// snapshot, computes the boundary (docs/retention.md) and deletes the
// events below it through the store. Passes never overlap.
func (l *Log) Prune(ctx context.Context) (PruneReport, error) {
	l.pruneMu.Lock()
	defer l.pruneMu.Unlock()
	l.sincePass.Store(0)
	sb, err := l.readSnapshotBytes(ctx)
	if err != nil {
		return PruneReport{}, fmt.Errorf("eventlog: snapshot size: %w", err)
	}
	// The other replicas' clients hold back this pass too (share.go);
	// without their positions the pass does not prune.
	remote, err := l.sharePositions(ctx)
	if err != nil {
		return PruneReport{}, err
	}
	p := l.ret.Plan(l.opts.Now(), uint64(max(sb, 0)), remote...)
	rep := PruneReport{KeepFrom: p.KeepFrom, Reason: p.Reason, MinPosition: p.MinPosition, Clients: p.Clients,
		RetainedBytes: p.RetainedBytes, SizeOnlyRetainedBytes: p.SizeOnlyRetainedBytes, SnapshotBytes: uint64(max(sb, 0))}
	if p.Prune == 0 {
		l.ret.Applied(p) // refreshes gauges
		return rep, nil
	}
	// Announce the boundary before deleting: a replay that read across it
	// sees the floor afterwards and does not trust its page.
	from := l.floor.Load()
	if p.KeepFrom > from {
		l.floor.Store(p.KeepFrom)
	}
	removed, bytes, err := l.pruneInSteps(ctx, from, p.KeepFrom)
	rep.Removed, rep.RemovedBytes = removed, bytes
	if err != nil {
		return rep, fmt.Errorf("eventlog: prune below %d: %w", p.KeepFrom, err)
	}
	l.ret.Applied(p)
	return rep, nil
}

// pruneInSteps deletes the events below keepFrom through the store, at
// most pruneStepEvents seqs per store call from from (the floor of the
// last pass: nothing below it is left) up: each call is one write
// transaction, so a pass with a large backlog (millions of events after a
// restart with a lower retention, or a store loaded without passes) lets
// the documents' commits in between instead of holding the single writer
// for one huge DELETE. Seqs are dense, so a step removes at most
// pruneStepEvents events. The last call is the one to keepFrom itself.
func (l *Log) pruneInSteps(ctx context.Context, from, keepFrom uint64) (removed, bytes uint64, err error) {
	if oldest, _, _, _ := l.ret.Window(); oldest > from {
		from = oldest // an empty prefix need not be walked
	}
	for {
		to := keepFrom
		if from < keepFrom && keepFrom-from > pruneStepEvents {
			to = from + pruneStepEvents
		}
		res, err := l.st.PruneEvents(ctx, to)
		removed, bytes = removed+res.Removed, bytes+res.Bytes
		if err != nil || to == keepFrom {
			return removed, bytes, err
		}
		from = to
	}
}

// pruner runs retention passes until Close.
func (l *Log) pruner() {
	defer l.wg.Done()
	t := time.NewTicker(l.opts.PruneInterval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // end a pass in flight at Close
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		case <-l.trigger:
		}
		if _, err := l.Prune(ctx); err != nil && ctx.Err() == nil {
			l.opts.Logger.Warn("eventlog: retention pass failed", "err", err)
		}
	}
}
