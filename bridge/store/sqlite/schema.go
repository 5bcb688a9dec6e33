package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"
)

// migrations are applied in order; migration i brings the schema to
// user_version i+1. Append only: never edit an applied migration.
var migrations = []string{
	// 1: initial schema.
	`
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta(key, value) VALUES ('last_seq', 0), ('event_count', 0), ('event_bytes', 0);

CREATE TABLE documents (
	id                  TEXT PRIMARY KEY,
	tenant              TEXT NOT NULL,
	state               INTEGER NOT NULL,
	terminal            INTEGER NOT NULL,
	rev                 INTEGER NOT NULL,
	request_id          TEXT,
	body_hash           BLOB,
	create_time         INTEGER NOT NULL,
	update_time         INTEGER NOT NULL,
	spool_path          TEXT NOT NULL DEFAULT '',
	result_path         TEXT NOT NULL DEFAULT '',
	result_content_type TEXT NOT NULL DEFAULT '',
	dispatch_attempts   INTEGER NOT NULL DEFAULT 0,
	private             BLOB,
	body                BLOB NOT NULL
);
CREATE UNIQUE INDEX documents_request ON documents(tenant, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX documents_list ON documents(tenant, create_time DESC, id DESC);
CREATE INDEX documents_state ON documents(tenant, state, create_time DESC, id DESC);
CREATE INDEX documents_open ON documents(create_time) WHERE terminal = 0;

CREATE TABLE entities (
	doc_id       TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	scope_id     INTEGER NOT NULL,
	entity_id    INTEGER NOT NULL,
	parent_id    INTEGER NOT NULL,
	depth        INTEGER NOT NULL,
	status       INTEGER NOT NULL,
	chunk_index  INTEGER NOT NULL,
	chunk_offset INTEGER NOT NULL,
	size         INTEGER NOT NULL,
	checksum     TEXT NOT NULL,
	attempts     INTEGER NOT NULL,
	message      TEXT NOT NULL,
	PRIMARY KEY (doc_id, scope_id, entity_id)
) WITHOUT ROWID;

CREATE TABLE digests (
	doc_id   TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	scope_id INTEGER NOT NULL,
	body     BLOB NOT NULL,
	PRIMARY KEY (doc_id, scope_id)
) WITHOUT ROWID;

CREATE TABLE claims (
	claim_id    TEXT PRIMARY KEY,
	tenant      TEXT NOT NULL,
	doc_id      TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	entity_id   INTEGER NOT NULL,
	scope_id    INTEGER NOT NULL,
	state       INTEGER NOT NULL,
	expire_time INTEGER NOT NULL,
	create_time INTEGER NOT NULL,
	redeem_time INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX claims_doc ON claims(doc_id);
CREATE INDEX claims_issued ON claims(expire_time) WHERE state = 1;

CREATE TABLE events (
	seq    INTEGER PRIMARY KEY,
	time   INTEGER NOT NULL,
	kind   TEXT NOT NULL,
	tenant TEXT NOT NULL,
	doc_id TEXT NOT NULL,
	rev    INTEGER NOT NULL,
	since  INTEGER NOT NULL,
	size   INTEGER NOT NULL,
	body   BLOB NOT NULL
);
CREATE INDEX events_tenant ON events(tenant, seq);
CREATE INDEX events_doc ON events(doc_id, seq);
`,
	// 2: entities and digests keyed by dispatch attempt and scope instance.
	// A re-dispatched document starts a new attempt whose entity IDs (a new
	// session counts from 1) and peer scope IDs collide with the previous
	// attempt's, and a peer may reuse a scope ID within one document after
	// its SCOPE_DIGEST (docs/profile.md 2). Reads return the newest attempt
	// only. Existing rows become attempt 0, instance 0.
	`
CREATE TABLE entities_v2 (
	doc_id         TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	attempt        INTEGER NOT NULL,
	scope_id       INTEGER NOT NULL,
	scope_instance INTEGER NOT NULL,
	entity_id      INTEGER NOT NULL,
	parent_id      INTEGER NOT NULL,
	depth          INTEGER NOT NULL,
	status         INTEGER NOT NULL,
	chunk_index    INTEGER NOT NULL,
	chunk_offset   INTEGER NOT NULL,
	size           INTEGER NOT NULL,
	checksum       TEXT NOT NULL,
	attempts       INTEGER NOT NULL,
	message        TEXT NOT NULL,
	PRIMARY KEY (doc_id, attempt, scope_id, scope_instance, entity_id)
) WITHOUT ROWID;
INSERT INTO entities_v2 SELECT doc_id, 0, scope_id, 0, entity_id, parent_id, depth, status, chunk_index,
	chunk_offset, size, checksum, attempts, message FROM entities;
DROP TABLE entities;
ALTER TABLE entities_v2 RENAME TO entities;

CREATE TABLE digests_v2 (
	doc_id         TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	attempt        INTEGER NOT NULL,
	scope_id       INTEGER NOT NULL,
	scope_instance INTEGER NOT NULL,
	body           BLOB NOT NULL,
	PRIMARY KEY (doc_id, attempt, scope_id, scope_instance)
) WITHOUT ROWID;
INSERT INTO digests_v2 SELECT doc_id, 0, scope_id, 0, body FROM digests;
DROP TABLE digests;
ALTER TABLE digests_v2 RENAME TO digests;
`,
	// 3: small payloads inline (kind 1: submitted content, 2: result),
	// committed in the same group-commit transaction as the document change
	// they belong to, instead of a spool/result file each with its own
	// fsync, rename and directory fsync (docs/performance.md). A table of
	// their own rather than a column of documents: SQLite rewrites the whole
	// row on UPDATE, and a document row is updated several times per
	// document (RUNNING, entity counts, terminal). A rowid table: its rows
	// are kilobytes, too large for WITHOUT ROWID's clustered index.
	`
CREATE TABLE payloads (
	doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	kind   INTEGER NOT NULL,
	body   BLOB NOT NULL,
	PRIMARY KEY (doc_id, kind)
);
`,
	// 4: what the deferred entity of a claim carried (ClaimRecord.Chunk:
	// -1 the whole document, n >= 0 chunk n; NULL unknown), so that a
	// claim issued to an earlier dispatch attempt can still be matched to
	// the entity that resumes it after restarts (docs/profile.md 6):
	// entity ids restart with every session, so the claim's entity id does
	// not identify the chunk in a later attempt.
	`
ALTER TABLE claims ADD COLUMN chunk INTEGER;
`,
	// 5: the snapshot size (SnapshotBytes: the encoded size of every
	// document and digest, the retention byte cap) kept as a running total
	// in meta, so that reading it is one lookup instead of a scan of the
	// documents table (seconds at a million documents). Triggers keep it:
	// they run inside the statement that changes a row, so the total
	// changes in the same transaction as the rows it sums, and it is exact
	// at every commit, after a crash (the WAL commits or drops both) and
	// for rows written by anything that writes the file, not only this
	// store's writer. Seeded from one scan here.
	`
INSERT INTO meta(key, value) VALUES ('snapshot_bytes',
	coalesce((SELECT sum(length(body)) FROM documents), 0) + coalesce((SELECT sum(length(body)) FROM digests), 0));
CREATE TRIGGER documents_snapshot_insert AFTER INSERT ON documents BEGIN
	UPDATE meta SET value = value + length(NEW.body) WHERE key = 'snapshot_bytes';
END;
CREATE TRIGGER documents_snapshot_update AFTER UPDATE OF body ON documents BEGIN
	UPDATE meta SET value = value + length(NEW.body) - length(OLD.body) WHERE key = 'snapshot_bytes';
END;
CREATE TRIGGER documents_snapshot_delete AFTER DELETE ON documents BEGIN
	UPDATE meta SET value = value - length(OLD.body) WHERE key = 'snapshot_bytes';
END;
CREATE TRIGGER digests_snapshot_insert AFTER INSERT ON digests BEGIN
	UPDATE meta SET value = value + length(NEW.body) WHERE key = 'snapshot_bytes';
END;
CREATE TRIGGER digests_snapshot_update AFTER UPDATE OF body ON digests BEGIN
	UPDATE meta SET value = value + length(NEW.body) - length(OLD.body) WHERE key = 'snapshot_bytes';
END;
CREATE TRIGGER digests_snapshot_delete AFTER DELETE ON digests BEGIN
	UPDATE meta SET value = value - length(OLD.body) WHERE key = 'snapshot_bytes';
END;
`,
	// 6: events stored as blocks, one event_blocks row per committing
	// transaction (blocks.go), instead of a row each: a group commit of
	// many small documents inserts one row for its events, and
	// event_keys one row per distinct tenant and document of the block
	// (where a row per event wrote two index entries each). The existing
	// events are moved into blocks by eventsToBlocks (Go: the block
	// encoding is not expressible in SQL), then the events table is
	// dropped.
	`
CREATE TABLE event_blocks (
	first_seq INTEGER PRIMARY KEY,
	last_seq  INTEGER NOT NULL,
	head      BLOB NOT NULL,
	bodies    BLOB NOT NULL
);
CREATE TABLE event_keys (
	kind      INTEGER NOT NULL,
	key       TEXT NOT NULL,
	first_seq INTEGER NOT NULL,
	PRIMARY KEY (kind, key, first_seq)
) WITHOUT ROWID;
`,
}

// migrationSteps[i] runs after the SQL of migration i (1-based), in the
// same transaction, for what SQL cannot express.
var migrationSteps = map[int]func(ctx context.Context, tx *sql.Tx) error{
	6: eventsToBlocks,
}

// runMigration applies migration i (1-based) in tx.
func runMigration(ctx context.Context, tx *sql.Tx, i int) error {
	if _, err := tx.ExecContext(ctx, migrations[i-1]); err != nil {
		return fmt.Errorf("store: migration %d: %w", i, err)
	}
	if step := migrationSteps[i]; step != nil {
		if err := step(ctx, tx); err != nil {
			return fmt.Errorf("store: migration %d: %w", i, err)
		}
	}
	return nil
}

// migrate brings the schema to len(migrations) in one transaction. A database
// from a newer binary (user_version > len(migrations)) is refused.
// An existing database (user_version > 0) that needs migrating is logged
// before and after: moving a large event log into blocks (migration 6)
// takes about a minute per four million events.
func migrate(ctx context.Context, db *sql.DB, log *slog.Logger) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("store: read user_version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("store: database schema version %d is newer than this binary's %d; upgrade the gateway", v, len(migrations))
	}
	start := time.Now()
	if v > 0 && v < len(migrations) {
		log.Info("store: migrating the database schema", "from", v, "to", len(migrations))
	}
	for i := v + 1; i <= len(migrations); i++ {
		if err := runMigration(ctx, tx, i); err != nil {
			return err
		}
	}
	if v == len(migrations) {
		return nil
	}
	// PRAGMA does not take bind parameters; len(migrations) is a constant.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations))); err != nil {
		return fmt.Errorf("store: set user_version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit migration: %w", err)
	}
	if v > 0 {
		log.Info("store: database schema migrated", "from", v, "to", len(migrations), "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// SchemaVersion is the schema version this binary migrates to.
func SchemaVersion() int { return len(migrations) }
