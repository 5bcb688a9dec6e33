package main

import (
	"fmt"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
)

// retentionFlags adds the event log's tail and retention flags to fs
// (docs/retention.md, "Flags"); the defaults are the RRDP delta retention
// draft's (draft-liu-sidrops-rrdp-delta-retention-policy-01, sections 3.3
// and 4.1) and the tail's params. After parsing, the returned function
// builds the eventlog.Options, or says which flag to fix.
func retentionFlags(fs *flagSet) func() (eventlog.Options, error) {
	adaptive := fs.Bool("retention-adaptive", "GATEWAY_RETENTION_ADAPTIVE", true,
		"keep the events active clients still need (the RRDP retention draft); false: keep everything up to the snapshot size (RFC 8182 size-only)")
	inactive := fs.Duration("retention-inactive-after", "GATEWAY_RETENTION_INACTIVE_AFTER", eventlog.DefaultInactiveAfter,
		"a client not seen for this long stops holding events back (draft 4.1 inactivity threshold)")
	margin := fs.Uint("retention-safety-margin", "GATEWAY_RETENTION_SAFETY_MARGIN", eventlog.DefaultSafetyMargin,
		"events kept below the lowest active client position (draft 4.1 safety margin)")
	keepNewest := fs.Uint("retention-keep-newest", "GATEWAY_RETENTION_KEEP_NEWEST", eventlog.DefaultKeepNewest,
		"the newest N events are never pruned by the adaptive rule (draft 3.3; the newest event is always kept)")
	minAge := fs.Duration("retain-min", "GATEWAY_RETAIN_MIN", eventlog.DefaultMinAge,
		"retention floor: events younger than this are never pruned, not even by the snapshot-size cap, up to --retain-min-bytes (only --retention-max-age/--retention-max-bytes go below; 0: none)")
	oldMinAge := fs.Duration("retention-min-age", "GATEWAY_RETENTION_MIN_AGE", 0,
		"deprecated name of --retain-min (used when set above 0)")
	minBytes := fs.Int64("retain-min-bytes", "GATEWAY_RETAIN_MIN_BYTES", eventlog.DefaultMinBytes,
		"byte bound of the retention floor: beyond it the floor is the newest this many bytes of events (0: no bound)")
	costModel := fs.Bool("retention-cost-model", "GATEWAY_RETENTION_COST_MODEL", true,
		"a disconnected client holds events back only while its delta costs fewer bytes than the snapshot fallback its expected return saves (docs/retention.md); false: every active client counts (the draft)")
	buckets := fs.Uint("retention-index-buckets", "GATEWAY_RETENTION_INDEX_BUCKETS", eventlog.DefaultIndexBuckets,
		"memory bound of the retention index (56 bytes a bucket, whatever the number of retained events)")
	maxAge := fs.Duration("retention-max-age", "GATEWAY_RETENTION_MAX_AGE", 0,
		"hard cap: prune events older than this whoever needs them (0: off)")
	maxBytes := fs.Int64("retention-max-bytes", "GATEWAY_RETENTION_MAX_BYTES", 0,
		"hard cap on retained event bytes, below the snapshot-size cap (0: off)")
	interval := fs.Duration("retention-prune-interval", "GATEWAY_RETENTION_PRUNE_INTERVAL", eventlog.DefaultPruneInterval,
		"how often a retention pass runs (draft 3.2); a pass also runs every 8192 appended events")
	tailEvents := fs.Uint("event-tail-events", "GATEWAY_EVENT_TAIL_EVENTS", eventlog.DefaultTailEvents,
		"events held in memory for live subscribers; a live subscriber further behind gets ConsumerTooSlow")
	tailBytes := fs.Int64("event-tail-bytes", "GATEWAY_EVENT_TAIL_BYTES", eventlog.DefaultTailBytes,
		"encoded event bytes held in memory for live subscribers")
	return func() (eventlog.Options, error) {
		switch {
		case *inactive <= 0:
			return eventlog.Options{}, fmt.Errorf("--retention-inactive-after must be positive, got %v", *inactive)
		case *minAge < 0 || *oldMinAge < 0 || *maxAge < 0:
			return eventlog.Options{}, fmt.Errorf("--retain-min (--retention-min-age) and --retention-max-age must not be negative")
		case *minBytes < 0:
			return eventlog.Options{}, fmt.Errorf("--retain-min-bytes must not be negative, got %d", *minBytes)
		case *buckets < 4:
			return eventlog.Options{}, fmt.Errorf("--retention-index-buckets must be at least 4, got %d", *buckets)
		case *interval <= 0:
			return eventlog.Options{}, fmt.Errorf("--retention-prune-interval must be positive, got %v", *interval)
		case *tailEvents == 0 || *tailBytes == 0:
			return eventlog.Options{}, fmt.Errorf("--event-tail-events and --event-tail-bytes must be positive")
		}
		o := eventlog.Options{
			DisableAdaptive: !*adaptive,
			InactiveAfter:   *inactive,
			SafetyMargin:    uint64(*margin),
			NoSafetyMargin:  *margin == 0,
			// The newest event is always kept, so 1 is the same as 0 (whose
			// Options meaning is "default").
			KeepNewest:       max(int(min(*keepNewest, 1<<30)), 1),
			MinAge:           *minAge,
			MinBytes:         *minBytes,
			NoMinBytes:       *minBytes == 0,
			IndexBuckets:     int(min(*buckets, 1<<24)),
			DisableCostModel: !*costModel,
			MaxAge:           *maxAge,
			MaxBytes:         *maxBytes,
			PruneInterval:    *interval,
			TailEvents:       int(min(*tailEvents, 1<<30)),
			TailBytes:        *tailBytes,
		}
		if *oldMinAge > 0 {
			o.MinAge = *oldMinAge
		}
		if o.MinAge == 0 {
			o.MinAge = time.Nanosecond // "none"; Options' zero means the default
		}
		return o, nil
	}
}
