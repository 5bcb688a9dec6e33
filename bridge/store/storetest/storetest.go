// Package storetest is the backend-neutral conformance suite of the durable
// store: every backend (bridge/store/sqlite, bridge/store/pgstore) runs Run from
// its own test, so that the bridge and the event log can rely on the
// contract of store.Store and store.EventStore (bridge.Store and
// eventlog.Store are those) whatever the backend.
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
	"testing"

	"github.com/pipestream/gateway/bridge/store"
)

// Store is the interface the suite checks: the bridge's (store.Store,
// which includes the event log's store.EventStore; their doc comments are
// the contract) and the event log's optional readers. It restates nothing:
// a method added to store.Store is a method of Store, and
// TestInterfaceIsTheBridges fails when Store and the bridge's interfaces
// differ or a method of Store is never called by the suite.
type Store interface {
	store.Store
	store.EventMetaReader
	store.EventRangeReader
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
		{"ClaimsCancelled", testClaimsCancelled},
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
