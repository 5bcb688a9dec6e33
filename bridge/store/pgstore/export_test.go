package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
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
