package bridge

import (
	"context"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Store is what the bridge needs of the durable store: the event log's
// part (commits, events; eventlog.Store, whose contract applies), reads by
// tenant, the claim and recovery scans, and the streamed payloads. The
// SQLite backend (*sqlite.Store, the default, opened in Options.DataDir)
// implements it; Options.Store plugs in another, which runs the
// backend-neutral suite in bridge/store/storetest.
//
// The Store holds durable state only. Scratch bytes of a running attempt
// (the chunk results of a plain peer, plain.go) stay in files under
// Options.DataDir: they are never needed after the attempt, and an attempt
// that is cut short (a restart, another process taking the document over)
// is dispatched again and receives them anew.
//
// Tenancy: every read by id takes a tenant and answers an error wrapping
// store.ErrNotFound for a row of another tenant, exactly as for a missing
// row. Records returned are the caller's. Errors wrap the store package's
// errors (ErrNotFound, ErrBadPageToken, ErrInvalid, ErrClosed) where one
// applies.
type Store interface {
	eventlog.Store

	// GetDocument returns tenant's document id with Digests and
	// ClaimChecks filled (entities, digests of the highest dispatch attempt
	// only), and Entities too when withEntities, else ErrNotFound.
	GetDocument(ctx context.Context, tenant, id string, withEntities bool) (*store.DocumentRecord, error)
	// ListDocuments returns one page of tenant's documents, filtered by
	// q.State unless it is STATE_UNSPECIFIED, ordered by create time
	// descending, then id descending. next is "" on the last page, else
	// the token of the next page: keyset pagination, so documents created
	// while paging never make a page repeat or skip an older one. A token
	// that does not decode, or that was issued for another state filter,
	// answers ErrBadPageToken. PageSize <= 0 takes the default (50); it is
	// capped at 1000. Entities, digests and claims are not filled.
	ListDocuments(ctx context.Context, tenant string, q store.ListQuery) (docs []*store.DocumentRecord, next string, err error)
	// ListEntities returns the entities of tenant's document docID (of its
	// highest dispatch attempt) ordered by (scope id, scope instance,
	// entity id); ErrNotFound if the document is not tenant's.
	ListEntities(ctx context.Context, tenant, docID string) ([]*gatewayv1.Entity, error)
	// ListNonTerminal returns every non-terminal document of every tenant,
	// oldest first, without entities (restart recovery).
	ListNonTerminal(ctx context.Context) ([]*store.DocumentRecord, error)
	// GetClaim returns tenant's claim claimID with its Chunk (ErrNotFound
	// otherwise). Claim.Name is empty.
	GetClaim(ctx context.Context, tenant, claimID string) (*store.ClaimRecord, error)
	// ListClaims returns every claim of tenant's document docID ordered by
	// Claim.CreateTime, then claim id; none if the document is unknown.
	ListClaims(ctx context.Context, tenant, docID string) ([]*store.ClaimRecord, error)
	// ListIssuedClaims returns the ISSUED claims of every tenant whose
	// expire time is before expiringBefore, ordered by expire time (the
	// expiry sweeper).
	ListIssuedClaims(ctx context.Context, expiringBefore time.Time) ([]*store.ClaimRecord, error)
	// GetPayload returns the inline payload kind of tenant's document
	// docID as committed by a Batch's Payloads (ErrNotFound when the
	// document is not tenant's or has none). The slice is the caller's.
	GetPayload(ctx context.Context, tenant, docID string, kind store.PayloadKind) ([]byte, error)

	// CreatePayload starts a streamed payload (store.PayloadWriter) of
	// docID: its content (spooled before the document is committed) or its
	// result. docID is 1..128 octets of [A-Za-z0-9_-] and kind
	// PayloadContent or PayloadResult, else ErrInvalid.
	CreatePayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadWriter, error)
	// OpenPayload opens docID's synced streamed payload of kind
	// (store.PayloadReader; the caller closes it); ErrNotFound when there
	// is none.
	OpenPayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadReader, error)
	// RemovePayload deletes docID's streamed payload of kind; a missing
	// one is not an error.
	RemovePayload(ctx context.Context, docID string, kind store.PayloadKind) error

	// Close stops intake (later calls get ErrClosed), commits every batch
	// already accepted, and releases everything. Idempotent.
	Close() error
}

var _ Store = (*sqlite.Store)(nil)
