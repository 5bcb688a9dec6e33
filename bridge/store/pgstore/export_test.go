package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
)

// PauseTail stops this replica's event deliveries (its listener and its
// own commits' publication wait), as a process paused by SIGSTOP would;
// the returned func resumes them.
func (s *Store) PauseTail() (resume func()) {
	s.tail.mu.Lock()
	return s.tail.mu.Unlock
}

// TailGaps is how many catch-ups found seqs pruned before they were read.
func (s *Store) TailGaps() uint64 { return s.tail.gaps.Load() }

// HoldCounter begins a transaction on one of the store's own pool sessions
// and takes the event counter's row lock, as an event-writing commit does
// before its COMMIT, then leaves the transaction idle (a replica paused
// mid-commit). The caller ends it with the returned tx.
func (s *Store) HoldCounter(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "UPDATE meta SET last_seq = last_seq WHERE id = 1"); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// MigrateTo brings a new database to schema version n (< SchemaVersion),
// as a binary of that version would have, so a test can write rows in an
// earlier schema and open the store on them.
func MigrateTo(ctx context.Context, conn *pgx.Conn, n int) error {
	if _, err := conn.Exec(ctx, "CREATE TABLE schema_version (version INT NOT NULL)"); err != nil {
		return err
	}
	for _, m := range migrations[:n] {
		if _, err := conn.Exec(ctx, m); err != nil {
			return err
		}
	}
	_, err := conn.Exec(ctx, "INSERT INTO schema_version VALUES ($1)", n)
	return err
}

// TailReads is how many catch-up queries the listener and the commits
// ran (each reads events back from the database).
func (s *Store) TailReads() uint64 { return s.tail.reads.Load() }

// HoldOwnCommit marks an own commit in flight, as one between sending its
// transaction and delivering its events; release ends it (ownEnd).
func (s *Store) HoldOwnCommit() (release func()) {
	s.tail.ownBegin()
	return s.tail.ownEnd
}

// OnDeferredNotification sets a func called with the seq of every
// notification the listener leaves to an own commit in flight.
func (s *Store) OnDeferredNotification(f func(seq uint64)) { s.tail.onDeferred.Store(&f) }

// BlocksQuery is the event read's query for eq from seq from, n blocks,
// and its arguments.
func BlocksQuery(eq store.EventQuery, from int64, n int) (string, []any) {
	return blocksQuery(eq, from, n)
}

// EventRangesSQL is EachEventRange's query ($1 from, $2 to, $3 width).
const EventRangesSQL = eventRangesSQL

// PruneDeleteSQL and PruneCountSQL are PruneEvents' DELETE ($1 the new
// floor) and count ($1 the old floor, $2 the new one).
const (
	PruneDeleteSQL = pruneDeleteSQL
	PruneCountSQL  = pruneCountSQL
)

// The statements on blobs of OpenPayload ($1 doc, $2 kind, $3 state),
// RemovePayload ($1 doc, $2 kind), Sync's supersede ($1 new state, $2
// touched, $3 doc, $4 kind, $5 old state) and the stale cleanup ($1 the
// oldest touched time kept).
const (
	OpenPayloadSQL   = openPayloadSQL
	RemovePayloadSQL = removePayloadSQL
	SupersedeSQL     = supersedeSQL
	RemoveStaleSQL   = removeStaleSQL
)

// RedeemedOfHeldSQL lists the claims in state $2 of the documents replica
// $1 drives.
const RedeemedOfHeldSQL = redeemedOfHeldSQL

// BlobSyncedSQL and BlobSynced are the synced state as written into SQL
// text and as the constant.
const (
	BlobSyncedSQL = blobSyncedSQL
	BlobSynced    = blobSynced
)
