package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// apply runs one batch inside the current transaction (and savepoint, if
// any). It assigns the events' seqs and queues them in s.pending for
// flushEvents. It may run again for the same request after a rollback, so
// it derives everything from the prepared request, not from a previous run.
func (s *Store) apply(ctx context.Context, r *request, st *txState) error {
	b := r.b
	if r.create != nil {
		dup, err := s.applyCreate(ctx, r.create)
		if err != nil {
			return err
		}
		if dup != nil {
			r.res.Duplicate = dup
			return nil // nothing else of the batch applies
		}
	}
	if b.Redeem != nil {
		c, err := s.applyRedeem(ctx, b.Redeem)
		if err != nil {
			return err
		}
		r.res.Claim = c
	}
	for i := range r.updates {
		if err := s.applyUpdate(ctx, &r.updates[i]); err != nil {
			return err
		}
	}
	for _, e := range b.Entities {
		x := e.Entity
		if _, err := s.exec(ctx, `INSERT INTO entities
			(doc_id, attempt, scope_id, scope_instance, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message)
			VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)
			ON CONFLICT(doc_id, attempt, scope_id, scope_instance, entity_id) DO UPDATE SET
			parent_id=excluded.parent_id, depth=excluded.depth, status=excluded.status,
			chunk_index=excluded.chunk_index, chunk_offset=excluded.chunk_offset, size=excluded.size,
			checksum=excluded.checksum, attempts=excluded.attempts, message=excluded.message`, e.DocID, e.Attempt, x.GetScopeId(), e.ScopeInstance, x.GetEntityId(), x.GetParentId(), x.GetDepth(), int32(x.GetStatus()),
			x.GetChunkIndex(), int64(x.GetChunkOffset()), int64(x.GetSizeBytes()), x.GetChecksum(),
			x.GetAttempts(), x.GetMessage()); err != nil {
			return fmt.Errorf("store: upsert entity %s/%d/%d: %w", e.DocID, x.GetScopeId(), x.GetEntityId(), err)
		}
	}
	for _, d := range b.Digests {
		body, err := proto.Marshal(d.Digest)
		if err != nil {
			return fmt.Errorf("store: encode digest: %w", err)
		}
		if _, err := s.exec(ctx, `INSERT INTO digests (doc_id, attempt, scope_id, scope_instance, body) VALUES (?,?,?,?,?)
			ON CONFLICT(doc_id, attempt, scope_id, scope_instance) DO UPDATE SET body=excluded.body`,
			d.DocID, d.Attempt, d.Digest.GetScopeId(), d.ScopeInstance, body); err != nil {
			return fmt.Errorf("store: upsert digest %s/%d: %w", d.DocID, d.Digest.GetScopeId(), err)
		}
	}
	for _, c := range b.Claims {
		if err := s.applyClaim(ctx, c); err != nil {
			return err
		}
	}
	for _, p := range b.Payloads {
		if err := s.applyPayload(ctx, p); err != nil {
			return err
		}
	}
	if len(r.events) > 0 {
		r.res.Seqs = make([]uint64, len(r.events))
		for i := range r.events {
			e := &r.events[i]
			seq := st.lastSeq + 1
			if seq >= store.MaxSeq {
				return fmt.Errorf("%w: last seq %d", store.ErrSeqExhausted, st.lastSeq)
			}
			// Truncate first: a rerun of the group appends the seq again.
			e.body = protowire.AppendVarint(protowire.AppendTag(e.body[:e.n], eventFieldSeq, protowire.VarintType), seq)
			s.pending = append(s.pending, pendingEvent{seq: seq, e: e})
			st.lastSeq = seq
			st.count++
			st.bytes += uint64(len(e.body))
			r.res.Seqs[i] = seq
		}
	}
	return nil
}

// pendingEvent is an event whose seq is assigned and whose block is not
// yet written (see flushEvents).
type pendingEvent struct {
	seq uint64
	e   *encEvent
}

// flushEvents writes the pending events as blocks of at most
// maxBlockEvents events (one block for a typical group) and empties the
// list (also on error). Writer goroutine only.
func (s *Store) flushEvents(ctx context.Context) error {
	defer s.dropPending()
	b := &s.blk
	for i := 0; i < len(s.pending); {
		n := min(len(s.pending)-i, maxBlockEvents)
		b.reset(int64(s.pending[i].seq))
		for _, p := range s.pending[i : i+n] {
			if err := b.add(int64(p.seq), p.e, p.e.body[:p.e.n]); err != nil {
				return err
			}
		}
		if err := b.write(ctx, s.exec); err != nil {
			return err
		}
		i += n
	}
	return nil
}

// dropPending empties the pending events without writing them.
func (s *Store) dropPending() {
	clear(s.pending)
	s.pending = s.pending[:0]
	s.blk.release()
}

// applyCreate inserts a document; for a repeated (tenant, request id) with
// the same body hash it returns the existing document instead. The INSERT
// runs first and the constraints report a reused id or request id, so the
// common case (a new document) costs one statement; the lookups run only
// after a constraint failure, which leaves nothing applied.
func (s *Store) applyCreate(ctx context.Context, d *docRow) (*store.DocumentRecord, error) {
	rec := d.rec
	_, err := s.exec(ctx, `INSERT INTO documents
		(id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time,
		 spool_path, result_path, result_content_type, dispatch_attempts, private, body)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, rec.Doc.GetId(), rec.Tenant, d.state, d.terminal, int64(d.rev), d.requestID, rec.BodyHash,
		d.createNs, d.updateNs, payloadColumn(spoolDir, rec.Doc.GetId(), rec.ContentPayload),
		payloadColumn(resultDir, rec.Doc.GetId(), rec.ResultPayload), rec.ResultContentType,
		rec.DispatchAttempts, rec.Private, d.body)
	if err == nil {
		return nil, nil
	}
	var se *sqlite.Error
	if !errors.As(err, &se) || (se.Code() != sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY && se.Code() != sqlite3.SQLITE_CONSTRAINT_UNIQUE) {
		return nil, fmt.Errorf("store: insert document %s: %w", rec.Doc.GetId(), err)
	}
	// The request id decides before the document id (a retry may reuse
	// both), as when the lookup ran first.
	if d.requestID.Valid {
		var id string
		var hash []byte
		err := s.queryRow(ctx, "SELECT id, body_hash FROM documents WHERE tenant = ? AND request_id = ?", rec.Tenant, d.requestID.String).Scan(&id, &hash)
		switch {
		case err == nil:
			if string(hash) != string(rec.BodyHash) {
				return nil, fmt.Errorf("%w: request id %q was used for document %s with a different body", store.ErrConflict, d.requestID.String, id)
			}
			return s.readDocumentTx(ctx, rec.Tenant, id)
		case !errors.Is(err, sql.ErrNoRows):
			return nil, fmt.Errorf("store: idempotency lookup: %w", err)
		}
	}
	if se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
		return nil, fmt.Errorf("%w: document id %s exists", store.ErrConflict, rec.Doc.GetId())
	}
	return nil, fmt.Errorf("store: insert document %s: %w", rec.Doc.GetId(), err)
}

func (s *Store) applyUpdate(ctx context.Context, d *docRow) error {
	rec := d.rec
	res, err := s.exec(ctx, `UPDATE documents SET state=?, terminal=?, rev=?, update_time=?,
		spool_path=?, result_path=?, result_content_type=?, dispatch_attempts=?, private=?, body=?
		WHERE id=? AND tenant=? AND rev=?`, d.state, d.terminal, int64(d.rev), d.updateNs,
		payloadColumn(spoolDir, rec.Doc.GetId(), rec.ContentPayload), payloadColumn(resultDir, rec.Doc.GetId(), rec.ResultPayload),
		rec.ResultContentType, rec.DispatchAttempts, rec.Private, d.body,
		rec.Doc.GetId(), rec.Tenant, int64(d.prevRev))
	if err != nil {
		return fmt.Errorf("store: update document %s: %w", rec.Doc.GetId(), err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	var rev int64
	err = s.queryRow(ctx, "SELECT rev FROM documents WHERE id = ? AND tenant = ?", rec.Doc.GetId(), rec.Tenant).Scan(&rev)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: document %s", store.ErrNotFound, rec.Doc.GetId())
	} else if err != nil {
		return fmt.Errorf("store: update document %s: %w", rec.Doc.GetId(), err)
	}
	return fmt.Errorf("%w: document %s is at rev %d, update expected %d", store.ErrStaleRev, rec.Doc.GetId(), rev, d.prevRev)
}

func (s *Store) applyClaim(ctx context.Context, c store.ClaimRecord) error {
	x := c.Claim
	var chunk sql.NullInt64
	if c.Chunk.Set {
		chunk = sql.NullInt64{Int64: c.Chunk.Index, Valid: true}
	}
	res, err := s.exec(ctx, `INSERT INTO claims
		(claim_id, tenant, doc_id, entity_id, scope_id, state, expire_time, create_time, redeem_time, chunk)
		VALUES (?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(claim_id) DO UPDATE SET doc_id=excluded.doc_id, entity_id=excluded.entity_id,
		scope_id=excluded.scope_id, expire_time=excluded.expire_time, create_time=excluded.create_time,
		`+store.ClaimStateUpsertSQL+`,
		chunk=coalesce(excluded.chunk, claims.chunk)
		WHERE claims.tenant = excluded.tenant`, x.GetClaimId(), c.Tenant, x.GetDocumentId(), x.GetEntityId(), x.GetScopeId(), int32(x.GetState()),
		tsNanos(x.GetExpireTime()), tsNanos(x.GetCreateTime()), tsNanos(x.GetRedeemTime()), chunk)
	if err != nil {
		return fmt.Errorf("store: upsert claim %s: %w", x.GetClaimId(), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: claim id %s belongs to another tenant", store.ErrConflict, x.GetClaimId())
	}
	return nil
}

func (s *Store) applyRedeem(ctx context.Context, rd *store.RedeemClaim) (*gatewayv1.ClaimCheck, error) {
	var state int32
	var expire int64
	err := s.queryRow(ctx, "SELECT state, expire_time FROM claims WHERE claim_id = ? AND tenant = ?", rd.ClaimID, rd.Tenant).Scan(&state, &expire)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: claim %s", store.ErrNotFound, rd.ClaimID)
	} else if err != nil {
		return nil, fmt.Errorf("store: redeem claim %s: %w", rd.ClaimID, err)
	}
	switch gatewayv1.ClaimCheck_ClaimState(state) {
	case gatewayv1.ClaimCheck_ISSUED:
	case gatewayv1.ClaimCheck_EXPIRED:
		return nil, fmt.Errorf("%w: claim %s", store.ErrClaimExpired, rd.ClaimID)
	case gatewayv1.ClaimCheck_CANCELLED:
		return nil, fmt.Errorf("%w: claim %s", store.ErrClaimCancelled, rd.ClaimID)
	default:
		return nil, fmt.Errorf("%w: claim %s", store.ErrClaimRedeemed, rd.ClaimID)
	}
	now := rd.Now
	if now.IsZero() {
		now = time.Now()
	}
	if expire <= now.UnixNano() {
		return nil, fmt.Errorf("%w: claim %s expired at %s", store.ErrClaimExpired, rd.ClaimID, fromNanos(expire).Format(time.RFC3339))
	}
	if _, err := s.exec(ctx, "UPDATE claims SET state = ?, redeem_time = ? WHERE claim_id = ?", int32(gatewayv1.ClaimCheck_REDEEMED), now.UnixNano(), rd.ClaimID); err != nil {
		return nil, fmt.Errorf("store: redeem claim %s: %w", rd.ClaimID, err)
	}
	row := s.queryRow(ctx, "SELECT "+claimCols+" FROM claims WHERE claim_id = ?", rd.ClaimID)
	c, err := scanClaim(row)
	if err != nil {
		return nil, err
	}
	return c.Claim, nil
}

// applyPayload upserts (or, with a nil Body, deletes) one inline payload.
func (s *Store) applyPayload(ctx context.Context, p store.PayloadRecord) error {
	if p.Body == nil {
		if _, err := s.exec(ctx, "DELETE FROM payloads WHERE doc_id = ? AND kind = ?", p.DocID, int32(p.Kind)); err != nil {
			return fmt.Errorf("store: delete payload %s/%d: %w", p.DocID, p.Kind, err)
		}
		return nil
	}
	if _, err := s.exec(ctx, `INSERT INTO payloads (doc_id, kind, body) VALUES (?,?,?)
		ON CONFLICT(doc_id, kind) DO UPDATE SET body=excluded.body`, p.DocID, int32(p.Kind), p.Body); err != nil {
		return fmt.Errorf("store: store payload %s/%d: %w", p.DocID, p.Kind, err)
	}
	return nil
}
