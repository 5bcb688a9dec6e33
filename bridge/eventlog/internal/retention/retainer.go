package retention

import (
	"log/slog"
	"sync"
	"time"
)

// Retainer is the retention engine shared by the event log and the
// simulator: the client tracker, the index of retained events and the
// policy. The caller owns storage: it asks for a Plan, deletes the events
// below Plan.KeepFrom, then calls Applied. Safe for concurrent use.
type Retainer struct {
	cfg     Config
	tracker *Tracker
	log     *slog.Logger
	m       *Metrics

	mu      sync.Mutex
	idx     Index
	pos     []uint64 // scratch for Plan
	dropped int      // clients the cost model let go in the last Plan
}

// NewRetainer builds a Retainer. log and m may be nil.
func NewRetainer(cfg Config, tcfg TrackerConfig, now time.Time, log *slog.Logger, m *Metrics) *Retainer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Retainer{cfg: cfg, tracker: NewTracker(tcfg, now), log: log, m: m}
	r.idx.MaxBuckets = cfg.IndexBuckets
	return r
}

// Config returns the policy.
func (r *Retainer) Config() Config { return r.cfg }

// Tracker returns the client tracker.
func (r *Retainer) Tracker() *Tracker { return r.tracker }

// Appended records committed events in seq order.
func (r *Retainer) Appended(seq uint64, t time.Time, size int) {
	r.mu.Lock()
	r.idx.Append(seq, t, size)
	r.mu.Unlock()
}

// AppendedRange records a range of committed events as one index bucket
// (Index.AppendRange), for loading a large log at start.
func (r *Retainer) AppendedRange(first, last, count uint64, oldest, newest time.Time, bytes uint64) {
	r.mu.Lock()
	r.idx.AppendRange(first, last, count, oldest, newest, bytes)
	r.mu.Unlock()
}

// Window is the retained range (0, 0 when empty), event count and bytes.
func (r *Retainer) Window() (oldest, latest uint64, events int, bytes uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idx.Oldest(), r.idx.Latest(), r.idx.Len(), r.idx.Bytes()
}

// Touch records a request by clientKey for cursor (nil: live only) and
// returns the client's entry (nil when untracked). The recorded position is
// the cursor clamped into [oldest, latest]: a cursor below the window cannot
// hold back anything (its events are already gone), and "live only" means
// the latest seq.
func (r *Retainer) Touch(clientKey string, cursor *uint64, now time.Time) *Client {
	if !r.cfg.Adaptive {
		return nil
	}
	r.mu.Lock()
	oldest, latest := r.idx.Oldest(), r.idx.Latest()
	r.mu.Unlock()
	pos := latest
	if cursor != nil {
		pos = min(max(*cursor, oldest), latest)
	}
	return r.tracker.Touch(clientKey, pos, now)
}

// Release ends one subscription of c.
func (r *Retainer) Release(c *Client, now time.Time) { r.tracker.Release(c, now) }

// Remote is what the other event logs sharing the store reported
// (docs/scale-out.md, Retention across replicas): the lowest position of
// their counting clients and how many counted (0: nothing held back).
type Remote struct {
	Min     uint64
	Clients int
}

// Counting expires inactive clients and returns the lowest position of
// the clients that count at now (the rule of Plan) and how many count:
// what this log shares with the other logs of its store.
func (r *Retainer) Counting(now time.Time, snapshotBytes uint64) (lowest uint64, n int) {
	if !r.cfg.Adaptive {
		return 0, 0
	}
	r.tracker.Expire(now, r.cfg.InactiveAfter)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.countingLocked(now, snapshotBytes, false)
	for i, p := range r.pos {
		if i == 0 || p < lowest {
			lowest = p
		}
	}
	return lowest, len(r.pos)
}

// Plan expires inactive clients and computes the boundary at now. Client
// positions count when the client is active (connected or seen within
// InactiveAfter), the position is still retained, and its event is younger
// than PositionMaxAge. remote (optional) adds the other logs' lowest
// position under the same rules, so that their clients hold back this
// log's pruning too; Plan.Clients then counts theirs as well.
func (r *Retainer) Plan(now time.Time, snapshotBytes uint64, remote ...Remote) Plan {
	if r.cfg.Adaptive {
		r.tracker.Expire(now, r.cfg.InactiveAfter)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropped = 0
	r.countingLocked(now, snapshotBytes, true)
	clients := len(r.pos)
	for _, x := range remote {
		if r.cfg.Adaptive && x.Clients > 0 && r.countsLocked(x.Min, now) {
			r.pos = append(r.pos, x.Min)
			clients += x.Clients
		}
	}
	p := Compute(r.cfg, &r.idx, r.pos, now, snapshotBytes)
	if p.Clients > 0 {
		p.Clients = clients
	}
	p.LetGo = r.dropped
	if r.m != nil {
		r.m.SnapshotBytes.Set(float64(snapshotBytes))
		r.m.TrackedClients.Set(float64(r.tracker.Len()))
		r.m.ActiveClients.Set(float64(p.Clients))
		r.m.LetGoClients.Set(float64(p.LetGo))
		r.m.BytesSaved.Set(float64(p.SizeOnlyRetainedBytes) - float64(p.RetainedBytes))
	}
	return p
}

// countingLocked sets r.pos to the positions of the local clients that
// count at now (observe: record their lag in the metrics, once per
// pass). With the cost model, a disconnected client counts only while its
// delta is worth keeping (costmodel.go). Caller holds r.mu.
func (r *Retainer) countingLocked(now time.Time, snapshotBytes uint64, observe bool) {
	r.pos = r.pos[:0]
	if !r.cfg.Adaptive {
		return
	}
	latest := r.idx.Latest()
	in := costInputs{now: now, snapshot: snapshotBytes, rate: r.rateLocked(now), long: r.cfg.MinAge}
	r.tracker.eachWithPool(now, r.cfg.InactiveAfter, func(v ClientView, p *pool) {
		if observe && r.m != nil && latest >= v.Pos {
			r.m.ClientLag.Observe(float64(latest - v.Pos))
		}
		if !r.countsLocked(v.Pos, now) {
			return
		}
		in.pool = p
		if r.cfg.CostModel && !r.keepFor(v, in) {
			r.dropped++
			return
		}
		r.pos = append(r.pos, v.Pos)
	})
}

// countsLocked reports whether a client position counts: retained, and
// its event younger than PositionMaxAge. Caller holds r.mu.
func (r *Retainer) countsLocked(pos uint64, now time.Time) bool {
	if pos < r.idx.Oldest() || pos > r.idx.Latest() {
		return false
	}
	if r.cfg.PositionMaxAge > 0 {
		if t, ok := r.idx.TimeOf(pos); !ok || t.Before(now.Add(-r.cfg.PositionMaxAge)) {
			return false
		}
	}
	return true
}

// Applied records that storage dropped every event below p.KeepFrom, logs
// the prune (draft 4.1: "Log delta file pruning operations") and updates
// metrics. It returns the number of events and bytes dropped.
func (r *Retainer) Applied(p Plan) (int, uint64) {
	r.mu.Lock()
	n, b, first, last := r.idx.PruneBefore(p.KeepFrom)
	events, bytes := r.idx.Len(), r.idx.Bytes()
	r.mu.Unlock()
	if r.m != nil {
		r.m.RetainedBytes.Set(float64(bytes))
		r.m.RetainedEvents.Set(float64(events))
		if n > 0 {
			r.m.PrunedEvents.WithLabelValues(p.Reason).Add(float64(n))
			r.m.PrunedBytes.WithLabelValues(p.Reason).Add(float64(b))
		}
	}
	if n > 0 {
		r.log.Info("event log pruned",
			slog.Uint64("from_seq", first), slog.Uint64("to_seq", last),
			slog.Int("events", n), slog.Uint64("bytes", b), slog.String("reason", p.Reason),
			slog.Uint64("min_position", p.MinPosition), slog.Int("clients", p.Clients), slog.Int("let_go", p.LetGo),
			slog.Int("retained_events", events), slog.Uint64("retained_bytes", bytes),
			slog.Uint64("size_only_retained_bytes", p.SizeOnlyRetainedBytes))
	}
	return n, b
}
