package eventlog

import "time"

// Tunables, one line of rationale each. Retention defaults follow
// draft-liu-sidrops-rrdp-delta-retention-policy-01 (section numbers refer to
// it) where it gives a figure; the others are ours and say why.
const (
	// DefaultTailEvents bounds the shared in-memory tail: 64k events cover
	// minutes of peak traffic, so live subscribers never touch disk.
	DefaultTailEvents = 1 << 16
	// DefaultTailBytes bounds the tail's encoded event bytes (whichever
	// limit is hit first evicts).
	DefaultTailBytes = 64 << 20
	// DefaultReplayPage is the store page size for catch-up replay: large
	// enough to amortize a query, small enough to stay a constant per
	// subscriber (pages are decoded one at a time).
	DefaultReplayPage = 256
	// maxReplayPage is the store's ReadEvents cap: a page never comes back
	// short because of it, which replay relies on.
	maxReplayPage = 10000
	// subscriberBatch is how many tail items a subscriber copies per lock
	// acquisition (pointers only: 512 bytes per subscriber).
	subscriberBatch = 64

	// DefaultInactiveAfter: section 4.1 "client inactivity threshold
	// (default: 7 days)".
	DefaultInactiveAfter = 7 * 24 * time.Hour
	// DefaultSafetyMargin: section 4.1 "safety margin for minimum serial
	// number calculation (default: 5)".
	DefaultSafetyMargin = 5
	// DefaultKeepNewest: section 3.3 "Never delete the most recent N (e.g.,
	// 5) delta files".
	DefaultKeepNewest = 5
	// DefaultMinAge: section 3.3 "Maintain delta files for a minimum time
	// period" gives no figure; one hour covers a client polling hourly
	// (rpki-client's default interval) that is not tracked yet (new, evicted
	// or re-salted).
	DefaultMinAge = time.Hour
	// DefaultMinBytes bounds the floor: an hour of a very busy log could be
	// gigabytes; beyond 256 MiB the floor is the newest 256 MiB of events
	// (and the snapshot-size cap applies again below it).
	DefaultMinBytes = 256 << 20
	// DefaultIndexBuckets bounds the retention index: 16,384 buckets of 56
	// bytes (under 1 MiB) whatever the number of retained events; exact
	// while fewer events than buckets are retained, rounded to bucket
	// boundaries (keeping more) beyond.
	DefaultIndexBuckets = 16384
	// DefaultPositionMaxAge: a position whose event is older than the
	// inactivity threshold stops counting, so a client that keeps asking for
	// an old cursor cannot pin the log (section 6, Denial of Service). It
	// follows Options.InactiveAfter when that is set.
	DefaultPositionMaxAge = DefaultInactiveAfter
	// DefaultSaltRotation: section 5 "hashing with a rotating salt"; daily.
	// Salts are kept for InactiveAfter (plus one period) so a returning
	// client is re-keyed; after that it cannot be linked any more.
	DefaultSaltRotation = 24 * time.Hour
	// DefaultMaxTrackedClients caps the tracker (about 150 bytes a client,
	// so 64k clients cost ~10 MB); LRU eviction of idle clients beyond it.
	DefaultMaxTrackedClients = 1 << 16
	// DefaultNewClientsPerSecond and DefaultNewClientsBurst rate-limit new
	// tracker entries (section 6: "rate limiting"); untracked clients are
	// still served.
	DefaultNewClientsPerSecond = 50
	DefaultNewClientsBurst     = 500
	// DefaultPruneInterval: section 3.2 recalculates "periodically"; a
	// minute keeps the window close to the policy without measurable cost.
	DefaultPruneInterval = time.Minute
	// DefaultPruneEveryEvents also triggers a pass when this many events
	// were appended since the last one (section 3.2: "whenever a new delta
	// file is created", batched per section 4.1).
	DefaultPruneEveryEvents = 8192
	// DefaultPositionShareInterval: with a store shared by several
	// replicas (PositionSharer), how often a log republishes its clients'
	// lowest position between passes: a new client of one replica holds
	// back another's pruning within this time; one tiny UPSERT each.
	DefaultPositionShareInterval = 2 * time.Second
	// positionTTLIntervals: a published position row lives this many share
	// intervals (10 s by default): two missed refreshes cost nothing, and a
	// dead replica's clients stop holding the log back 10 s after its last.
	positionTTLIntervals = 5

	// pruneStepEvents bounds the events one store call of a retention
	// pass deletes (one write transaction; prune.go pruneInSteps).
	pruneStepEvents = 8192
)
