package sqlite

import "time"

// Tunables, each with the reason for its default.
const (
	// dbFileName is the SQLite file inside the data directory.
	dbFileName = "gateway.db"
	// spoolDir and resultDir hold payload files inside the data directory.
	spoolDir  = "spool"
	resultDir = "results"

	// defaultSynchronous: FULL fsyncs the WAL at every commit, so an
	// acknowledged write survives power loss too; group commit pays one
	// fsync per transaction, not per batch.
	defaultSynchronous = "FULL"
	// defaultMaxGroupBatches bounds one transaction: large enough to
	// amortize the fsync under load, small enough that a transaction stays
	// well under a millisecond of CPU per batch times this.
	defaultMaxGroupBatches = 512
	// defaultQueueDepth: callers beyond this block in Commit (backpressure)
	// instead of growing memory.
	defaultQueueDepth = 4096
	// defaultReadConns: readers run in parallel with the writer in WAL mode;
	// a few connections cover the 2-4 cores this targets.
	defaultReadConns = 4
	// defaultBusyTimeout: the single writer never contends with itself; this
	// only covers checkpoints and external tools holding a lock.
	defaultBusyTimeout = 5 * time.Second

	// defaultPageSize and maxPageSize follow AIP-158 (a default, a cap).
	defaultPageSize = 50
	maxPageSize     = 1000
	// defaultEventLimit and maxEventLimit bound one ReadEvents call so replay
	// memory stays bounded; callers page by seq.
	defaultEventLimit = 1000
	maxEventLimit     = 10000
	// maxBlockEvents bounds the events of one event block: a group with
	// more writes several blocks, so a reader that wants one event of a
	// block decodes at most this many heads.
	maxBlockEvents = 256
	// pruneBlocks is how many blocks one step of a prune reads.
	pruneBlocks = 256
	// maxDocIDLen bounds document ids used in file names.
	maxDocIDLen = 128
)
