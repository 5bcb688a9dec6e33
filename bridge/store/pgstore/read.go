package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/internal/pagetoken"
)

// querier is what reads need: the pool, a pgx.Tx and a pgx.Conn qualify.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const docCols = `tenant, id, body_hash, content_payload, result_payload, result_content_type,
	dispatch_attempts, private, body, create_time`

const claimCols = `claim_id, tenant, doc_id, entity_id, scope_id, state, expire_time, create_time, redeem_time, chunk`

const entityCols = `scope_id, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message`

// scanDoc reads one docCols row; it also returns create_time (the page key).
func scanDoc(row pgx.Row) (*store.DocumentRecord, int64, error) {
	var (
		rec      store.DocumentRecord
		id       string
		body     []byte
		ct, atts int64
	)
	if err := row.Scan(&rec.Tenant, &id, &rec.BodyHash, &rec.ContentPayload, &rec.ResultPayload,
		&rec.ResultContentType, &atts, &rec.Private, &body, &ct); err != nil {
		return nil, 0, err
	}
	rec.DispatchAttempts = uint32(atts)
	rec.Doc = new(gatewayv1.Document)
	if err := proto.Unmarshal(body, rec.Doc); err != nil {
		return nil, 0, fmt.Errorf("pgstore: decode document %s: %w", id, err)
	}
	return &rec, ct, nil
}

func scanClaim(row pgx.Row) (*store.ClaimRecord, error) {
	var (
		c                                 gatewayv1.ClaimCheck
		rec                               store.ClaimRecord
		state                             int32
		entity, scope, expire, ct, redeem int64
		chunk                             *int64
	)
	if err := row.Scan(&c.ClaimId, &rec.Tenant, &c.DocumentId, &entity, &scope, &state,
		&expire, &ct, &redeem, &chunk); err != nil {
		return nil, err
	}
	if chunk != nil {
		rec.Chunk = store.ClaimChunk{Set: true, Index: *chunk}
	}
	c.EntityId, c.ScopeId = uint32(entity), uint32(scope)
	c.State = gatewayv1.ClaimCheck_ClaimState(state)
	c.ExpireTime, c.CreateTime, c.RedeemTime = tsFromNanos(expire), tsFromNanos(ct), tsFromNanos(redeem)
	rec.Claim = &c
	return &rec, nil
}

func scanEntity(row pgx.Row) (*gatewayv1.Entity, error) {
	var (
		e                                         gatewayv1.Entity
		status                                    int32
		scope, id, parent, depth, chunk, attempts int64
		offset, size                              int64
	)
	if err := row.Scan(&scope, &id, &parent, &depth, &status, &chunk,
		&offset, &size, &e.Checksum, &attempts, &e.Message); err != nil {
		return nil, err
	}
	e.ScopeId, e.EntityId, e.ParentId, e.Depth = uint32(scope), uint32(id), uint32(parent), uint32(depth)
	e.ChunkIndex, e.Attempts = uint32(chunk), uint32(attempts)
	e.Status = gatewayv1.EntityStatus(status)
	e.ChunkOffset, e.SizeBytes = uint64(offset), uint64(size)
	return &e, nil
}

func tsFromNanos(n int64) *timestamppb.Timestamp {
	if n == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, n))
}

func readDocument(ctx context.Context, q querier, tenant, id string, withEntities bool) (*store.DocumentRecord, error) {
	rec, _, err := scanDoc(q.QueryRow(ctx, "SELECT "+docCols+" FROM documents WHERE id = $1 AND tenant = $2", id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: document %s", store.ErrNotFound, id)
	} else if err != nil {
		return nil, asUnavailable(fmt.Errorf("pgstore: read document %s: %w", id, err))
	}
	if err := fillChildren(ctx, q, rec, withEntities); err != nil {
		return nil, err
	}
	return rec, nil
}

// fillChildren sets Digests, ClaimChecks and (optionally) Entities.
func fillChildren(ctx context.Context, q querier, rec *store.DocumentRecord, withEntities bool) error {
	id := rec.Doc.GetId()
	digests, err := collect(ctx, q, "digests of "+id, scanDigest, `SELECT body FROM digests WHERE doc_id = $1
		AND attempt = (SELECT coalesce(max(attempt), 0) FROM digests WHERE doc_id = $1)
		ORDER BY scope_id, scope_instance`, id)
	if err != nil {
		return err
	}
	rec.Doc.Digests = digests
	claims, err := collect(ctx, q, "claims of "+id, scanClaim, "SELECT "+claimCols+" FROM claims WHERE doc_id = $1 ORDER BY create_time, claim_id", id)
	if err != nil {
		return err
	}
	for _, c := range claims {
		rec.Doc.ClaimChecks = append(rec.Doc.ClaimChecks, c.Claim)
	}
	if withEntities {
		rec.Doc.Entities, err = readEntities(ctx, q, id)
	}
	return err
}

func scanDigest(row pgx.Row) (*gatewayv1.ScopeDigest, error) {
	var b []byte
	if err := row.Scan(&b); err != nil {
		return nil, err
	}
	d := new(gatewayv1.ScopeDigest)
	if err := proto.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("pgstore: decode digest: %w", err)
	}
	return d, nil
}

// collect runs a query and scans every row with scan; what names it in errors.
func collect[T any](ctx context.Context, q querier, what string, scan func(pgx.Row) (T, error), sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, asUnavailable(fmt.Errorf("pgstore: %s: %w", what, err))
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, asUnavailable(fmt.Errorf("pgstore: %s: %w", what, err))
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, asUnavailable(fmt.Errorf("pgstore: %s: %w", what, err))
	}
	return out, nil
}

func readEntities(ctx context.Context, q querier, docID string) ([]*gatewayv1.Entity, error) {
	return collect(ctx, q, "entities of "+docID, scanEntity, "SELECT "+entityCols+` FROM entities WHERE doc_id = $1
		AND attempt = (SELECT coalesce(max(attempt), 0) FROM entities WHERE doc_id = $1)
		ORDER BY scope_id, scope_instance, entity_id`, docID)
}

// readTx runs fn in one REPEATABLE READ, read-only transaction (one
// snapshot for every statement).
func (s *Store) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return asUnavailable(pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn))
}

// GetDocument returns the document id of tenant with Digests and
// ClaimChecks filled, and Entities too when withEntities. ErrNotFound
// otherwise.
func (s *Store) GetDocument(ctx context.Context, tenant, id string, withEntities bool) (rec *store.DocumentRecord, err error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	err = s.readTx(ctx, func(tx pgx.Tx) error {
		rec, err = readDocument(ctx, tx, tenant, id, withEntities)
		return err
	})
	return rec, err
}

// GetPayload returns the inline payload kind of tenant's document docID
// (ErrNotFound when the document is not tenant's or has no such payload).
func (s *Store) GetPayload(ctx context.Context, tenant, docID string, kind store.PayloadKind) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	var body []byte
	err := s.pool.QueryRow(ctx, `SELECT p.body FROM payloads p JOIN documents d ON d.id = p.doc_id
		WHERE p.doc_id = $1 AND p.kind = $2 AND d.tenant = $3`, docID, int32(kind), tenant).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: payload %d of document %s", store.ErrNotFound, kind, docID)
	} else if err != nil {
		return nil, asUnavailable(fmt.Errorf("pgstore: read payload %d of %s: %w", kind, docID, err))
	}
	if body == nil {
		body = []byte{}
	}
	return body, nil
}

// where builds a WHERE clause with numbered parameters.
type where struct {
	conds []string
	args  []any
}

func (w *where) add(cond string, args ...any) {
	for _, a := range args {
		w.args = append(w.args, a)
		cond = strings.Replace(cond, "?", "$"+strconv.Itoa(len(w.args)), 1)
	}
	w.conds = append(w.conds, cond)
}

func (w *where) param(a any) string {
	w.args = append(w.args, a)
	return "$" + strconv.Itoa(len(w.args))
}

func (w *where) String() string { return strings.Join(w.conds, " AND ") }

// ListDocuments returns one page of tenant's documents ordered by
// create_time descending, then id descending (keyset pagination).
func (s *Store) ListDocuments(ctx context.Context, tenant string, lq store.ListQuery) ([]*store.DocumentRecord, string, error) {
	if err := s.enter(); err != nil {
		return nil, "", err
	}
	defer s.wg.Done()
	if lq.State < 0 || int(lq.State) > 255 {
		return nil, "", fmt.Errorf("%w: unknown state %d", store.ErrInvalid, lq.State)
	}
	size := lq.PageSize
	if size <= 0 {
		size = defaultPageSize
	}
	size = min(size, maxPageSize)
	var w where
	w.add("tenant = ?", tenant)
	if lq.State != gatewayv1.State_STATE_UNSPECIFIED {
		w.add("state = ?", int32(lq.State))
	}
	if lq.PageToken != "" {
		ct, id, err := pagetoken.Decode(lq.PageToken, lq.State, maxDocIDLen)
		if err != nil {
			return nil, "", err
		}
		w.add("(create_time, id) < (?, ?)", ct, id)
	}
	q := "SELECT " + docCols + " FROM documents WHERE " + w.String() +
		" ORDER BY create_time DESC, id DESC LIMIT " + w.param(size+1)
	rows, err := s.pool.Query(ctx, q, w.args...)
	if err != nil {
		return nil, "", asUnavailable(fmt.Errorf("pgstore: list documents: %w", err))
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
			return out, pagetoken.Encode(lq.State, lastCT, out[len(out)-1].Doc.GetId()), nil
		}
		out = append(out, rec)
		lastCT = ct
	}
	return out, "", rows.Err()
}

// ListEntities returns the entities of tenant's document docID ordered by
// (scope, entity id); ErrNotFound if the document is not tenant's.
func (s *Store) ListEntities(ctx context.Context, tenant, docID string) (out []*gatewayv1.Entity, err error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	err = s.readTx(ctx, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, "SELECT 1 FROM documents WHERE id = $1 AND tenant = $2", docID, tenant).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: document %s", store.ErrNotFound, docID)
		} else if err != nil {
			return err
		}
		out, err = readEntities(ctx, tx, docID)
		return err
	})
	return out, err
}

func scanDocOnly(row pgx.Row) (*store.DocumentRecord, error) {
	rec, _, err := scanDoc(row)
	return rec, err
}

// ListNonTerminal returns every non-terminal document of every tenant,
// oldest first (without entities).
func (s *Store) ListNonTerminal(ctx context.Context) ([]*store.DocumentRecord, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	return collect(ctx, s.pool, "list non-terminal", scanDocOnly,
		"SELECT "+docCols+" FROM documents WHERE NOT terminal ORDER BY create_time, id")
}

// GetClaim returns tenant's claim claimID (ErrNotFound otherwise).
func (s *Store) GetClaim(ctx context.Context, tenant, claimID string) (*store.ClaimRecord, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	c, err := scanClaim(s.pool.QueryRow(ctx, "SELECT "+claimCols+" FROM claims WHERE claim_id = $1 AND tenant = $2", claimID, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: claim %s", store.ErrNotFound, claimID)
	} else if err != nil {
		return nil, asUnavailable(fmt.Errorf("pgstore: read claim %s: %w", claimID, err))
	}
	return c, nil
}

// ListClaims returns every claim of tenant's document docID, oldest first.
func (s *Store) ListClaims(ctx context.Context, tenant, docID string) ([]*store.ClaimRecord, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	return collect(ctx, s.pool, "list claims of "+docID, scanClaim,
		"SELECT "+claimCols+" FROM claims WHERE doc_id = $1 AND tenant = $2 ORDER BY create_time, claim_id", docID, tenant)
}

// ListIssuedClaims returns the ISSUED claims of every tenant whose expire
// time is before expiringBefore.
func (s *Store) ListIssuedClaims(ctx context.Context, before time.Time) ([]*store.ClaimRecord, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	return collect(ctx, s.pool, "list issued claims", scanClaim,
		"SELECT "+claimCols+" FROM claims WHERE state = 1 AND expire_time < $1 ORDER BY expire_time", before.UnixNano())
}

// ReadEvents returns up to q.Limit retained events with seq >= q.From that
// match the filter, in ascending seq order.
func (s *Store) ReadEvents(ctx context.Context, eq store.EventQuery) ([]store.EventRecord, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	return readEvents(ctx, s.pool, eq)
}

// SnapshotDocuments returns every document of tenant (without entities,
// with digests and claims) and last_seq, read in one REPEATABLE READ
// transaction: the snapshot reflects exactly the events up to seq. It
// holds the whole snapshot in memory; SnapshotPages streams it.
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
// ordered by create time and id, all read in one REPEATABLE READ
// transaction: every page reflects exactly the events up to seq. fn is
// called at least once (with an empty page when tenant has no document);
// an error from fn ends the read and is returned.
func (s *Store) SnapshotPages(ctx context.Context, tenant string, page int, fn func(seq uint64, docs []*store.DocumentRecord) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.wg.Done()
	page = min(max(page, 1), 10000)
	return s.readTx(ctx, func(tx pgx.Tx) error {
		var last int64
		if err := tx.QueryRow(ctx, "SELECT last_seq FROM meta WHERE id = 1").Scan(&last); err != nil {
			return fmt.Errorf("pgstore: snapshot: %w", err)
		}
		var afterTime int64 = math.MinInt64
		afterID := ""
		for first := true; ; first = false {
			docs, err := collect(ctx, tx, "snapshot", scanDocTime, "SELECT "+docCols+` FROM documents
				WHERE tenant = $1 AND (create_time, id) > ($2, $3) ORDER BY create_time, id LIMIT $4`, tenant, afterTime, afterID, page)
			if err != nil {
				return err
			}
			if len(docs) == 0 && !first {
				return nil
			}
			recs := make([]*store.DocumentRecord, len(docs))
			for i, d := range docs {
				recs[i] = d.rec
			}
			if err := snapshotChildren(ctx, tx, tenant, recs); err != nil {
				return err
			}
			if err := fn(uint64(last), recs); err != nil {
				return err
			}
			if len(docs) < page {
				return nil
			}
			afterTime, afterID = docs[len(docs)-1].ct, recs[len(recs)-1].Doc.GetId()
		}
	})
}

type docTime struct {
	rec *store.DocumentRecord
	ct  int64
}

func scanDocTime(row pgx.Row) (docTime, error) {
	rec, ct, err := scanDoc(row)
	return docTime{rec, ct}, err
}

type docDigest struct {
	doc string
	d   *gatewayv1.ScopeDigest
}

func scanDocDigest(row pgx.Row) (docDigest, error) {
	var x docDigest
	var b []byte
	if err := row.Scan(&x.doc, &b); err != nil {
		return x, err
	}
	x.d = new(gatewayv1.ScopeDigest)
	if err := proto.Unmarshal(b, x.d); err != nil {
		return x, fmt.Errorf("decode digest of %s: %w", x.doc, err)
	}
	return x, nil
}

// snapshotChildren attaches the newest attempt's digests and the claims of
// docs (one query each for the page).
func snapshotChildren(ctx context.Context, tx pgx.Tx, tenant string, docs []*store.DocumentRecord) error {
	if len(docs) == 0 {
		return nil
	}
	byID := make(map[string]*store.DocumentRecord, len(docs))
	ids := make([]string, 0, len(docs))
	for _, d := range docs {
		byID[d.Doc.GetId()] = d
		ids = append(ids, d.Doc.GetId())
	}
	digests, err := collect(ctx, tx, "snapshot digests", scanDocDigest, `SELECT g.doc_id, g.body FROM digests g JOIN documents d ON d.id = g.doc_id
		WHERE d.tenant = $1 AND g.doc_id = ANY($2) AND g.attempt = (SELECT max(attempt) FROM digests WHERE doc_id = g.doc_id)
		ORDER BY g.doc_id, g.scope_id, g.scope_instance`, tenant, ids)
	if err != nil {
		return err
	}
	for _, x := range digests {
		if rec := byID[x.doc]; rec != nil {
			rec.Doc.Digests = append(rec.Doc.Digests, x.d)
		}
	}
	claims, err := collect(ctx, tx, "snapshot claims", scanClaim, "SELECT "+claimCols+" FROM claims WHERE tenant = $1 AND doc_id = ANY($2) ORDER BY create_time, claim_id", tenant, ids)
	if err != nil {
		return err
	}
	for _, c := range claims {
		if rec := byID[c.Claim.GetDocumentId()]; rec != nil {
			rec.Doc.ClaimChecks = append(rec.Doc.ClaimChecks, c.Claim)
		}
	}
	return nil
}

// SnapshotBytes is the encoded size of all documents and digests (every
// tenant). One row: the total kept in meta by triggers (schema migration
// 5), exact as of the last commit of any replica.
func (s *Store) SnapshotBytes(ctx context.Context) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.wg.Done()
	var n int64
	if err := s.pool.QueryRow(ctx, "SELECT snapshot_bytes FROM meta WHERE id = 1").Scan(&n); err != nil {
		return 0, fmt.Errorf("pgstore: snapshot bytes: %w", err)
	}
	return n, nil
}
