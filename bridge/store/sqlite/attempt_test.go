package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Entities and digests are keyed by dispatch attempt and scope instance:
// a reused scope ID keeps both digests, and reads show only the newest
// attempt (migration 2).
func TestEntitiesAndDigestsByAttemptAndScopeInstance(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
	ctx := context.Background()
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base)})
	ent := func(scope, id uint32, st gatewayv1.EntityStatus) *gatewayv1.Entity {
		return &gatewayv1.Entity{ScopeId: scope, EntityId: id, Status: st}
	}
	failed, complete := gatewayv1.EntityStatus_ENTITY_STATUS_FAILED, gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE
	mustCommit(t, s, &store.Batch{
		Entities: []store.EntityRecord{
			{DocID: "d1", Attempt: 1, Entity: ent(0, 1, failed)},
			{DocID: "d1", Attempt: 1, Entity: ent(0, 2, failed)},
			{DocID: "d1", Attempt: 1, Entity: ent(0, 3, failed)},
		},
		Digests: []store.DigestRecord{{DocID: "d1", Attempt: 1, Digest: &gatewayv1.ScopeDigest{ScopeId: 1, MerkleRoot: "old"}}},
	})
	mustCommit(t, s, &store.Batch{
		Entities: []store.EntityRecord{
			{DocID: "d1", Attempt: 2, Entity: ent(0, 1, complete)},
			{DocID: "d1", Attempt: 2, Entity: ent(1, 1, complete)},
			{DocID: "d1", Attempt: 2, ScopeInstance: 1, Entity: ent(1, 1, failed)},
		},
		Digests: []store.DigestRecord{
			{DocID: "d1", Attempt: 2, Digest: &gatewayv1.ScopeDigest{ScopeId: 1, MerkleRoot: "a"}},
			{DocID: "d1", Attempt: 2, ScopeInstance: 1, Digest: &gatewayv1.ScopeDigest{ScopeId: 1, MerkleRoot: "b"}},
		},
	})
	rec, err := s.GetDocument(ctx, "t", "d1", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Doc.Entities) != 3 {
		t.Fatalf("entities %v: want the 3 of attempt 2 only", rec.Doc.Entities)
	}
	want := []gatewayv1.EntityStatus{complete, complete, failed}
	for i, e := range rec.Doc.Entities {
		if e.Status != want[i] {
			t.Fatalf("entity %d: %v, want %v (order scope, instance, id)", i, e, want[i])
		}
	}
	if len(rec.Doc.Digests) != 2 || rec.Doc.Digests[0].MerkleRoot != "a" || rec.Doc.Digests[1].MerkleRoot != "b" {
		t.Fatalf("digests %v: want both instances of scope 1 of attempt 2", rec.Doc.Digests)
	}
	ents, err := s.ListEntities(ctx, "t", "d1")
	if err != nil || len(ents) != 3 {
		t.Fatalf("ListEntities %v %v", ents, err)
	}
	_, snap, err := s.SnapshotDocuments(ctx, "t")
	if err != nil || len(snap) != 1 || len(snap[0].Doc.Digests) != 2 {
		t.Fatalf("snapshot %v %v", snap, err)
	}
}

// A version 1 database keeps its entity and digest rows through migration 2.
func TestMigration2KeepsRows(t *testing.T) {
	dir := t.TempDir()
	db, err := sql.Open("sqlite", filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	// Build a version-1 database by hand: the v1 tables that matter here.
	for _, q := range []string{
		`CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID`,
		`INSERT INTO meta(key, value) VALUES ('last_seq', 0), ('event_count', 0), ('event_bytes', 0)`,
		`CREATE TABLE documents (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state INTEGER NOT NULL, terminal INTEGER NOT NULL,
			rev INTEGER NOT NULL, request_id TEXT, body_hash BLOB, create_time INTEGER NOT NULL, update_time INTEGER NOT NULL,
			spool_path TEXT NOT NULL DEFAULT '', result_path TEXT NOT NULL DEFAULT '', result_content_type TEXT NOT NULL DEFAULT '',
			dispatch_attempts INTEGER NOT NULL DEFAULT 0, private BLOB, body BLOB NOT NULL)`,
		`CREATE TABLE entities (doc_id TEXT NOT NULL, scope_id INTEGER NOT NULL, entity_id INTEGER NOT NULL, parent_id INTEGER NOT NULL,
			depth INTEGER NOT NULL, status INTEGER NOT NULL, chunk_index INTEGER NOT NULL, chunk_offset INTEGER NOT NULL,
			size INTEGER NOT NULL, checksum TEXT NOT NULL, attempts INTEGER NOT NULL, message TEXT NOT NULL,
			PRIMARY KEY (doc_id, scope_id, entity_id)) WITHOUT ROWID`,
		`CREATE TABLE digests (doc_id TEXT NOT NULL, scope_id INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (doc_id, scope_id)) WITHOUT ROWID`,
		`CREATE TABLE claims (claim_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc_id TEXT NOT NULL, entity_id INTEGER NOT NULL,
			scope_id INTEGER NOT NULL, state INTEGER NOT NULL, expire_time INTEGER NOT NULL, create_time INTEGER NOT NULL, redeem_time INTEGER NOT NULL) WITHOUT ROWID`,
		`CREATE TABLE events (seq INTEGER PRIMARY KEY, time INTEGER NOT NULL, kind TEXT NOT NULL, tenant TEXT NOT NULL, doc_id TEXT NOT NULL,
			rev INTEGER NOT NULL, since INTEGER NOT NULL, size INTEGER NOT NULL, body BLOB NOT NULL)`,
		`INSERT INTO documents (id, tenant, state, terminal, rev, create_time, update_time, body) VALUES ('d1', 't', 1, 0, 1, 1, 1, x'')`,
		`INSERT INTO entities VALUES ('d1', 0, 7, 0, 0, 5, 0, 0, 3, '', 1, 'kept')`,
		`INSERT INTO digests VALUES ('d1', 2, x'')`,
		`PRAGMA user_version = 1`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	s := openStore(t, dir, sqlite.Options{})
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d0", base)})
	if got := userVersion(t, dir); got != sqlite.SchemaVersion() {
		t.Fatalf("user_version %d, want %d", got, sqlite.SchemaVersion())
	}
	db, err = sql.Open("sqlite", filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	var msg string
	if err := db.QueryRow(`SELECT count(*), max(message) FROM entities WHERE doc_id = 'd1' AND attempt = 0 AND scope_instance = 0`).Scan(&n, &msg); err != nil || n != 1 || msg != "kept" {
		t.Fatalf("migrated entities: %d %q %v", n, msg, err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM digests WHERE doc_id = 'd1' AND scope_id = 2`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("migrated digests: %d %v", n, err)
	}
}
