package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// MigrateTo brings a new database to schema version n (< SchemaVersion),
// as a binary of that version would have, so a test can write rows in an
// earlier schema and open the store on them.
func MigrateTo(ctx context.Context, db *sql.DB, n int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	for i := 1; i <= n; i++ {
		if err := runMigration(ctx, tx, i); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", n)); err != nil {
		return err
	}
	return tx.Commit()
}
