package eventlog

import (
	"context"
	"math"
	"sync/atomic"
)

// snapshotSize is the last snapshot size read from the store
// (store.SnapshotBytes, a total the store keeps exact at every commit: one
// lookup, no scan), for the cost model between passes.
type snapshotSize struct {
	bytes    atomic.Int64 // last size read
	measured atomic.Bool  // bytes holds a size read from the store
}

// snapshotBytes returns the snapshot size for Window: the store's total as
// of its last commit, or on a read error (logged) the last size read.
func (l *Log) snapshotBytes(ctx context.Context) int64 {
	if _, err := l.readSnapshotBytes(ctx); err != nil && ctx.Err() == nil {
		l.opts.Logger.Warn("eventlog: snapshot size", "err", err)
	}
	return l.snap.bytes.Load()
}

// knownSnapshotBytes is the last snapshot size read, or the largest value
// when none was read yet (the cost model then keeps every client: an
// unknown snapshot is not a cheap one).
func (l *Log) knownSnapshotBytes() uint64 {
	if !l.snap.measured.Load() {
		return math.MaxUint64
	}
	return uint64(max(l.snap.bytes.Load(), 0))
}

// readSnapshotBytes reads the snapshot size from the store (a retention
// pass reads it every time: it is exact as of the last commit, so the size
// cap never prunes against a stale size) and remembers it.
func (l *Log) readSnapshotBytes(ctx context.Context) (int64, error) {
	sb, err := l.st.SnapshotBytes(ctx)
	if err != nil {
		return 0, err
	}
	sb = max(sb, 0)
	l.snap.bytes.Store(sb)
	l.snap.measured.Store(true)
	return sb, nil
}
