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
	for i, m := range migrations[:n] {
		if _, err := db.ExecContext(ctx, m); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	_, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", n))
	return err
}
