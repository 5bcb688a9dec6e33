package bench

import "time"

// Defaults: `gateway bench` alone must give a useful answer in under a
// minute on a 2-core machine (docs/performance.md).
const (
	// DefaultBulkBytes is large enough that the per-document fixed costs
	// (commit, dispatch, watch) vanish against the byte path.
	DefaultBulkBytes = 256 << 20
	// DefaultSmallBytes is the "small document" size of the issue.
	DefaultSmallBytes = 4 << 10
	// DefaultConcurrency keeps enough requests in flight to hide the
	// group-commit latency of the store without queueing for seconds.
	DefaultConcurrency = 64
	// DefaultDuration is each timed run of the small, churn, control and
	// fan-out phases (every path and its baseline get one): 2 s gives
	// stable rates and, with the bulk phase (~30 s for 256 MiB at today's
	// gateway rate on 2 cores), keeps the whole run under a minute.
	DefaultDuration = 2 * time.Second
	// DefaultEntityBytes is the entity size of the churn phase.
	DefaultEntityBytes = 1 << 10
	// DefaultSubscribers is the fan-out of the issue: 1,000 WebSocket
	// subscribers.
	DefaultSubscribers = 1000
	// DefaultFanoutDocs bounds the documents submitted per second in the
	// fan-out phase so that generation does not starve delivery: 20 docs/s
	// make ~45 events/s, ~45,000 deliveries/s to 1,000 subscribers, about
	// what 2 cores deliver today.
	DefaultFanoutDocs = 20
	// DefaultSnapshotDocs: issue 24's large store, a million small
	// documents, for the snapshot phase.
	DefaultSnapshotDocs = 1_000_000

	// chunkBytes is the write/message size of every upload path and both
	// bulk baselines: the gateway's own REST-to-gRPC chunk (256 KiB).
	chunkBytes = 256 << 10
	// startTimeout bounds a gateway subprocess becoming healthy.
	startTimeout = 30 * time.Second
	// stopTimeout bounds its graceful shutdown before SIGKILL.
	stopTimeout = 15 * time.Second
	// waitTimeout bounds any single wait for a document to finish; a stuck
	// gateway fails the bench instead of hanging it.
	waitTimeout = 120 * time.Second
)

// DefaultHistoryDocs are the store sizes of the history phase: issue 25's
// "flat with history" compares the small-document rate on a store with a
// million documents with the rate on an empty one.
var DefaultHistoryDocs = []int{0, 100_000, 1_000_000}
