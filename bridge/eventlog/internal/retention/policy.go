package retention

import "time"

// Config is the retention policy (RRDP delta retention draft section 3 plus
// RFC 8182's size rule and operator hard caps). Every field must be set; the
// eventlog package fills defaults.
type Config struct {
	// Adaptive enables client tracking (draft section 3). When false the
	// policy keeps everything up to the caps: with no caps set that is RFC
	// 8182's size-only policy; with MaxEvents/MaxAge it is the count- or
	// time-based policy of draft section 2.1.
	Adaptive bool
	// InactiveAfter: clients not seen for this long stop counting.
	InactiveAfter time.Duration
	// SafetyMargin is subtracted from the minimum client position.
	SafetyMargin uint64
	// CostModel: a disconnected client's position counts only while its
	// delta costs fewer bytes than the snapshot fallbacks it is expected to
	// save (costmodel.go, docs/retention.md "Cost model").
	CostModel bool
	// KeepNewest: never prune the newest N events (draft safeguard).
	KeepNewest int
	// MinAge is the retention floor (--retain-min): events younger than
	// this are never pruned, not even by the snapshot-size cap, as long as
	// they total at most MinBytes (0: no byte bound). Only the operator's
	// hard caps (MaxAge, MaxBytes, MaxEvents) go below it. It applies with
	// or without Adaptive.
	MinAge   time.Duration
	MinBytes uint64
	// PositionMaxAge: a client position whose event is older than this does
	// not count (a stuck or hostile client cannot pin the log).
	PositionMaxAge time.Duration
	// SnapshotCap applies RFC 8182 section 3.3.2: retained bytes never exceed
	// the snapshot size.
	SnapshotCap bool
	// Hard caps, 0 = none. They apply after every other rule.
	MaxAge    time.Duration
	MaxBytes  uint64
	MaxEvents int
	// IndexBuckets bounds the index's memory (0: DefaultIndexBuckets).
	IndexBuckets int
}

// Reasons name the rule that decided a plan's boundary.
const (
	ReasonMinPosition = "min_position" // lowest active client position minus margin
	ReasonKeepNewest  = "keep_newest"  // newest-N safeguard held the boundary back
	ReasonMinAge      = "min_age"      // the floor (--retain-min) held it back
	ReasonPositionNil = "no_adaptive"  // size-only: nothing below the caps
	ReasonSnapshot    = "snapshot_size"
	ReasonMaxAge      = "max_age"
	ReasonMaxBytes    = "max_bytes"
	ReasonMaxEvents   = "max_events"
)

// Plan is one retention decision: prune every event with seq < KeepFrom.
type Plan struct {
	KeepFrom    uint64
	Reason      string
	MinPosition uint64 // min_serial before the margin (draft 3.2); 0 without Adaptive
	Clients     int    // active clients that counted
	LetGo       int    // active clients the cost model did not count
	Prune       int    // events to drop
	PruneBytes  uint64
	// RetainedBytes after the plan, and what RFC 8182's size-only policy
	// (snapshot cap + hard caps, no client tracking) would retain.
	RetainedBytes         uint64
	SizeOnlyRetainedBytes uint64
}

// Compute decides the boundary for idx at now. positions are the active,
// counting client positions (see Retainer); snapshotBytes is the size of a
// full snapshot. It never prunes the newest retained event (draft: at least
// one delta must remain).
func Compute(cfg Config, idx *Index, positions []uint64, now time.Time, snapshotBytes uint64) Plan {
	var p Plan
	if idx.Len() == 0 {
		return p
	}
	oldest, latest := idx.Oldest(), idx.Latest()
	keep := oldest
	p.Reason = ReasonPositionNil
	if cfg.Adaptive {
		// Draft 3.2: min_serial starts at the current serial and drops to
		// the lowest active client position.
		min := latest
		for _, pos := range positions {
			if pos < min {
				min = pos
			}
		}
		p.MinPosition, p.Clients = min, len(positions)
		keep = sat(min, cfg.SafetyMargin)
		p.Reason = ReasonMinPosition
		// Safeguards (draft 3.3) only ever lower the boundary.
		if n := idx.NthNewest(cfg.KeepNewest); n < keep {
			keep, p.Reason = n, ReasonKeepNewest
		}
		if keep < oldest {
			keep = oldest
		}
	}
	sizeOnly := oldest
	floor := floorSeq(cfg, idx, now)
	caps := func(keep uint64, reason string) (uint64, string) {
		// Draft 3.4 / RFC 8182 3.3.2: never more than the snapshot...
		if cfg.SnapshotCap {
			if s := idx.SeqKeepingBytes(snapshotBytes); s > keep {
				keep, reason = s, ReasonSnapshot
			}
		}
		// ... except the floor, which only the hard caps go below.
		if floor < keep {
			keep, reason = floor, ReasonMinAge
		}
		if cfg.MaxAge > 0 {
			if s := idx.FirstAtOrAfter(now.Add(-cfg.MaxAge)); s > keep {
				keep, reason = s, ReasonMaxAge
			}
		}
		if cfg.MaxBytes > 0 {
			if s := idx.SeqKeepingBytes(cfg.MaxBytes); s > keep {
				keep, reason = s, ReasonMaxBytes
			}
		}
		if cfg.MaxEvents > 0 {
			if s := idx.NthNewest(cfg.MaxEvents); s > keep {
				keep, reason = s, ReasonMaxEvents
			}
		}
		if keep > latest { // at least one event stays
			keep = latest
		}
		return idx.Floor(keep), reason // never inside a bucket
	}
	keep, p.Reason = caps(keep, p.Reason)
	sizeOnly, _ = caps(sizeOnly, "")
	p.KeepFrom = keep
	p.Prune = idx.Len() - idx.CountFrom(keep)
	p.PruneBytes = idx.Bytes() - idx.BytesFrom(keep)
	p.RetainedBytes = idx.BytesFrom(keep)
	p.SizeOnlyRetainedBytes = idx.BytesFrom(sizeOnly)
	return p
}

// floorSeq is the retention floor: the first seq younger than MinAge, raised
// until the floor holds at most MinBytes. Latest()+1 without a floor.
func floorSeq(cfg Config, idx *Index, now time.Time) uint64 {
	if cfg.MinAge <= 0 {
		return idx.Latest() + 1
	}
	f := idx.FirstAtOrAfter(now.Add(-cfg.MinAge))
	if cfg.MinBytes > 0 {
		f = max(f, idx.SeqKeepingBytes(cfg.MinBytes))
	}
	return f
}

// sat is a - b, floored at 0.
func sat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
