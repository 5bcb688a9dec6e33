package eventlog

import (
	"context"

	"github.com/pipestream/gateway/bridge/store"
)

// Store is what the event log needs of the durable store: it commits
// batches, learns of committed events in seq order, replays and prunes
// them. The SQLite backend (bridge/store/sqlite) implements it; a second backend
// implements it from this contract, and bridge/store/storetest checks it.
// Safe for concurrent use. After the backend's Close, Commit and
// PruneEvents answer an error wrapping store.ErrClosed (reads fail too,
// with an error of the backend's).
//
// Event seq rules (docs/architecture.md, the event log): every event of a
// committed Batch gets a seq in the commit's transaction; seqs start at 1,
// are strictly increasing in commit order, are below store.MaxSeq
// (store.ErrSeqExhausted beyond it), and are never reused: not after
// PruneEvents removed every event, not after a crash (kill -9) and reopen.
// The seqs of one batch are consecutive, and seqs are dense: every seq up
// to LastSeq belongs to a committed event (a failed commit takes none), so
// a seq the hook never delivers is a gap (gap.go).
type Store interface {
	// Commit applies b atomically (store.Batch documents its ops, their
	// order and their preconditions) and returns once it is durable: a
	// batch whose Commit returned nil survives a crash. On error nothing of
	// b was applied; the error wraps store.ErrConflict, ErrStaleRev,
	// ErrNotFound, ErrClaimRedeemed, ErrClaimExpired, ErrInvalid,
	// ErrSeqExhausted or ErrClosed when it is one of those. If ctx ends
	// first, Commit returns ctx.Err() and the batch may or may not commit
	// later (an idempotent create makes a retry safe).
	//
	// Idempotency: b.Create with a non-empty Doc.RequestId whose (tenant,
	// request id) exists is not applied (nothing of b is): with the same
	// BodyHash, CommitResult.Duplicate is the existing document and err is
	// nil; with a different one, ErrConflict. A redeem (b.Redeem) succeeds
	// for exactly one of any number of concurrent commits of the same
	// claim; the others fail with ErrClaimRedeemed.
	//
	// CommitResult.Seqs[i] is the seq of b.Events[i]. b and its messages
	// must not be modified until Commit returns.
	Commit(ctx context.Context, b *store.Batch) (store.CommitResult, error)
	// PruneEvents deletes every event with seq < beforeSeq and reports how
	// many events and bytes (store.EventRecord.Size) it removed. LastSeq
	// and the seq counter are unchanged.
	PruneEvents(ctx context.Context, beforeSeq uint64) (store.PruneResult, error)
	// SetEventHook installs fn (nil removes it). For every commit that
	// assigned seqs, fn is called once with its events in ascending seq
	// order, after the commit is durable and before any of its Commit
	// callers return. Calls are never concurrent and their seqs ascend
	// across calls: no committed event is repeated, and none is skipped
	// except events another process sharing the store pruned before this
	// one could read them (the next call then starts above the gap, which
	// the log announces to its subscribers, gap.go). fn owns the slice; it
	// must not block and must not call Commit.
	SetEventHook(fn func([]store.EventRecord))
	// LastSeq is the highest seq committed so far (0 before the first
	// event), also after a reopen and after pruning; it never decreases.
	// Every event with a higher seq reaches the hook installed before the
	// call.
	LastSeq() uint64
	// ReadEvents returns the first q.Limit retained events with seq >=
	// q.From that match the filter, in ascending seq order: fewer only when
	// no more match at the time of the read. Limit <= 0 takes the backend's
	// default (at most 1000); every Limit up to 10000 is honored (the log's
	// replay pages rely on it, maxReplayPage). Body is the encoded
	// gatewayv1.Event with its seq set.
	ReadEvents(ctx context.Context, q store.EventQuery) ([]store.EventRecord, error)
	// EventStats describes the retained log: OldestSeq (0 when none is
	// retained), LatestSeq (= LastSeq), Count and Bytes of the retained
	// events. Cheap (no scan): it is read on every retention pass.
	EventStats(ctx context.Context) (store.EventStats, error)
	// SnapshotDocuments returns every document of tenant (without
	// entities, with digests and claims) and the seq they reflect, read
	// consistently: the documents are exactly the state after the events
	// up to seq and before any later one.
	SnapshotDocuments(ctx context.Context, tenant string) (seq uint64, docs []*store.DocumentRecord, err error)
	// SnapshotPages is SnapshotDocuments in pages of at most page
	// documents, all read in one read transaction (every page reflects
	// exactly the events up to seq): memory is one page, not the store.
	// fn is called at least once; its error ends the read.
	SnapshotPages(ctx context.Context, tenant string, page int, fn func(seq uint64, docs []*store.DocumentRecord) error) error
	// SnapshotBytes is the encoded size of all documents of every tenant
	// (the size of a full snapshot, the retention byte cap). May scan.
	SnapshotBytes(ctx context.Context) (int64, error)
	// WriterStats counts commits; the log caches SnapshotBytes while
	// Transactions is unchanged, so it must increase with every commit
	// that changed a document. The other counters may stay 0.
	WriterStats() store.WriterStats
}
