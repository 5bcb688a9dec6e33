package store

import (
	"context"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// EventStore is what the event log (bridge/eventlog) needs of the durable
// store: it commits batches, learns of committed events in seq order,
// replays and prunes them. Both backends (bridge/store/sqlite,
// bridge/store/pgstore) implement it; bridge/store/storetest checks it.
// Safe for concurrent use. After the backend's Close, Commit and
// PruneEvents answer an error wrapping ErrClosed (reads fail too, with an
// error of the backend's).
//
// Event seq rules (docs/architecture.md, the event log): every event of a
// committed Batch gets a seq in the commit's transaction; seqs start at 1,
// are strictly increasing in commit order, are below MaxSeq
// (ErrSeqExhausted beyond it), and are never reused: not after
// PruneEvents removed every event, not after a crash (kill -9) and reopen.
// The seqs of one batch are consecutive, and seqs are dense: every seq up
// to LastSeq belongs to a committed event (a failed commit takes none), so
// a seq the hook never delivers is a gap (bridge/eventlog/gap.go).
type EventStore interface {
	// Commit applies b atomically (Batch documents its ops, their
	// order and their preconditions) and returns once it is durable: a
	// batch whose Commit returned nil survives a crash. On error nothing of
	// b was applied; the error wraps ErrConflict, ErrStaleRev,
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
	Commit(ctx context.Context, b *Batch) (CommitResult, error)
	// PruneEvents deletes every event with seq < beforeSeq and reports how
	// many events and bytes (EventRecord.Size) it removed. LastSeq
	// and the seq counter are unchanged.
	PruneEvents(ctx context.Context, beforeSeq uint64) (PruneResult, error)
	// SetEventHook installs fn (nil removes it). For every commit that
	// assigned seqs, fn is called once with its events in ascending seq
	// order, after the commit is durable and before any of its Commit
	// callers return. Calls are never concurrent and their seqs ascend
	// across calls: no committed event is repeated, and none is skipped
	// except events another process sharing the store pruned before this
	// one could read them (the next call then starts above the gap, which
	// the log announces to its subscribers, bridge/eventlog/gap.go). fn owns the slice; it
	// must not block and must not call Commit.
	SetEventHook(fn func([]EventRecord))
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
	ReadEvents(ctx context.Context, q EventQuery) ([]EventRecord, error)
	// EventStats describes the retained log: OldestSeq (0 when none is
	// retained), LatestSeq (= LastSeq), Count and Bytes of the retained
	// events. Cheap (no scan): it is read on every retention pass.
	EventStats(ctx context.Context) (EventStats, error)
	// SnapshotDocuments returns every document of tenant (without
	// entities, with digests and claims) and the seq they reflect, read
	// consistently: the documents are exactly the state after the events
	// up to seq and before any later one.
	SnapshotDocuments(ctx context.Context, tenant string) (seq uint64, docs []*DocumentRecord, err error)
	// SnapshotPages is SnapshotDocuments in pages of at most page
	// documents, all read in one read transaction (every page reflects
	// exactly the events up to seq): memory is one page, not the store.
	// fn is called at least once; its error ends the read.
	SnapshotPages(ctx context.Context, tenant string, page int, fn func(seq uint64, docs []*DocumentRecord) error) error
	// SnapshotBytes is the encoded size of all documents and digests of
	// every tenant (the size of a full snapshot, the retention byte cap),
	// exact as of the last commit. Cheap (no scan): a total the backend
	// keeps in the transactions that change those rows; the event log reads
	// it on every retention pass and every Window.
	SnapshotBytes(ctx context.Context) (int64, error)
	// WriterStats counts commits (Transactions increases with every
	// commit); the other counters may stay 0.
	WriterStats() WriterStats
}

// Store is what the bridge needs of the durable store: the event log's
// part (EventStore, whose contract applies), reads by tenant, the claim and
// recovery scans, and the streamed payloads. Both backends implement it:
// bridge/store/sqlite (the default, opened in the bridge's data directory)
// and bridge/store/pgstore. storetest.Store is this interface plus the
// event log's optional readers (EventMetaReader, EventRangeReader), and a
// test of storetest fails when the two differ, so the suite's interface
// is the bridge's.
//
// Tenancy: every read by id takes a tenant and answers an error wrapping
// ErrNotFound for a row of another tenant, exactly as for a missing
// row. Records returned are the caller's. Errors wrap the store package's
// errors (ErrNotFound, ErrBadPageToken, ErrInvalid, ErrClosed) where one
// applies.
type Store interface {
	EventStore

	// GetDocument returns tenant's document id with Digests and
	// ClaimChecks filled (entities, digests of the highest dispatch attempt
	// only), and Entities too when withEntities, else ErrNotFound.
	GetDocument(ctx context.Context, tenant, id string, withEntities bool) (*DocumentRecord, error)
	// ListDocuments returns one page of tenant's documents, filtered by
	// q.State unless it is STATE_UNSPECIFIED, ordered by create time
	// descending, then id descending. next is "" on the last page, else
	// the token of the next page: keyset pagination, so documents created
	// while paging never make a page repeat or skip an older one. A token
	// that does not decode, or that was issued for another state filter,
	// answers ErrBadPageToken. PageSize <= 0 takes the default (50); it is
	// capped at 1000. Entities, digests and claims are not filled.
	ListDocuments(ctx context.Context, tenant string, q ListQuery) (docs []*DocumentRecord, next string, err error)
	// ListEntities returns the entities of tenant's document docID (of its
	// highest dispatch attempt) ordered by (scope id, scope instance,
	// entity id); ErrNotFound if the document is not tenant's.
	ListEntities(ctx context.Context, tenant, docID string) ([]*gatewayv1.Entity, error)
	// ListNonTerminal returns every non-terminal document of every tenant,
	// oldest first, without entities (restart recovery).
	ListNonTerminal(ctx context.Context) ([]*DocumentRecord, error)
	// GetClaim returns tenant's claim claimID with its Chunk (ErrNotFound
	// otherwise). Claim.Name is empty.
	GetClaim(ctx context.Context, tenant, claimID string) (*ClaimRecord, error)
	// ListClaims returns every claim of tenant's document docID ordered by
	// Claim.CreateTime, then claim id; none if the document is unknown.
	ListClaims(ctx context.Context, tenant, docID string) ([]*ClaimRecord, error)
	// ListIssuedClaims returns the ISSUED claims of every tenant whose
	// expire time is before expiringBefore, ordered by expire time (the
	// expiry sweeper).
	ListIssuedClaims(ctx context.Context, expiringBefore time.Time) ([]*ClaimRecord, error)
	// GetPayload returns the inline payload kind of tenant's document
	// docID as committed by a Batch's Payloads (ErrNotFound when the
	// document is not tenant's or has none). The slice is the caller's.
	GetPayload(ctx context.Context, tenant, docID string, kind PayloadKind) ([]byte, error)

	// CreatePayload starts a streamed payload (PayloadWriter) of
	// docID: its content (spooled before the document is committed) or its
	// result. docID is 1..128 octets of [A-Za-z0-9_-] and kind
	// PayloadContent or PayloadResult, else ErrInvalid.
	CreatePayload(ctx context.Context, docID string, kind PayloadKind) (PayloadWriter, error)
	// OpenPayload opens docID's synced streamed payload of kind
	// (PayloadReader; the caller closes it); ErrNotFound when there
	// is none.
	OpenPayload(ctx context.Context, docID string, kind PayloadKind) (PayloadReader, error)
	// RemovePayload deletes docID's streamed payload of kind; a missing
	// one is not an error.
	RemovePayload(ctx context.Context, docID string, kind PayloadKind) error

	// Close stops intake (later calls get ErrClosed), commits every batch
	// already accepted, and releases everything. Idempotent.
	Close() error
}

// EventMetaReader is implemented by stores that can list the retained
// events' metadata without their bodies (both backends): the event log's
// start then reads seq, time and size only. Optional for a backend (the
// log checks for it); storetest requires it.
type EventMetaReader interface {
	EachEventMeta(ctx context.Context, fn func(seq uint64, t time.Time, size int) error) error
}

// EventRangeReader is implemented by stores that summarize the retained
// events by seq range (both backends): a large log then loads in at most
// eventlog.Options.IndexBuckets/2 summaries, aggregated by the database.
// Optional like EventMetaReader; storetest requires it.
type EventRangeReader interface {
	EachEventRange(ctx context.Context, from, to, width uint64, fn func(r EventRange) error) error
}
