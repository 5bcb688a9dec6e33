package eventlog

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// snapshotSize caches store.SnapshotBytes (an O(documents) scan) for Window
// and the retention pass. The cache is tagged with the store's count of
// committed transactions at the time of the scan: documents and digests
// change only in commits, so an unchanged count means an unchanged size.
type snapshotSize struct {
	bytes    atomic.Int64 // last measured size; read without the lock
	measured atomic.Bool  // bytes holds a measurement

	mu   sync.Mutex // held while measuring
	txns uint64     // store transactions committed when the last scan started
	at   time.Time  // when it finished (wall clock with monotonic reading)
	cost time.Duration
	ok   bool // measured at least once
}

// snapshotBytes returns the snapshot size for Window: the cached value when
// it is fresh, else a new scan. Fresh means nothing was committed since the
// scan, or the scan is younger than snapshotRefresh (stretched to
// snapshotCostFactor times the scan's own duration, so polling Window costs
// at most ~1/snapshotCostFactor of a core) and not 0. A cached 0 with new
// commits is always re-measured: the first documents must show up at once.
// Beyond snapshotMaxStale a scan runs anyway (rows written by another
// process). Concurrent callers never queue behind a scan: they get the
// cached value. Cheap path: one atomic load and a clock read.
func (l *Log) snapshotBytes(ctx context.Context) int64 {
	c := &l.snap
	if !c.mu.TryLock() {
		return c.bytes.Load()
	}
	defer c.mu.Unlock()
	age := time.Since(c.at)
	changed := l.st.WriterStats().Transactions != c.txns
	fresh := c.ok && age < snapshotMaxStale &&
		(!changed || (c.bytes.Load() != 0 && age < max(snapshotRefresh, snapshotCostFactor*c.cost)))
	if fresh {
		return c.bytes.Load()
	}
	if _, err := l.measureSnapshotLocked(ctx); err != nil && ctx.Err() == nil {
		l.opts.Logger.Warn("eventlog: snapshot size", "err", err)
	}
	return c.bytes.Load()
}

// knownSnapshotBytes is the last measured snapshot size, or the largest
// value when none was measured yet (the cost model then keeps every
// client: an unknown snapshot is not a cheap one).
func (l *Log) knownSnapshotBytes() uint64 {
	if !l.snap.measured.Load() {
		return math.MaxUint64
	}
	return uint64(max(l.snap.bytes.Load(), 0))
}

// passSnapshot is the snapshot size for a retention pass: a new scan,
// unless the last one is younger than snapshotCostFactor times its own
// duration (and snapshotMaxStale) and measured a non-empty snapshot. The
// scan is O(documents): at a million documents it takes about a second,
// and a pass runs every PruneEveryEvents appends (about once a second at
// intake rates), so scanning on every pass would keep a core (and the disk)
// busy re-reading the documents table. Unlike Window it waits for a scan
// in progress rather than take an unmeasured size.
func (l *Log) passSnapshot(ctx context.Context) (int64, error) {
	c := &l.snap
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && passReuses(c.bytes.Load(), time.Since(c.at), c.cost) {
		return c.bytes.Load(), nil
	}
	return l.measureSnapshotLocked(ctx)
}

// passReuses tells whether a retention pass takes a cached snapshot size
// of bytes, measured age ago by a scan that took cost: only a non-empty
// one younger than snapshotCostFactor times its cost and
// snapshotMaxStale. A cheap scan (a small store) is always redone.
func passReuses(bytes int64, age, cost time.Duration) bool {
	return bytes != 0 && age < snapshotMaxStale && age < snapshotCostFactor*cost
}

func (l *Log) measureSnapshotLocked(ctx context.Context) (int64, error) {
	c := &l.snap
	txns := l.st.WriterStats().Transactions // before the scan: a commit during it makes the next call re-measure
	start := time.Now()
	sb, err := l.st.SnapshotBytes(ctx)
	if err != nil {
		return 0, err
	}
	c.bytes.Store(max(sb, 0))
	c.measured.Store(true)
	c.txns, c.at, c.cost, c.ok = txns, time.Now(), time.Since(start), true
	return max(sb, 0), nil
}
