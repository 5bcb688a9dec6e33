package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/internal/pagetoken"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// querier is what reads need: *sql.DB, *sql.Tx and *sql.Conn all qualify.
type querier interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

const docCols = `tenant, id, body_hash, spool_path, result_path, result_content_type,
	dispatch_attempts, private, body, create_time`

const claimCols = `claim_id, tenant, doc_id, entity_id, scope_id, state, expire_time, create_time, redeem_time, chunk`

const entityCols = `scope_id, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message`

type scanner interface{ Scan(dest ...any) error }

// scanDoc reads one docCols row; it also returns create_time (the page key).
func scanDoc(row scanner) (*store.DocumentRecord, int64, error) {
	var (
		rec  store.DocumentRecord
		id   string
		body []byte
		ct   int64
		// spool_path and result_path: non-empty when the payload file
		// exists (payloadColumn).
		spool, result string
	)
	if err := row.Scan(&rec.Tenant, &id, &rec.BodyHash, &spool, &result,
		&rec.ResultContentType, &rec.DispatchAttempts, &rec.Private, &body, &ct); err != nil {
		return nil, 0, err
	}
	rec.ContentPayload, rec.ResultPayload = spool != "", result != ""
	rec.Doc = new(gatewayv1.Document)
	if err := proto.Unmarshal(body, rec.Doc); err != nil {
		return nil, 0, fmt.Errorf("store: decode document %s: %w", id, err)
	}
	return &rec, ct, nil
}

func scanClaim(row scanner) (*store.ClaimRecord, error) {
	var (
		c                  gatewayv1.ClaimCheck
		rec                store.ClaimRecord
		state              int32
		expire, ct, redeem int64
		chunk              sql.NullInt64
	)
	if err := row.Scan(&c.ClaimId, &rec.Tenant, &c.DocumentId, &c.EntityId, &c.ScopeId, &state,
		&expire, &ct, &redeem, &chunk); err != nil {
		return nil, err
	}
	rec.Chunk = store.ClaimChunk{Set: chunk.Valid, Index: chunk.Int64}
	c.State = gatewayv1.ClaimCheck_ClaimState(state)
	c.ExpireTime = tsFromNanos(expire)
	c.CreateTime = tsFromNanos(ct)
	c.RedeemTime = tsFromNanos(redeem)
	rec.Claim = &c
	return &rec, nil
}

func scanEntity(row scanner) (*gatewayv1.Entity, error) {
	var (
		e            gatewayv1.Entity
		status       int32
		offset, size int64
	)
	if err := row.Scan(&e.ScopeId, &e.EntityId, &e.ParentId, &e.Depth, &status, &e.ChunkIndex,
		&offset, &size, &e.Checksum, &e.Attempts, &e.Message); err != nil {
		return nil, err
	}
	e.Status = gatewayv1.EntityStatus(status)
	e.ChunkOffset, e.SizeBytes = uint64(offset), uint64(size)
	return &e, nil
}

func tsNanos(t *timestamppb.Timestamp) int64 {
	if t == nil {
		return 0
	}
	return t.AsTime().UnixNano()
}

func tsFromNanos(n int64) *timestamppb.Timestamp {
	if n == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, n))
}

// readDocumentTx reads a document with its digests and claims on the writer
// connection (inside the writer's transaction).
func (s *Store) readDocumentTx(ctx context.Context, tenant, id string) (*store.DocumentRecord, error) {
	return readDocument(ctx, s.wconn, tenant, id, false)
}

func readDocument(ctx context.Context, q querier, tenant, id string, withEntities bool) (*store.DocumentRecord, error) {
	rec, _, err := scanDoc(q.QueryRowContext(ctx, "SELECT "+docCols+" FROM documents WHERE id = ? AND tenant = ?", id, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: document %s", store.ErrNotFound, id)
	} else if err != nil {
		return nil, fmt.Errorf("store: read document %s: %w", id, err)
	}
	if err := fillChildren(ctx, q, rec, withEntities); err != nil {
		return nil, err
	}
	return rec, nil
}

// fillChildren sets Digests, ClaimChecks and (optionally) Entities.
func fillChildren(ctx context.Context, q querier, rec *store.DocumentRecord, withEntities bool) error {
	id := rec.Doc.GetId()
	rows, err := q.QueryContext(ctx, `SELECT body FROM digests WHERE doc_id = ?1
		AND attempt = (SELECT coalesce(max(attempt), 0) FROM digests WHERE doc_id = ?1)
		ORDER BY scope_id, scope_instance`, id)
	if err != nil {
		return fmt.Errorf("store: read digests of %s: %w", id, err)
	}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			rows.Close()
			return err
		}
		d := new(gatewayv1.ScopeDigest)
		if err := proto.Unmarshal(b, d); err != nil {
			rows.Close()
			return fmt.Errorf("store: decode digest of %s: %w", id, err)
		}
		rec.Doc.Digests = append(rec.Doc.Digests, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = q.QueryContext(ctx, "SELECT "+claimCols+" FROM claims WHERE doc_id = ? ORDER BY create_time, claim_id", id)
	if err != nil {
		return fmt.Errorf("store: read claims of %s: %w", id, err)
	}
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			rows.Close()
			return err
		}
		rec.Doc.ClaimChecks = append(rec.Doc.ClaimChecks, c.Claim)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if withEntities {
		ents, err := readEntities(ctx, q, id)
		if err != nil {
			return err
		}
		rec.Doc.Entities = ents
	}
	return nil
}

func readEntities(ctx context.Context, q querier, docID string) ([]*gatewayv1.Entity, error) {
	rows, err := q.QueryContext(ctx, "SELECT "+entityCols+` FROM entities WHERE doc_id = ?1
		AND attempt = (SELECT coalesce(max(attempt), 0) FROM entities WHERE doc_id = ?1)
		ORDER BY scope_id, scope_instance, entity_id`, docID)
	if err != nil {
		return nil, fmt.Errorf("store: read entities of %s: %w", docID, err)
	}
	defer rows.Close()
	var out []*gatewayv1.Entity
	for rows.Next() {
		e, err := scanEntity(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// readTx runs fn in one read transaction (one consistent WAL snapshot).
func (s *Store) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.rdb.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin read: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	return fn(tx)
}

// GetDocument returns the document id of tenant with Digests and ClaimChecks
// filled, and Entities too when withEntities. ErrNotFound otherwise.
func (s *Store) GetDocument(ctx context.Context, tenant, id string, withEntities bool) (rec *store.DocumentRecord, err error) {
	err = s.readTx(ctx, func(tx *sql.Tx) error {
		rec, err = readDocument(ctx, tx, tenant, id, withEntities)
		return err
	})
	return rec, err
}

// GetPayload returns the inline payload kind of tenant's document docID,
// as committed by a Batch's Payloads (ErrNotFound when the document is not
// tenant's or has no such payload). The slice is the caller's.
func (s *Store) GetPayload(ctx context.Context, tenant, docID string, kind store.PayloadKind) ([]byte, error) {
	var body []byte
	err := s.rdb.QueryRowContext(ctx, `SELECT p.body FROM payloads p JOIN documents d ON d.id = p.doc_id
		WHERE p.doc_id = ? AND p.kind = ? AND d.tenant = ?`, docID, int32(kind), tenant).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: payload %d of document %s", store.ErrNotFound, kind, docID)
	} else if err != nil {
		return nil, fmt.Errorf("store: read payload %d of %s: %w", kind, docID, err)
	}
	if body == nil {
		body = []byte{} // stored non-NULL: an empty payload is not a missing one
	}
	return body, nil
}

// ListDocuments returns one page of tenant's documents ordered by
// create_time descending, then id descending (stable keyset pagination: rows
// created during paging never make a page repeat or skip an older row). next
// is "" on the last page. A token that does not decode, or that was issued for
// another state filter, answers ErrBadPageToken. Entities, digests and
// claims are not filled.
func (s *Store) ListDocuments(ctx context.Context, tenant string, lq store.ListQuery) ([]*store.DocumentRecord, string, error) {
	if lq.State < 0 || int(lq.State) > 255 {
		return nil, "", fmt.Errorf("%w: unknown state %d", store.ErrInvalid, lq.State)
	}
	size := lq.PageSize
	if size <= 0 {
		size = defaultPageSize
	}
	size = min(size, maxPageSize)
	var (
		where = []string{"tenant = ?"}
		args  = []any{tenant}
	)
	if lq.State != gatewayv1.State_STATE_UNSPECIFIED {
		where = append(where, "state = ?")
		args = append(args, int32(lq.State))
	}
	if lq.PageToken != "" {
		ct, id, err := pagetoken.Decode(lq.PageToken, lq.State, maxDocIDLen)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(create_time < ? OR (create_time = ? AND id < ?))")
		args = append(args, ct, ct, id)
	}
	args = append(args, size+1)
	q := "SELECT " + docCols + " FROM documents WHERE " + strings.Join(where, " AND ") +
		" ORDER BY create_time DESC, id DESC LIMIT ?"
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list documents: %w", err)
	}
	defer rows.Close()
	var (
		out    []*store.DocumentRecord
		lastCT int64
	)
	for rows.Next() {
		rec, ct, err := scanDoc(rows)
		if err != nil {
			return nil, "", err
		}
		if len(out) == size {
			return out, pagetoken.Encode(lq.State, lastCT, out[len(out)-1].Doc.GetId()), rows.Err()
		}
		out = append(out, rec)
		lastCT = ct
	}
	return out, "", rows.Err()
}

// ListEntities returns the entities of tenant's document docID ordered by
// (scope, entity id); ErrNotFound if the document is not tenant's.
func (s *Store) ListEntities(ctx context.Context, tenant, docID string) (out []*gatewayv1.Entity, err error) {
	err = s.readTx(ctx, func(tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, "SELECT 1 FROM documents WHERE id = ? AND tenant = ?", docID, tenant).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: document %s", store.ErrNotFound, docID)
		} else if err != nil {
			return err
		}
		out, err = readEntities(ctx, tx, docID)
		return err
	})
	return out, err
}

// ListNonTerminal returns every non-terminal document of every tenant,
// oldest first, for restart recovery (without entities).
func (s *Store) ListNonTerminal(ctx context.Context) ([]*store.DocumentRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, "SELECT "+docCols+" FROM documents WHERE terminal = 0 ORDER BY create_time, id")
	if err != nil {
		return nil, fmt.Errorf("store: list non-terminal: %w", err)
	}
	defer rows.Close()
	var out []*store.DocumentRecord
	for rows.Next() {
		rec, _, err := scanDoc(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

// GetClaim returns tenant's claim claimID (ErrNotFound otherwise).
func (s *Store) GetClaim(ctx context.Context, tenant, claimID string) (*store.ClaimRecord, error) {
	c, err := scanClaim(s.rdb.QueryRowContext(ctx, "SELECT "+claimCols+" FROM claims WHERE claim_id = ? AND tenant = ?", claimID, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: claim %s", store.ErrNotFound, claimID)
	} else if err != nil {
		return nil, fmt.Errorf("store: read claim %s: %w", claimID, err)
	}
	return c, nil
}

// ListClaims returns every claim of tenant's document docID with its
// Chunk, oldest first (none if the document is unknown).
func (s *Store) ListClaims(ctx context.Context, tenant, docID string) ([]*store.ClaimRecord, error) {
	return s.queryClaims(ctx, "list claims of "+docID,
		"SELECT "+claimCols+" FROM claims WHERE doc_id = ? AND tenant = ? ORDER BY create_time, claim_id", docID, tenant)
}

// ListIssuedClaims returns the ISSUED claims of every tenant whose expire
// time is before expiringBefore (for the expiry sweeper).
func (s *Store) ListIssuedClaims(ctx context.Context, before time.Time) ([]*store.ClaimRecord, error) {
	return s.queryClaims(ctx, "list issued claims",
		"SELECT "+claimCols+" FROM claims WHERE state = 1 AND expire_time < ? ORDER BY expire_time", before.UnixNano())
}

// queryClaims runs a claims query on the read pool and scans every row;
// what names the query in errors.
func (s *Store) queryClaims(ctx context.Context, what, query string, args ...any) ([]*store.ClaimRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	defer rows.Close()
	var out []*store.ClaimRecord
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// SnapshotDocuments returns every document of tenant (without entities, with
// digests and claims) and last_seq, read in one read transaction: the
// snapshot reflects exactly the events up to seq. It holds the whole
// snapshot in memory; SnapshotPages streams it.
func (s *Store) SnapshotDocuments(ctx context.Context, tenant string) (seq uint64, docs []*store.DocumentRecord, err error) {
	err = s.SnapshotPages(ctx, tenant, 1000, func(sq uint64, page []*store.DocumentRecord) error {
		seq = sq
		docs = append(docs, page...)
		return nil
	})
	return seq, docs, err
}

// SnapshotPages calls fn with last_seq and tenant's documents (without
// entities, with digests and claims) in pages of at most page documents,
// ordered by create time and id, all read in one read transaction: every
// page reflects exactly the events up to seq. The records carry Tenant and
// Doc only. fn is called at least once (with an empty page when tenant has
// no document); an error from fn ends the read and is returned. Memory is
// one page, whatever the store's size; the three statements are prepared
// once per call (the page's ids are bound as one JSON array).
func (s *Store) SnapshotPages(ctx context.Context, tenant string, page int, fn func(seq uint64, docs []*store.DocumentRecord) error) error {
	page = min(max(page, 1), 10000)
	return s.readTx(ctx, func(tx *sql.Tx) error {
		var last int64
		if err := tx.QueryRowContext(ctx, "SELECT value FROM meta WHERE key = 'last_seq'").Scan(&last); err != nil {
			return fmt.Errorf("store: snapshot: %w", err)
		}
		q, err := prepareSnapshot(ctx, tx)
		if err != nil {
			return err
		}
		defer q.close()
		var afterTime int64 = math.MinInt64
		afterID := ""
		for first := true; ; first = false {
			docs, cts, err := q.page(ctx, tenant, afterTime, afterID, page)
			if err != nil {
				return err
			}
			if len(docs) == 0 && !first {
				return nil
			}
			if err := q.children(ctx, tenant, docs); err != nil {
				return err
			}
			if err := fn(uint64(last), docs); err != nil {
				return err
			}
			if len(docs) < page {
				return nil
			}
			afterTime, afterID = cts[len(cts)-1], docs[len(docs)-1].Doc.GetId()
		}
	})
}

// SnapshotRaw is SnapshotPages without decoding the documents: pages of
// the same size, the same seq and single read transaction, each document
// as its stored bytes, so that a caller sending protobuf passes them
// through (bridge: StreamSnapshotEncoded). The order is the table's
// (rowid: the order documents were first stored, which follows their
// create time up to concurrent submissions), not SnapshotPages' create
// time: a sequential read of the table costs a third of a walk of the
// create-time index with a row lookup per document (docs/performance.md).
// It starts after after.Row (0: the first document). fn must not keep
// docs past its return.
func (s *Store) SnapshotRaw(ctx context.Context, tenant string, after store.SnapshotKey, page int, fn func(seq uint64, docs []store.RawDocument) error) error {
	page = min(max(page, 1), 10000)
	return s.readTx(ctx, func(tx *sql.Tx) error {
		var last int64
		if err := tx.QueryRowContext(ctx, "SELECT value FROM meta WHERE key = 'last_seq'").Scan(&last); err != nil {
			return fmt.Errorf("store: snapshot: %w", err)
		}
		q, err := prepareSnapshot(ctx, tx)
		if err != nil {
			return err
		}
		defer q.close()
		// A store (or tenant) without digests or claims skips their
		// per-page queries (a probe per document each).
		var has children
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM digests),
			EXISTS (SELECT 1 FROM claims WHERE tenant = ?)`, tenant).Scan(&has.digests, &has.claims); err != nil {
			return fmt.Errorf("store: snapshot: %w", err)
		}
		afterRow := after.Row
		docs := make([]store.RawDocument, 0, page)
		for first := true; ; first = false {
			docs, err = q.rawPage(ctx, tenant, afterRow, page, docs[:0])
			if err != nil {
				return err
			}
			if len(docs) == 0 && !first {
				return nil
			}
			if err := q.rawChildren(ctx, tenant, docs, has); err != nil {
				return err
			}
			if err := fn(uint64(last), docs); err != nil {
				return err
			}
			if len(docs) < page {
				return nil
			}
			afterRow = docs[len(docs)-1].Row
		}
	})
}

// rawPageQuery reads one page of documents as one row: SQLite scans the
// table in rowid order from after the last page (NOT INDEXED: the rowid
// range, never the tenant index with a sort) and concatenates the page's
// rows (rowid, id, body, each behind a hex header of its lengths) into one
// blob, so the driver returns one row a page instead of one a document
// (the per-row cost of database/sql and the driver was ~2 us a document,
// 90 % of the read; docs/performance.md).
const rawPageQuery = `SELECT count(*), CAST(coalesce(group_concat(
		printf('%016x%04x%08x', r, length(id), length(body)) || id || body, ''), '') AS BLOB)
	FROM (SELECT rowid AS r, id, body FROM documents NOT INDEXED
		WHERE rowid > ? AND tenant = ? ORDER BY rowid LIMIT ?)`

// rawRecordHeader is the hex header of a rawPageQuery record: rowid (16
// digits), id length (4), body length (8).
const rawRecordHeader = 16 + 4 + 8

// rawPage reads the page after afterRow into docs.
func (q *snapshotStmts) rawPage(ctx context.Context, tenant string, afterRow int64, page int, docs []store.RawDocument) ([]store.RawDocument, error) {
	var (
		n    int
		blob []byte
	)
	if err := q.rawDocs.QueryRowContext(ctx, afterRow, tenant, page).Scan(&n, &blob); err != nil {
		return nil, fmt.Errorf("store: snapshot: %w", err)
	}
	prev := afterRow
	for len(blob) > 0 {
		row, idLen, bodyLen, ok := parseRawHeader(blob)
		if !ok || len(blob) < rawRecordHeader+idLen+bodyLen {
			return nil, fmt.Errorf("store: snapshot: malformed page record")
		}
		if row <= prev {
			// group_concat's order is the subquery's in practice; should a
			// SQLite change that, fail rather than send a page out of
			// order or resume at the wrong row.
			return nil, fmt.Errorf("store: snapshot: page out of rowid order")
		}
		prev = row
		blob = blob[rawRecordHeader:]
		docs = append(docs, store.RawDocument{ID: string(blob[:idLen]), Row: row, Body: blob[idLen : idLen+bodyLen : idLen+bodyLen]})
		blob = blob[idLen+bodyLen:]
	}
	if len(docs) != n {
		return nil, fmt.Errorf("store: snapshot: page of %d documents decoded as %d", n, len(docs))
	}
	return docs, nil
}

// parseRawHeader decodes a rawRecordHeader.
func parseRawHeader(b []byte) (row int64, idLen, bodyLen int, ok bool) {
	if len(b) < rawRecordHeader {
		return 0, 0, 0, false
	}
	c, ok1 := parseHex(b[:16])
	i, ok2 := parseHex(b[16:20])
	l, ok3 := parseHex(b[20:rawRecordHeader])
	return int64(c), int(i), int(l), ok1 && ok2 && ok3
}

// parseHex decodes lower-case hex digits (printf %x) into a uint64.
func parseHex(b []byte) (uint64, bool) {
	var v uint64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// children says which child tables have rows to read.
type children struct{ digests, claims bool }

// rawChildren is children for RawDocuments: digests stay encoded.
func (q *snapshotStmts) rawChildren(ctx context.Context, tenant string, docs []store.RawDocument, has children) error {
	if len(docs) == 0 || !has.digests && !has.claims {
		return nil
	}
	byID := make(map[string]int, len(docs))
	ids := make([]string, 0, len(docs))
	for i, d := range docs {
		byID[d.ID] = i
		ids = append(ids, d.ID)
	}
	js, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	if has.digests {
		if err := q.rawDigests(ctx, string(js), docs, byID); err != nil {
			return err
		}
	}
	if !has.claims {
		return nil
	}
	rows, err := q.claims.QueryContext(ctx, tenant, string(js))
	if err != nil {
		return fmt.Errorf("store: snapshot claims: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			return err
		}
		if i, ok := byID[c.Claim.GetDocumentId()]; ok {
			docs[i].Claims = append(docs[i].Claims, c.Claim)
		}
	}
	return rows.Err()
}

// rawDigests attaches the encoded digests of the page's ids (a JSON array).
func (q *snapshotStmts) rawDigests(ctx context.Context, ids string, docs []store.RawDocument, byID map[string]int) error {
	rows, err := q.digests.QueryContext(ctx, ids)
	if err != nil {
		return fmt.Errorf("store: snapshot digests: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var b []byte
		if err := rows.Scan(&id, &b); err != nil {
			return err
		}
		if i, ok := byID[id]; ok {
			docs[i].Digests = append(docs[i].Digests, b)
		}
	}
	return rows.Err()
}

// snapshotStmts are SnapshotPages' statements, prepared on its transaction.
type snapshotStmts struct {
	docs, digests, claims *sql.Stmt
	rawDocs               *sql.Stmt
}

func prepareSnapshot(ctx context.Context, tx *sql.Tx) (*snapshotStmts, error) {
	var q snapshotStmts
	var err error
	for _, p := range []struct {
		st  **sql.Stmt
		sql string
	}{
		{&q.docs, `SELECT id, create_time, body FROM documents
			WHERE tenant = ? AND (create_time, id) > (?, ?) ORDER BY create_time, id LIMIT ?`},
		{&q.digests, `SELECT g.doc_id, g.body FROM digests g
			WHERE g.doc_id IN (SELECT value FROM json_each(?))
			AND g.attempt = (SELECT max(attempt) FROM digests WHERE doc_id = g.doc_id)
			ORDER BY g.doc_id, g.scope_id, g.scope_instance`},
		{&q.claims, "SELECT " + claimCols + ` FROM claims
			WHERE tenant = ? AND doc_id IN (SELECT value FROM json_each(?)) ORDER BY create_time, claim_id`},
		{&q.rawDocs, rawPageQuery},
	} {
		if *p.st, err = tx.PrepareContext(ctx, p.sql); err != nil {
			q.close()
			return nil, fmt.Errorf("store: snapshot: %w", err)
		}
	}
	return &q, nil
}

func (q *snapshotStmts) close() {
	for _, st := range []*sql.Stmt{q.docs, q.digests, q.claims, q.rawDocs} {
		if st != nil {
			st.Close()
		}
	}
}

// page reads the next page of tenant's documents after (afterTime,
// afterID) in (create_time, id) order, with their raw create times.
func (q *snapshotStmts) page(ctx context.Context, tenant string, afterTime int64, afterID string, page int) ([]*store.DocumentRecord, []int64, error) {
	rows, err := q.docs.QueryContext(ctx, tenant, afterTime, afterID, page)
	if err != nil {
		return nil, nil, fmt.Errorf("store: snapshot: %w", err)
	}
	defer rows.Close()
	docs := make([]*store.DocumentRecord, 0, page)
	cts := make([]int64, 0, page)
	for rows.Next() {
		var (
			id   string
			ct   int64
			body []byte
		)
		if err := rows.Scan(&id, &ct, &body); err != nil {
			return nil, nil, fmt.Errorf("store: snapshot: %w", err)
		}
		rec := &store.DocumentRecord{Tenant: tenant, Doc: new(gatewayv1.Document)}
		if err := proto.Unmarshal(body, rec.Doc); err != nil {
			return nil, nil, fmt.Errorf("store: decode document %s: %w", id, err)
		}
		docs, cts = append(docs, rec), append(cts, ct)
	}
	return docs, cts, rows.Err()
}

// children attaches the newest attempt's digests and the claims of docs
// (one query each for the page).
func (q *snapshotStmts) children(ctx context.Context, tenant string, docs []*store.DocumentRecord) error {
	if len(docs) == 0 {
		return nil
	}
	byID := make(map[string]*store.DocumentRecord, len(docs))
	ids := make([]string, 0, len(docs))
	for _, d := range docs {
		byID[d.Doc.GetId()] = d
		ids = append(ids, d.Doc.GetId())
	}
	js, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	rows, err := q.digests.QueryContext(ctx, string(js))
	if err != nil {
		return fmt.Errorf("store: snapshot digests: %w", err)
	}
	for rows.Next() {
		var id string
		var b []byte
		if err := rows.Scan(&id, &b); err != nil {
			rows.Close()
			return err
		}
		d := new(gatewayv1.ScopeDigest)
		if err := proto.Unmarshal(b, d); err != nil {
			rows.Close()
			return fmt.Errorf("store: decode digest of %s: %w", id, err)
		}
		if rec := byID[id]; rec != nil {
			rec.Doc.Digests = append(rec.Doc.Digests, d)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = q.claims.QueryContext(ctx, tenant, string(js))
	if err != nil {
		return fmt.Errorf("store: snapshot claims: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			return err
		}
		if rec := byID[c.Claim.GetDocumentId()]; rec != nil {
			rec.Doc.ClaimChecks = append(rec.Doc.ClaimChecks, c.Claim)
		}
	}
	return rows.Err()
}

// SnapshotBytes is the encoded size of all documents and digests (every
// tenant): the size of a full snapshot, the retention byte cap of the RRDP
// draft. One lookup: the total is kept in meta by triggers (schema
// migration 5), exact as of the last commit.
func (s *Store) SnapshotBytes(ctx context.Context) (int64, error) {
	var n int64
	if err := s.rdb.QueryRowContext(ctx, "SELECT value FROM meta WHERE key = 'snapshot_bytes'").Scan(&n); err != nil {
		return 0, fmt.Errorf("store: snapshot bytes: %w", err)
	}
	return n, nil
}
