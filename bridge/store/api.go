// Package store is the backend-neutral vocabulary of the gateway's durable
// state: the record types, errors and payload interfaces every backend
// shares, and the interfaces a backend implements (Store, EventStore; their
// doc comments are the contract). It imports no backend and no database
// driver.
//
// # Backends
//
// Each backend lives in a package of its own beside this one:
// bridge/store/sqlite (the default, embedded: one SQLite file under the data
// directory) and bridge/store/pgstore (PostgreSQL, shared by replicas).
// Both run the conformance suite in bridge/store/storetest, whose interface
// is this package's (storetest checks that it equals the bridge's). The
// bridge and the event log depend on this package only; the caller that
// picks a backend imports it.
package store

import (
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Errors. Wrapped with context via fmt.Errorf("...: %w", ErrX); test with
// errors.Is. The bridge maps them to its own errors (bridge.ErrNotFound...).
var (
	// ErrNotFound: no such row for this tenant (another tenant's row is
	// reported the same way).
	ErrNotFound = errors.New("store: not found")
	// ErrConflict: an idempotent create reused (tenant, request id) with a
	// different body hash, or a create reused an existing document id, or a
	// claim id exists under another tenant.
	ErrConflict = errors.New("store: conflict")
	// ErrStaleRev: a DocumentUpdate's PrevRev does not match the stored rev.
	ErrStaleRev = errors.New("store: stale document revision")
	// ErrClaimRedeemed: the claim is not ISSUED any more (already redeemed,
	// or marked EXPIRED).
	ErrClaimRedeemed = errors.New("store: claim already redeemed")
	// ErrClaimCancelled: the claim is CANCELLED (its document ended while
	// the claim was ISSUED).
	ErrClaimCancelled = errors.New("store: claim cancelled")
	// ErrClaimExpired: the claim is ISSUED but its expire time has passed.
	ErrClaimExpired = errors.New("store: claim expired")
	// ErrBadPageToken: the page token was not produced by ListDocuments for
	// the same filter (an InvalidArgument).
	ErrBadPageToken = errors.New("store: invalid page token")
	// ErrInvalid: a malformed argument (missing id, event without time...).
	ErrInvalid = errors.New("store: invalid argument")
	// ErrSeqExhausted: assigning another seq would reach 2^53.
	ErrSeqExhausted = errors.New("store: event sequence space exhausted")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("store: closed")
	// ErrLeaseLost: a write for a document whose lease this replica no
	// longer holds (another replica took it over, or the lease could not be
	// renewed in time). The writer must stop driving the document and never
	// retry the write (docs/scale-out.md, Leases and fencing). Returned
	// wrapped in a *LeaseLostError naming the documents.
	ErrLeaseLost = errors.New("store: document lease lost")
)

// LeaseLostError is the error of a Commit refused by the lease check: the
// batch applied nothing, and DocIDs are the documents whose lease is lost.
// errors.Is(err, ErrLeaseLost) holds.
type LeaseLostError struct {
	DocIDs []string
	Reason string
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("store: document lease lost (%s): %v", e.Reason, e.DocIDs)
}

// Unwrap makes errors.Is(err, ErrLeaseLost) hold.
func (e *LeaseLostError) Unwrap() error { return ErrLeaseLost }

// MaxSeq is the exclusive upper bound of event seq numbers (2^53, so seqs are
// exact in JSON numbers).
const MaxSeq uint64 = 1 << 53

// DocumentRecord is one document row.
type DocumentRecord struct {
	Tenant string
	// Doc is the public representation. Id, State, Rev, RequestId,
	// CreateTime and UpdateTime are also stored as queryable columns (taken
	// from Doc on write). Entities, Digests and ClaimChecks are NOT stored in
	// the document row (they have their own tables); GetDocument fills them.
	// Create/update must set Id, State and CreateTime.
	Doc *gatewayv1.Document
	// BodyHash is the idempotency hash of the submission (e.g. SHA-256 over
	// the canonical request); compared when RequestId repeats. The bridge
	// leaves it nil for a submission without a request id: nothing is ever
	// compared with it.
	BodyHash []byte
	// ContentPayload: the submitted content is the streamed payload
	// (Store.CreatePayload, PayloadContent), not an inline row.
	// ResultPayload: the result is the streamed payload PayloadResult. A
	// backend stores the flags, not where the bytes are.
	ContentPayload, ResultPayload bool
	// ResultContentType is the content type of the result.
	ResultContentType string
	// DispatchAttempts counts how often the document was dispatched to a peer.
	DispatchAttempts uint32
	// Private is opaque bridge state, stored verbatim (e.g. a dispatch plan).
	Private []byte
}

// Terminal reports whether the document's state is final (SUCCEEDED,
// PARTIALLY_SUCCEEDED, FAILED, CANCELLED).
func (r *DocumentRecord) Terminal() bool { return IsTerminal(r.Doc.GetState()) }

// IsTerminal reports whether s is a final document state.
func IsTerminal(s gatewayv1.State) bool {
	switch s {
	case gatewayv1.State_SUCCEEDED, gatewayv1.State_PARTIALLY_SUCCEEDED,
		gatewayv1.State_FAILED, gatewayv1.State_CANCELLED:
		return true
	}
	return false
}

// DocumentUpdate replaces a document row if its stored rev equals PrevRev
// (and the tenant matches); else the batch fails with ErrStaleRev
// (ErrNotFound if the row does not exist for this tenant).
type DocumentUpdate struct {
	Record  *DocumentRecord
	PrevRev uint64
}

// EntityRecord upserts one entity keyed by (DocID, Attempt, Entity.ScopeId,
// ScopeInstance, Entity.EntityId). The document must exist (foreign key).
type EntityRecord struct {
	DocID  string
	Entity *gatewayv1.Entity
	// Attempt is the dispatch attempt the entity belongs to. Reads
	// (GetDocument with entities, ListEntities) return only the rows of the
	// document's highest attempt: older attempts are superseded.
	Attempt uint32
	// ScopeInstance tells apart uses of one peer scope ID within an
	// attempt (a peer may reuse a scope ID after its SCOPE_DIGEST); 0 for
	// the root scope and a scope's first use.
	ScopeInstance uint32
}

// DigestRecord upserts one scope digest keyed by (DocID, Attempt,
// Digest.ScopeId, ScopeInstance); reads return the highest attempt's, like
// entities.
type DigestRecord struct {
	DocID         string
	Digest        *gatewayv1.ScopeDigest
	Attempt       uint32
	ScopeInstance uint32
}

// ClaimRecord is one claim check. Claim.ClaimId (a decimal uint64) is the key;
// Claim.Name is not stored (GetClaim leaves it empty; the bridge names it).
// In a Batch it is an upsert; a claim id owned by another tenant fails the
// batch with ErrConflict. An upsert to CANCELLED changes the state only of
// a stored claim that is still ISSUED: a redemption (or an expiry) that
// committed first wins, and the stored state and redeem time stay.
type ClaimRecord struct {
	Tenant string
	Claim  *gatewayv1.ClaimCheck
	// Chunk is what the deferred entity carried, so that the claim stays
	// redeemable through a later dispatch attempt of the document
	// (docs/profile.md 6). An upsert with Chunk unset keeps the stored
	// value; reads set it when it is stored (schema 4 and later).
	Chunk ClaimChunk
}

// ClaimChunk names the part of a document a deferred entity carried:
// Index -1 for the whole document (the root), n >= 0 for chunk n. Set is
// false when it is not known (an entity the peer created in its own scope,
// or a claim stored before schema 4).
type ClaimChunk struct {
	Set   bool
	Index int64
}

// RedeemClaim is a conditional op: the claim must exist for Tenant, be
// ISSUED, and expire after Now; it becomes REDEEMED with redeem_time = Now.
// Otherwise the whole batch fails with ErrNotFound, ErrClaimRedeemed,
// ErrClaimCancelled or ErrClaimExpired. The claim after redemption is in CommitResult.Claim.
type RedeemClaim struct {
	Tenant  string
	ClaimID string
	Now     time.Time
}

// EventAppend appends one event. Event.Seq is ignored (assigned by the
// writer); Event.Time and Event.Kind are required. Tenant scopes the event
// for filtered reads. The caller must not modify Event until Commit returns.
type EventAppend struct {
	Tenant string
	Event  *gatewayv1.Event
}

// PayloadKind names a payload of a document: its submitted content or its
// rehydrated result. A document has at most one payload of each kind in each
// of two separate places: an inline row committed in a Batch
// (PayloadRecord, read with GetPayload; small payloads), or a streamed
// payload (CreatePayload, OpenPayload; any size).
type PayloadKind int32

const (
	// PayloadContent is the submitted content of a document.
	PayloadContent PayloadKind = 1
	// PayloadResult is the rehydrated output of a document.
	PayloadResult PayloadKind = 2
)

// String names the kind for messages.
func (k PayloadKind) String() string {
	switch k {
	case PayloadContent:
		return "content"
	case PayloadResult:
		return "result"
	}
	return fmt.Sprintf("payload kind %d", int32(k))
}

// PayloadWriter is a streamed payload being stored (CreatePayload): bytes
// go to the backend as they are written and are never held whole in
// memory. Nothing is visible to OpenPayload until Sync. Not safe for
// concurrent use.
type PayloadWriter interface {
	// Write appends p. A full disk answers an error that wraps
	// syscall.ENOSPC, so that the caller can wait and retry.
	io.Writer
	// Sync makes the bytes durable and visible to OpenPayload under the
	// document's id and kind, atomically replacing an earlier payload of
	// that kind: after Sync returns nil the whole payload survives a crash,
	// and a reader never sees a part of it. Call Sync before the Commit
	// that records the document (ContentPayload, ResultPayload) and before
	// acknowledging anything. Write and Sync fail after Sync or Abort.
	Sync() error
	// Abort discards the unsynced bytes. A no-op after Sync or Abort.
	Abort() error
}

// PayloadReader reads a synced streamed payload (OpenPayload). Seek and
// ReadAt let a result be served with ranges (http.ServeContent) and chunks
// be read at their offsets. The caller closes it. It reads the payload as
// synced when it was opened, even if a later Sync replaces it.
type PayloadReader interface {
	io.Reader
	io.ReaderAt
	io.Seeker
	io.Closer
	// Size is the payload's length in octets.
	Size() int64
}

// PayloadRecord stores (or, with Body nil, deletes) one inline payload of
// a document in the batch's transaction: small payloads become durable with
// the document change they belong to, without a file, an fsync of their own
// or a directory fsync. The document must exist (foreign key); the row goes
// away with it. Size is the caller's policy: every byte of Body is written
// to the WAL of the group commit, so keep it to tens of KiB.
type PayloadRecord struct {
	DocID string
	Kind  PayloadKind
	Body  []byte
}

// Batch is one atomic unit of work: all of it commits or none of it.
// Ops apply in field order: Create, Redeem, Updates, Entities, Digests,
// Claims, Payloads, Events.
type Batch struct {
	// Create inserts a new document. If Create.Doc.RequestId is non-empty
	// and (tenant, request id) already exists: same BodyHash -> the batch is
	// NOT applied and CommitResult.Duplicate names the existing document;
	// different BodyHash -> ErrConflict. An existing Doc.Id -> ErrConflict.
	Create   *DocumentRecord
	Redeem   *RedeemClaim
	Updates  []DocumentUpdate
	Entities []EntityRecord
	Digests  []DigestRecord
	Claims   []ClaimRecord
	Payloads []PayloadRecord
	Events   []EventAppend
}

// CommitResult reports what a committed batch produced.
type CommitResult struct {
	// Seqs[i] is the seq assigned to Batch.Events[i] (ascending, consecutive).
	Seqs []uint64
	// Duplicate is the existing document when Batch.Create was an idempotent
	// repeat; nothing of the batch was applied then.
	Duplicate *DocumentRecord
	// Claim is the claim after Batch.Redeem.
	Claim *gatewayv1.ClaimCheck
}

// EventRecord is one stored event.
type EventRecord struct {
	Seq    uint64
	Time   time.Time
	Kind   string
	Tenant string
	DocID  string
	Rev    uint64
	Since  uint64
	// Body is the protobuf-encoded gatewayv1.Event, seq included. Owned by
	// the caller.
	Body []byte
}

// Size is the stored size of the event in bytes (len(Body)), the unit of
// the retention byte budget.
func (r *EventRecord) Size() int { return len(r.Body) }

// Decode unmarshals Body into a new Event (Seq set).
func (r *EventRecord) Decode() (*gatewayv1.Event, error) {
	ev := new(gatewayv1.Event)
	if err := proto.Unmarshal(r.Body, ev); err != nil {
		return nil, fmt.Errorf("store: decode event %d: %w", r.Seq, err)
	}
	return ev, nil
}

// EventQuery selects events for ReadEvents.
type EventQuery struct {
	// From is the first seq to return (inclusive; 0 = oldest).
	From uint64
	// Limit bounds the result (0 = params default, capped at the maximum).
	Limit int
	// Tenant filters events unless AllTenants is set.
	Tenant     string
	AllTenants bool
	// DocID filters one document ("" = all).
	DocID string
	// Kinds filters by kind (empty = all).
	Kinds []string
}

// EventStats describe the retained log. LatestSeq is last_seq (the highest
// seq ever assigned, even if pruned); OldestSeq is the lowest retained seq (0
// when none is retained).
type EventStats struct {
	OldestSeq, LatestSeq uint64
	Count                uint64
	Bytes                uint64
}

// PruneResult reports a PruneEvents call.
type PruneResult struct {
	Removed uint64
	Bytes   uint64
}

// ListQuery selects documents for ListDocuments.
type ListQuery struct {
	// State filters (STATE_UNSPECIFIED = all).
	State gatewayv1.State
	// PageSize (<= 0: default; capped at the maximum, see params.go).
	PageSize int
	// PageToken from the previous page ("" = first page).
	PageToken string
}

// WriterStats counts group commit activity since Open.
type WriterStats struct {
	Transactions uint64 // committed transactions
	Batches      uint64 // batches applied (committed or rolled back alone)
	// Retries counts group transactions rerun with a savepoint per batch
	// because one of their batches failed (package doc, Writes).
	Retries uint64
	// Statements counts SQL statements the writer ran (including BEGIN,
	// COMMIT and savepoints), for measuring the writer's cost per batch.
	Statements uint64
}

// EventRange summarizes the retained events of one seq range
// (EachEventRange).
type EventRange struct {
	First, Last    uint64
	Count          uint64
	Oldest, Newest time.Time
	Bytes          uint64
}
