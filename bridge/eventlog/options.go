package eventlog

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pipestream/gateway/bridge/eventlog/internal/retention"
)

// Options configure New. Zero values take the defaults in params.go; a
// negative value is an error. Hard caps (MaxAge, MaxBytes) are off at zero.
type Options struct {
	// TailEvents and TailBytes bound the shared in-memory tail.
	TailEvents int
	TailBytes  int64
	// ReplayPage is the store page size for catch-up replay (at most 10000,
	// the store's ReadEvents cap).
	ReplayPage int

	// DisableAdaptive turns client tracking off: the log then keeps
	// everything up to the snapshot size and the hard caps (RFC 8182's
	// size-only policy).
	DisableAdaptive bool
	// InactiveAfter: a client not seen for this long stops counting.
	InactiveAfter time.Duration
	// SafetyMargin is subtracted from the lowest active position. Set
	// NoSafetyMargin to use 0.
	SafetyMargin   uint64
	NoSafetyMargin bool
	// KeepNewest: the newest N events are never pruned by the adaptive rule.
	KeepNewest int
	// DisableCostModel counts every active client's position as the draft
	// does, whatever its delta costs (docs/retention.md, "Cost model").
	DisableCostModel bool
	// MinAge and MinBytes are the retention floor (--retain-min,
	// --retain-min-bytes): events younger than MinAge are never pruned, not
	// even by the snapshot-size cap, as long as they total at most MinBytes
	// (set NoMinBytes for no byte bound). Only MaxAge and MaxBytes go below.
	MinAge     time.Duration
	MinBytes   int64
	NoMinBytes bool
	// IndexBuckets bounds the retention index's memory (56 bytes a bucket).
	IndexBuckets int
	// PositionMaxAge: positions whose event is older than this are ignored
	// (default: InactiveAfter, see DefaultPositionMaxAge).
	PositionMaxAge time.Duration
	// MaxAge, MaxBytes: operator hard caps, applied after every other rule
	// (0 = none). The newest event is always kept.
	MaxAge   time.Duration
	MaxBytes int64

	// SaltRotation, MaxTrackedClients, NewClientsPerSecond, NewClientsBurst
	// bound client tracking (see params.go).
	SaltRotation        time.Duration
	MaxTrackedClients   int
	NewClientsPerSecond float64
	NewClientsBurst     int

	// PruneInterval and PruneEveryEvents schedule retention passes.
	// DisablePruner turns the background pass off (call Prune yourself).
	PruneInterval    time.Duration
	PruneEveryEvents int
	DisablePruner    bool
	// PositionShareInterval: with a store shared by several replicas
	// (PositionSharer, share.go), how often this log republishes its
	// clients' lowest position between passes (default
	// DefaultPositionShareInterval); the background refresh runs with the
	// pruner.
	PositionShareInterval time.Duration

	// Now is the clock (default time.Now); tests and the simulator set it.
	Now func() time.Time
	// Logger for prune logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer for metrics (nil: none).
	Registerer prometheus.Registerer
}

// negative reports whether any count, size or duration is negative.
func (o Options) negative() bool {
	return o.TailEvents < 0 || o.TailBytes < 0 || o.ReplayPage < 0 || o.InactiveAfter < 0 || o.KeepNewest < 0 ||
		o.MinAge < 0 || o.MinBytes < 0 || o.IndexBuckets < 0 || o.PositionMaxAge < 0 || o.MaxAge < 0 || o.MaxBytes < 0 || o.SaltRotation < 0 ||
		o.MaxTrackedClients < 0 || o.NewClientsPerSecond < 0 || o.NewClientsBurst < 0 ||
		o.PruneInterval < 0 || o.PruneEveryEvents < 0 || o.PositionShareInterval < 0
}

func (o Options) withDefaults() (Options, error) {
	if o.negative() {
		return o, fmt.Errorf("eventlog: options must not be negative: %+v", o)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.TailEvents, DefaultTailEvents)
	if o.TailBytes == 0 {
		o.TailBytes = DefaultTailBytes
	}
	def(&o.ReplayPage, DefaultReplayPage)
	if o.ReplayPage > maxReplayPage {
		return o, fmt.Errorf("eventlog: ReplayPage %d exceeds the store's read limit %d", o.ReplayPage, maxReplayPage)
	}
	defDur(&o.InactiveAfter, DefaultInactiveAfter)
	if o.SafetyMargin == 0 && !o.NoSafetyMargin {
		o.SafetyMargin = DefaultSafetyMargin
	}
	def(&o.KeepNewest, DefaultKeepNewest)
	defDur(&o.MinAge, DefaultMinAge)
	if o.MinBytes == 0 && !o.NoMinBytes {
		o.MinBytes = DefaultMinBytes
	}
	def(&o.IndexBuckets, DefaultIndexBuckets)
	defDur(&o.PositionMaxAge, o.InactiveAfter) // DefaultPositionMaxAge with the default
	defDur(&o.SaltRotation, DefaultSaltRotation)
	def(&o.MaxTrackedClients, DefaultMaxTrackedClients)
	if o.NewClientsPerSecond == 0 {
		o.NewClientsPerSecond = DefaultNewClientsPerSecond
	}
	def(&o.NewClientsBurst, DefaultNewClientsBurst)
	defDur(&o.PruneInterval, DefaultPruneInterval)
	def(&o.PruneEveryEvents, DefaultPruneEveryEvents)
	defDur(&o.PositionShareInterval, DefaultPositionShareInterval)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// RetentionConfig is the policy Options describe (exported for the
// simulator, which drives the same engine with a simulated clock).
func (o Options) RetentionConfig() (retention.Config, retention.TrackerConfig, error) {
	o, err := o.withDefaults()
	if err != nil {
		return retention.Config{}, retention.TrackerConfig{}, err
	}
	return retention.Config{
			Adaptive:       !o.DisableAdaptive,
			InactiveAfter:  o.InactiveAfter,
			SafetyMargin:   o.SafetyMargin,
			CostModel:      !o.DisableAdaptive && !o.DisableCostModel,
			KeepNewest:     o.KeepNewest,
			MinAge:         o.MinAge,
			MinBytes:       uint64(o.MinBytes),
			IndexBuckets:   o.IndexBuckets,
			PositionMaxAge: o.PositionMaxAge,
			SnapshotCap:    true,
			MaxAge:         o.MaxAge,
			MaxBytes:       uint64(o.MaxBytes),
		}, retention.TrackerConfig{
			SaltRotation: o.SaltRotation,
			// Salts cover the inactivity window: a client back within it is
			// re-keyed, never orphaned (an orphan would pin its old position).
			KeepSalts:           int((o.InactiveAfter+o.SaltRotation-1)/o.SaltRotation) + 1,
			MaxClients:          o.MaxTrackedClients,
			NewClientsPerSecond: o.NewClientsPerSecond,
			NewClientsBurst:     o.NewClientsBurst,
			LongAbsence:         o.MinAge,
		}, nil
}
