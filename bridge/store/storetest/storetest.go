// Package storetest is the backend-neutral conformance suite of the durable
// store: every backend (SQLite in bridge/store, PostgreSQL...) runs Run from
// its own test, so that the bridge and the event log can rely on the
// contract of bridge.Store and eventlog.Store whatever the backend.
//
// The suite uses only the interface: documents (create, get, list and
// pagination, tenant isolation, revisions), entities by attempt, events and
// their seq rules (concurrent commits, the event hook, replay from a
// cursor, LastSeq), claims redeemed exactly once, request-id idempotency,
// retention (PruneEvents, EventStats), inline and streamed payloads
// (including a large payload written and read in pieces), snapshots, and
// crash recovery (a store abandoned without Close, the state reopened).
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Store is the union of bridge.Store and eventlog.Store (their doc comments
// are the contract; this package cannot import the bridge). An interface
// value of a backend that satisfies Store satisfies both.
type Store interface {
	Commit(ctx context.Context, b *store.Batch) (store.CommitResult, error)
	PruneEvents(ctx context.Context, beforeSeq uint64) (store.PruneResult, error)
	SetEventHook(fn func([]store.EventRecord))
	LastSeq() uint64
	ReadEvents(ctx context.Context, q store.EventQuery) ([]store.EventRecord, error)
	EventStats(ctx context.Context) (store.EventStats, error)
	SnapshotDocuments(ctx context.Context, tenant string) (seq uint64, docs []*store.DocumentRecord, err error)
	SnapshotPages(ctx context.Context, tenant string, page int, fn func(seq uint64, docs []*store.DocumentRecord) error) error
	EachEventMeta(ctx context.Context, fn func(seq uint64, t time.Time, size int) error) error
	EachEventRange(ctx context.Context, from, to, width uint64, fn func(r store.EventRange) error) error
	SnapshotBytes(ctx context.Context) (int64, error)
	WriterStats() store.WriterStats

	GetDocument(ctx context.Context, tenant, id string, withEntities bool) (*store.DocumentRecord, error)
	ListDocuments(ctx context.Context, tenant string, q store.ListQuery) (docs []*store.DocumentRecord, next string, err error)
	ListEntities(ctx context.Context, tenant, docID string) ([]*gatewayv1.Entity, error)
	ListNonTerminal(ctx context.Context) ([]*store.DocumentRecord, error)
	GetClaim(ctx context.Context, tenant, claimID string) (*store.ClaimRecord, error)
	ListClaims(ctx context.Context, tenant, docID string) ([]*store.ClaimRecord, error)
	ListIssuedClaims(ctx context.Context, expiringBefore time.Time) ([]*store.ClaimRecord, error)
	GetPayload(ctx context.Context, tenant, docID string, kind store.PayloadKind) ([]byte, error)
	CreatePayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadWriter, error)
	OpenPayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadReader, error)
	RemovePayload(ctx context.Context, docID string, kind store.PayloadKind) error
	Close() error
}

// Backend tells the suite how to get stores.
type Backend struct {
	// NewState returns the name of fresh, empty durable state (SQLite: a
	// new temporary directory; PostgreSQL: a new database or schema),
	// removed when the test ends.
	NewState func(t *testing.T) string
	// Open opens a store on state. Opening state again, after Close or
	// while an earlier store on it is abandoned (the crash tests), sees
	// everything committed there. The suite closes what it opens.
	Open func(t *testing.T, state string) Store
}

// Run runs every conformance test against b, each on fresh state.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b Backend)
	}{
		{"Documents", testDocuments},
		{"Revisions", testRevisions},
		{"ListPagination", testListPagination},
		{"TenantIsolation", testTenantIsolation},
		{"Entities", testEntities},
		{"NonTerminal", testNonTerminal},
		{"EventSeqs", testEventSeqs},
		{"ReadEvents", testReadEvents},
		{"Retention", testRetention},
		{"ClaimsRedeemedOnce", testClaimsRedeemedOnce},
		{"ClaimErrors", testClaimErrors},
		{"Idempotency", testIdempotency},
		{"InlinePayloads", testInlinePayloads},
		{"StreamedPayloads", testStreamedPayloads},
		{"LargePayload", testLargePayload},
		{"Snapshot", testSnapshot},
		{"SnapshotPages", testSnapshotPages},
		{"EventMeta", testEventMeta},
		{"CloseRefuses", testCloseRefuses},
		{"CrashRecovery", testCrashRecovery},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

// open opens a store on fresh state and closes it when the test ends.
func open(t *testing.T, b Backend) (Store, string) {
	t.Helper()
	state := b.NewState(t)
	s := b.Open(t, state)
	t.Cleanup(func() { s.Close() })
	return s, state
}
