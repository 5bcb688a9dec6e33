package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrationLockKey is the pg_advisory_xact_lock key that serialises
// migrations of every replica on one database ("pipestrm" in ASCII).
const migrationLockKey int64 = 0x7069706573747266

// migrations are applied in order; migration i brings the schema to version
// i+1 (stored in schema_version). Append only: never edit an applied one.
//
// Times are unix nanoseconds (BIGINT, 0 = unset), as in the SQLite store;
// unsigned protobuf fields are BIGINT (uint32 fits; uint64 sizes and offsets
// stay below 2^63).
var migrations = []string{
	// 1: the schema of the SQLite store at its version 4, plus chunked
	// payload blobs (payload.go) and the one-row event counter (commit.go).
	`
CREATE TABLE meta (
	id          INT PRIMARY KEY CHECK (id = 1),
	last_seq    BIGINT NOT NULL,
	event_count BIGINT NOT NULL,
	event_bytes BIGINT NOT NULL
);
INSERT INTO meta VALUES (1, 0, 0, 0);

CREATE TABLE documents (
	id                  TEXT COLLATE "C" PRIMARY KEY,
	tenant              TEXT NOT NULL,
	state               INT NOT NULL,
	terminal            BOOLEAN NOT NULL,
	rev                 BIGINT NOT NULL,
	request_id          TEXT,
	body_hash           BYTEA,
	create_time         BIGINT NOT NULL,
	update_time         BIGINT NOT NULL,
	content_payload     BOOLEAN NOT NULL DEFAULT false,
	result_payload      BOOLEAN NOT NULL DEFAULT false,
	result_content_type TEXT NOT NULL DEFAULT '',
	dispatch_attempts   BIGINT NOT NULL DEFAULT 0,
	private             BYTEA,
	body                BYTEA NOT NULL
);
CREATE UNIQUE INDEX documents_request ON documents(tenant, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX documents_list ON documents(tenant, create_time DESC, id DESC);
CREATE INDEX documents_state ON documents(tenant, state, create_time DESC, id DESC);
CREATE INDEX documents_open ON documents(create_time) WHERE NOT terminal;

CREATE TABLE entities (
	doc_id         TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	attempt        BIGINT NOT NULL,
	scope_id       BIGINT NOT NULL,
	scope_instance BIGINT NOT NULL,
	entity_id      BIGINT NOT NULL,
	parent_id      BIGINT NOT NULL,
	depth          BIGINT NOT NULL,
	status         INT NOT NULL,
	chunk_index    BIGINT NOT NULL,
	chunk_offset   BIGINT NOT NULL,
	size           BIGINT NOT NULL,
	checksum       TEXT NOT NULL,
	attempts       BIGINT NOT NULL,
	message        TEXT NOT NULL,
	PRIMARY KEY (doc_id, attempt, scope_id, scope_instance, entity_id)
);

CREATE TABLE digests (
	doc_id         TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	attempt        BIGINT NOT NULL,
	scope_id       BIGINT NOT NULL,
	scope_instance BIGINT NOT NULL,
	body           BYTEA NOT NULL,
	PRIMARY KEY (doc_id, attempt, scope_id, scope_instance)
);

CREATE TABLE claims (
	claim_id    TEXT COLLATE "C" PRIMARY KEY,
	tenant      TEXT NOT NULL,
	doc_id      TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	entity_id   BIGINT NOT NULL,
	scope_id    BIGINT NOT NULL,
	state       INT NOT NULL,
	expire_time BIGINT NOT NULL,
	create_time BIGINT NOT NULL,
	redeem_time BIGINT NOT NULL,
	chunk       BIGINT
);
CREATE INDEX claims_doc ON claims(doc_id);
CREATE INDEX claims_issued ON claims(expire_time) WHERE state = 1;

CREATE TABLE events (
	seq    BIGINT PRIMARY KEY,
	time   BIGINT NOT NULL,
	kind   TEXT NOT NULL,
	tenant TEXT NOT NULL,
	doc_id TEXT NOT NULL,
	rev    BIGINT NOT NULL,
	since  BIGINT NOT NULL,
	size   BIGINT NOT NULL,
	body   BYTEA NOT NULL
);
CREATE INDEX events_tenant ON events(tenant, seq);
CREATE INDEX events_doc ON events(doc_id, seq);

-- The seq field (field 1, varint) appended to an event body: the writer
-- takes seqs and inserts events in one statement (commit.go).
CREATE FUNCTION pipestream_seq_field(seq BIGINT) RETURNS BYTEA
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
	out BYTEA := '\x08';
	v   BIGINT := seq;
BEGIN
	WHILE v >= 128 LOOP
		out := out || set_byte('\x00'::bytea, 0, ((v & 127) | 128)::int);
		v := v >> 7;
	END LOOP;
	RETURN out || set_byte('\x00'::bytea, 0, v::int);
END $$;

CREATE TABLE payloads (
	doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
	kind   INT NOT NULL,
	body   BYTEA NOT NULL,
	PRIMARY KEY (doc_id, kind)
);

CREATE TABLE blobs (
	blob_id    BIGSERIAL PRIMARY KEY,
	doc_id     TEXT NOT NULL,
	kind       INT NOT NULL,
	state      INT NOT NULL,
	size       BIGINT NOT NULL DEFAULT 0,
	chunk_size INT NOT NULL,
	touched    BIGINT NOT NULL
);
CREATE UNIQUE INDEX blobs_synced ON blobs(doc_id, kind) WHERE state = 1;
CREATE INDEX blobs_unsynced ON blobs(touched) WHERE state <> 1;

CREATE TABLE blob_chunks (
	blob_id BIGINT NOT NULL REFERENCES blobs(blob_id) ON DELETE CASCADE,
	n       INT NOT NULL,
	data    BYTEA NOT NULL,
	PRIMARY KEY (blob_id, n)
);
-- Chunks are stored out of line without compression: uploads are often
-- already compressed, and pglz on every 256 KiB chunk costs CPU for nothing.
ALTER TABLE blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
`,
	// 2: document leases (lease.go). owner NULL: nobody drives the
	// document (written before leases); lease_expires is the database's
	// clock.
	`
ALTER TABLE documents ADD COLUMN owner TEXT,
	ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0,
	ADD COLUMN lease_expires TIMESTAMPTZ NOT NULL DEFAULT '-infinity';
CREATE INDEX documents_lease ON documents(lease_expires) WHERE NOT terminal;
`,
	// 3: retention positions shared by the replicas' event logs
	// (positions.go): one row per replica, valid until expires (the
	// database's clock).
	`
CREATE TABLE retention_positions (
	replica TEXT COLLATE "C" PRIMARY KEY,
	min_seq BIGINT NOT NULL,
	clients INT NOT NULL,
	expires TIMESTAMPTZ NOT NULL
);
`,
	// 4: events stored as blocks, one row per committing transaction
	// (events.go), instead of a row each: a group commit of many small
	// documents inserts one heap row and one primary-key entry, and the
	// GIN indexes get one entry per distinct tenant and document of the
	// block. Column i of every array is the event first_seq + i; bodies are
	// stored without their seq field (it is appended on read) and sizes
	// are the bodies' lengths without it. meta.floor_seq: events below it
	// are pruned (a block straddling it is kept whole and its earlier
	// events are hidden). Existing events become blocks of one.
	`
CREATE TABLE event_blocks (
	first_seq BIGINT PRIMARY KEY,
	last_seq  BIGINT NOT NULL,
	times     BIGINT[] NOT NULL,
	kinds     TEXT[] NOT NULL,
	tenants   TEXT[] NOT NULL,
	doc_ids   TEXT[] NOT NULL,
	revs      BIGINT[] NOT NULL,
	sinces    BIGINT[] NOT NULL,
	sizes     INT[] NOT NULL,
	bodies    BYTEA[] NOT NULL
);
CREATE INDEX event_blocks_tenants ON event_blocks USING GIN (tenants);
CREATE INDEX event_blocks_docs ON event_blocks USING GIN (doc_ids);
ALTER TABLE meta ADD COLUMN floor_seq BIGINT NOT NULL DEFAULT 0;
-- The size of pipestream_seq_field(seq), without building it.
CREATE FUNCTION pipestream_seq_field_len(seq BIGINT) RETURNS INT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
	SELECT 2 + (seq >= 128)::int + (seq >= 16384)::int + (seq >= 2097152)::int + (seq >= 268435456)::int
		+ (seq >= 34359738368)::int + (seq >= 4398046511104)::int + (seq >= 562949953421312)::int
		+ (seq >= 72057594037927936)::int
$$;
INSERT INTO event_blocks
	SELECT seq, seq, ARRAY[time], ARRAY[kind], ARRAY[tenant], ARRAY[doc_id], ARRAY[rev], ARRAY[since],
		ARRAY[size - pipestream_seq_field_len(seq)]::int[],
		ARRAY[substring(body FROM 1 FOR length(body) - pipestream_seq_field_len(seq))]
	FROM events;
DROP TABLE events;
`,
	// 5: the snapshot size (SnapshotBytes: the encoded size of every
	// document and digest, the retention byte cap) kept as a running total
	// in meta.snapshot_bytes, so that reading it is one row instead of a
	// scan of the documents table. A row trigger adds each change's size
	// difference to a transaction-local setting (no lock, no write) and
	// marks the fold queued; a deferred constraint trigger, queued by the
	// transaction's first statement that changes a body (its WHEN reads
	// the mark: later rows queue nothing), folds the sum into meta at
	// COMMIT. So the total commits with the rows it sums, from any replica
	// and any writer; the meta row is locked only at COMMIT, after every
	// row lock of the transaction (as an event-writing commit locks it
	// anyway); and a rolled-back transaction or savepoint takes its
	// settings and its queued fold with it. Seeded from one scan here.
	`
ALTER TABLE meta ADD COLUMN snapshot_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE meta SET snapshot_bytes = coalesce((SELECT sum(length(body)) FROM documents), 0)::bigint +
	coalesce((SELECT sum(length(body)) FROM digests), 0)::bigint WHERE id = 1;
CREATE FUNCTION pipestream_snapshot_delta() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
	d BIGINT := coalesce(nullif(current_setting('pipestream.snapshot_delta', true), ''), '0')::bigint;
BEGIN
	IF TG_OP <> 'DELETE' THEN d := d + length(NEW.body); END IF;
	IF TG_OP <> 'INSERT' THEN d := d - length(OLD.body); END IF;
	PERFORM set_config('pipestream.snapshot_delta', d::text, true);
	PERFORM set_config('pipestream.snapshot_fold', 'queued', true);
	RETURN NULL;
END $$;
CREATE FUNCTION pipestream_snapshot_fold() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
	d BIGINT := coalesce(nullif(current_setting('pipestream.snapshot_delta', true), ''), '0')::bigint;
BEGIN
	IF d <> 0 THEN
		UPDATE meta SET snapshot_bytes = snapshot_bytes + d WHERE id = 1;
	END IF;
	PERFORM set_config('pipestream.snapshot_delta', '0', true);
	PERFORM set_config('pipestream.snapshot_fold', '', true);
	RETURN NULL;
END $$;
CREATE TRIGGER documents_snapshot_delta AFTER INSERT OR UPDATE OF body OR DELETE ON documents
	FOR EACH ROW EXECUTE FUNCTION pipestream_snapshot_delta();
CREATE CONSTRAINT TRIGGER documents_snapshot_fold AFTER INSERT OR UPDATE OF body OR DELETE ON documents
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
	WHEN (current_setting('pipestream.snapshot_fold', true) IS DISTINCT FROM 'queued')
	EXECUTE FUNCTION pipestream_snapshot_fold();
CREATE TRIGGER digests_snapshot_delta AFTER INSERT OR UPDATE OF body OR DELETE ON digests
	FOR EACH ROW EXECUTE FUNCTION pipestream_snapshot_delta();
CREATE CONSTRAINT TRIGGER digests_snapshot_fold AFTER INSERT OR UPDATE OF body OR DELETE ON digests
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
	WHEN (current_setting('pipestream.snapshot_fold', true) IS DISTINCT FROM 'queued')
	EXECUTE FUNCTION pipestream_snapshot_fold();
`,
	// 6: a document's streamed payloads by (doc_id, kind) in every state
	// (payload.go). The partial indexes cover only the synced payload of a
	// kind and the unsynced ones by age, so RemovePayload (every state)
	// read every blob of every document, and so did OpenPayload and Sync
	// under the generic plan of their prepared statements, whose state
	// parameter cannot match a partial index's predicate
	// (TestPayloadStatementsScanNoHistory).
	`
CREATE INDEX blobs_doc ON blobs(doc_id, kind);
`,
}

// SchemaVersion is the schema version this binary migrates to.
func SchemaVersion() int { return len(migrations) }

// migrate brings the schema to len(migrations) in one transaction that
// holds a transaction-scoped advisory lock: replicas starting at once run
// it one after the other, and the later ones find the schema current. DDL is
// transactional in PostgreSQL, so a failed migration leaves nothing behind.
// A database from a newer binary is refused.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLockKey); err != nil {
			return fmt.Errorf("pgstore: migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS schema_version (version INT NOT NULL)"); err != nil {
			return fmt.Errorf("pgstore: schema_version: %w", err)
		}
		var v int
		err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_version").Scan(&v)
		if err != nil {
			return fmt.Errorf("pgstore: read schema version: %w", err)
		}
		if v > len(migrations) {
			return fmt.Errorf("pgstore: database schema version %d is newer than this binary's %d; upgrade the gateway", v, len(migrations))
		}
		for i := v; i < len(migrations); i++ {
			if _, err := tx.Exec(ctx, migrations[i]); err != nil {
				return fmt.Errorf("pgstore: migration %d: %w", i+1, err)
			}
		}
		if v == len(migrations) {
			return nil
		}
		if _, err := tx.Exec(ctx, "DELETE FROM schema_version"); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO schema_version VALUES ($1)", len(migrations))
		return err
	})
}
