package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// request is one queued unit of work for the writer: a Batch (encoded by
// the caller's goroutine) or a prune.
type request struct {
	b       *Batch
	create  *docRow
	updates []docRow
	events  []encEvent

	prune  bool
	before uint64

	res  CommitResult
	pres PruneResult
	err  error
	done chan struct{}
}

// docRow is a DocumentRecord with its columns extracted and its body encoded.
type docRow struct {
	rec                *DocumentRecord
	body               []byte
	state              int32
	terminal           bool
	rev, prevRev       uint64
	createNs, updateNs int64
	requestID          sql.NullString
}

// encEvent is an EventAppend encoded without its seq.
type encEvent struct {
	tenant, kind, doc string
	rev, since        uint64
	timeNs            int64
	body              []byte
}

const insertEvent = `INSERT INTO events (seq, time, kind, tenant, doc_id, rev, since, size, body)
	VALUES (?,?,?,?,?,?,?,?,?)`

// Fields of gatewayv1.Document kept in their own tables, stripped from the
// document body.
const (
	docFieldEntities    = 13
	docFieldDigests     = 14
	docFieldClaimChecks = 15
	eventFieldSeq       = 1
)

func encodeDoc(rec *DocumentRecord) (docRow, error) {
	if rec == nil || rec.Doc == nil {
		return docRow{}, fmt.Errorf("%w: document record without Doc", ErrInvalid)
	}
	d := rec.Doc
	if d.GetId() == "" || len(d.GetId()) > maxDocIDLen {
		return docRow{}, fmt.Errorf("%w: document id must be 1..%d bytes", ErrInvalid, maxDocIDLen)
	}
	if d.GetCreateTime() == nil {
		return docRow{}, fmt.Errorf("%w: document %s has no create_time", ErrInvalid, d.GetId())
	}
	full, err := proto.Marshal(d)
	if err != nil {
		return docRow{}, fmt.Errorf("store: encode document %s: %w", d.GetId(), err)
	}
	body, err := stripFields(full, docFieldEntities, docFieldDigests, docFieldClaimChecks)
	if err != nil {
		return docRow{}, err
	}
	r := docRow{
		rec: rec, body: body, state: int32(d.GetState()), terminal: IsTerminal(d.GetState()),
		rev: d.GetRev(), createNs: d.GetCreateTime().AsTime().UnixNano(),
	}
	r.updateNs = r.createNs
	if d.GetUpdateTime() != nil {
		r.updateNs = d.GetUpdateTime().AsTime().UnixNano()
	}
	if d.GetRequestId() != "" {
		r.requestID = sql.NullString{String: d.GetRequestId(), Valid: true}
	}
	return r, nil
}

// stripFields drops the given field numbers from an encoded message without
// decoding it (cheaper than a deep clone of the caller's message).
func stripFields(b []byte, drop ...protowire.Number) ([]byte, error) {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("store: re-encode document: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, fmt.Errorf("store: re-encode document: %w", protowire.ParseError(m))
		}
		keep := true
		for _, d := range drop {
			if num == d {
				keep = false
			}
		}
		if keep {
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return out, nil
}

func encodeEvent(e EventAppend) (encEvent, error) {
	ev := e.Event
	if ev == nil || ev.GetTime() == nil || ev.GetKind() == "" {
		return encEvent{}, fmt.Errorf("%w: event needs Time and Kind", ErrInvalid)
	}
	// Room for the seq field appended by the writer (tag + up to 8-byte varint
	// for seq < 2^53).
	body, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, proto.Size(ev)+10), ev)
	if err != nil {
		return encEvent{}, fmt.Errorf("store: encode event: %w", err)
	}
	return encEvent{
		tenant: e.Tenant, kind: ev.GetKind(), doc: ev.GetDocumentId(),
		rev: ev.GetRev(), since: ev.GetSince(), timeNs: ev.GetTime().AsTime().UnixNano(),
		body: body,
	}, nil
}

// prepare validates and encodes b in the caller's goroutine, so the writer
// only runs SQL.
func prepare(b *Batch) (*request, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil batch", ErrInvalid)
	}
	r := &request{b: b, done: make(chan struct{})}
	if b.Create != nil {
		row, err := encodeDoc(b.Create)
		if err != nil {
			return nil, err
		}
		r.create = &row
	}
	for _, u := range b.Updates {
		row, err := encodeDoc(u.Record)
		if err != nil {
			return nil, err
		}
		row.prevRev = u.PrevRev
		r.updates = append(r.updates, row)
	}
	for _, e := range b.Entities {
		if e.Entity == nil || e.DocID == "" {
			return nil, fmt.Errorf("%w: entity record needs DocID and Entity", ErrInvalid)
		}
	}
	for _, d := range b.Digests {
		if d.Digest == nil || d.DocID == "" {
			return nil, fmt.Errorf("%w: digest record needs DocID and Digest", ErrInvalid)
		}
	}
	for _, c := range b.Claims {
		if err := validClaim(c); err != nil {
			return nil, err
		}
	}
	if b.Redeem != nil {
		if _, err := strconv.ParseUint(b.Redeem.ClaimID, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: claim id %q is not a decimal uint64", ErrNotFound, b.Redeem.ClaimID)
		}
	}
	r.events = make([]encEvent, len(b.Events))
	for i, e := range b.Events {
		ee, err := encodeEvent(e)
		if err != nil {
			return nil, err
		}
		r.events[i] = ee
	}
	return r, nil
}

func validClaim(c ClaimRecord) error {
	if c.Claim == nil {
		return fmt.Errorf("%w: claim record without Claim", ErrInvalid)
	}
	if _, err := strconv.ParseUint(c.Claim.GetClaimId(), 10, 64); err != nil {
		return fmt.Errorf("%w: claim id %q is not a decimal uint64", ErrInvalid, c.Claim.GetClaimId())
	}
	if c.Claim.GetDocumentId() == "" || c.Claim.GetExpireTime() == nil {
		return fmt.Errorf("%w: claim %s needs document_id and expire_time", ErrInvalid, c.Claim.GetClaimId())
	}
	return nil
}

func (s *impl) commit(ctx context.Context, b *Batch) (CommitResult, error) {
	r, err := prepare(b)
	if err != nil {
		return CommitResult{}, err
	}
	if err := s.enqueue(ctx, r); err != nil {
		return CommitResult{}, err
	}
	return r.res, r.err
}

func (s *impl) prune(ctx context.Context, before uint64) (PruneResult, error) {
	r := &request{prune: true, before: before, done: make(chan struct{})}
	if err := s.enqueue(ctx, r); err != nil {
		return PruneResult{}, err
	}
	return r.pres, r.err
}

// enqueue hands r to the writer and waits for its outcome.
func (s *impl) enqueue(ctx context.Context, r *request) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.queue <- r:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("store: outcome unknown, the batch may still commit: %w", ctx.Err())
	}
}

// writer is the single writer goroutine: it takes the first queued request,
// drains what else is queued (bounded), and commits them in one transaction.
func (s *impl) writer() {
	defer close(s.done)
	group := make([]*request, 0, s.opts.MaxGroupBatches)
	for first := range s.queue {
		group = append(group[:0], first)
		var timer <-chan time.Time
		if s.opts.MaxGroupDelay > 0 {
			timer = time.After(s.opts.MaxGroupDelay)
		}
	drain:
		for len(group) < s.opts.MaxGroupBatches {
			if timer == nil {
				select {
				case r, ok := <-s.queue:
					if !ok {
						break drain
					}
					group = append(group, r)
				default:
					break drain
				}
			} else {
				select {
				case r, ok := <-s.queue:
					if !ok {
						break drain
					}
					group = append(group, r)
				case <-timer:
					break drain
				}
			}
		}
		s.runGroup(group)
		clear(group)
	}
}

// txState is the meta row set, carried through a group transaction.
type txState struct {
	lastSeq, count, bytes uint64
}

// runGroup commits reqs in one transaction, each batch in a savepoint.
func (s *impl) runGroup(reqs []*request) {
	start := time.Now()
	ctx := context.Background()
	finish := func(err error) {
		for _, r := range reqs {
			if err != nil && r.err == nil {
				r.err = err
				r.res = CommitResult{}
			}
			close(r.done)
		}
	}
	if _, err := s.exec(ctx, "BEGIN IMMEDIATE"); err != nil {
		finish(fmt.Errorf("store: begin: %w", err))
		return
	}
	st, err := s.readMeta(ctx)
	if err != nil {
		s.rollback()
		finish(err)
		return
	}
	before := st
	var published []EventRecord
	for _, r := range reqs {
		if _, err := s.exec(ctx, "SAVEPOINT b"); err != nil {
			s.rollback()
			finish(fmt.Errorf("store: savepoint: %w", err))
			return
		}
		saved := st
		if r.prune {
			r.err = s.applyPrune(ctx, r, &st)
		} else {
			r.err = s.apply(ctx, r, &st)
		}
		if r.err != nil {
			st = saved
			r.res = CommitResult{}
			if _, err := s.exec(ctx, "ROLLBACK TO b"); err != nil {
				s.rollback()
				finish(fmt.Errorf("store: rollback to savepoint: %w", err))
				return
			}
		}
		if _, err := s.exec(ctx, "RELEASE b"); err != nil {
			s.rollback()
			finish(fmt.Errorf("store: release savepoint: %w", err))
			return
		}
		if r.err == nil && len(r.res.Seqs) > 0 {
			for i, e := range r.events {
				published = append(published, EventRecord{
					Seq: r.res.Seqs[i], Time: fromNanos(e.timeNs), Kind: e.kind, Tenant: e.tenant,
					DocID: e.doc, Rev: e.rev, Since: e.since, Body: e.body,
				})
			}
		}
	}
	if st != before {
		if _, err := s.exec(ctx, `UPDATE meta SET value = CASE key
			WHEN 'last_seq' THEN ?1 WHEN 'event_count' THEN ?2 WHEN 'event_bytes' THEN ?3 ELSE value END`, int64(st.lastSeq), int64(st.count), int64(st.bytes)); err != nil {
			s.rollback()
			finish(fmt.Errorf("store: update meta: %w", err))
			return
		}
	}
	if _, err := s.exec(ctx, "COMMIT"); err != nil {
		s.rollback()
		finish(fmt.Errorf("store: commit: %w", err))
		return
	}
	s.lastSeq.Store(st.lastSeq)
	s.txns.Add(1)
	s.batches.Add(uint64(len(reqs)))
	s.met.observe(len(reqs), time.Since(start))
	if fn := s.hook.Load(); fn != nil && len(published) > 0 {
		(*fn)(published)
	}
	finish(nil)
}

func (s *impl) rollback() {
	if _, err := s.wconn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		s.log.Error("store: rollback failed", "err", err)
	}
}

func (s *impl) readMeta(ctx context.Context) (txState, error) {
	rows, err := s.query(ctx, "SELECT key, value FROM meta")
	if err != nil {
		return txState{}, fmt.Errorf("store: read meta: %w", err)
	}
	defer rows.Close()
	var st txState
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return txState{}, fmt.Errorf("store: read meta: %w", err)
		}
		switch k {
		case "last_seq":
			st.lastSeq = uint64(v)
		case "event_count":
			st.count = uint64(v)
		case "event_bytes":
			st.bytes = uint64(v)
		}
	}
	return st, rows.Err()
}

// prep returns the writer connection's prepared statement for q (cached).
// Writer goroutine only.
func (s *impl) prep(ctx context.Context, q string) (*sql.Stmt, error) {
	if st, ok := s.stmts[q]; ok {
		return st, nil
	}
	st, err := s.wconn.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	s.stmts[q] = st
	return st, nil
}

// exec, query and queryRow run q on the writer connection through its
// prepared statement; if preparing fails they run it unprepared so that the
// error surfaces from the call itself.
func (s *impl) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	st, err := s.prep(ctx, q)
	if err != nil {
		return s.wconn.ExecContext(ctx, q, args...)
	}
	return st.ExecContext(ctx, args...)
}

func (s *impl) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	st, err := s.prep(ctx, q)
	if err != nil {
		return s.wconn.QueryContext(ctx, q, args...)
	}
	return st.QueryContext(ctx, args...)
}

func (s *impl) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	st, err := s.prep(ctx, q)
	if err != nil {
		return s.wconn.QueryRowContext(ctx, q, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

// apply runs one batch inside the current savepoint.
func (s *impl) apply(ctx context.Context, r *request, st *txState) error {
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
			(doc_id, scope_id, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message)
			VALUES (?,?,?,?,?,?,?,?,?,?,?,?)
			ON CONFLICT(doc_id, scope_id, entity_id) DO UPDATE SET
			parent_id=excluded.parent_id, depth=excluded.depth, status=excluded.status,
			chunk_index=excluded.chunk_index, chunk_offset=excluded.chunk_offset, size=excluded.size,
			checksum=excluded.checksum, attempts=excluded.attempts, message=excluded.message`, e.DocID, x.GetScopeId(), x.GetEntityId(), x.GetParentId(), x.GetDepth(), int32(x.GetStatus()),
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
		if _, err := s.exec(ctx, `INSERT INTO digests (doc_id, scope_id, body) VALUES (?,?,?)
			ON CONFLICT(doc_id, scope_id) DO UPDATE SET body=excluded.body`, d.DocID, d.Digest.GetScopeId(), body); err != nil {
			return fmt.Errorf("store: upsert digest %s/%d: %w", d.DocID, d.Digest.GetScopeId(), err)
		}
	}
	for _, c := range b.Claims {
		if err := s.applyClaim(ctx, c); err != nil {
			return err
		}
	}
	if len(r.events) > 0 {
		r.res.Seqs = make([]uint64, len(r.events))
		for i := range r.events {
			e := &r.events[i]
			seq := st.lastSeq + 1
			if seq >= MaxSeq {
				return fmt.Errorf("%w: last seq %d", ErrSeqExhausted, st.lastSeq)
			}
			e.body = protowire.AppendVarint(protowire.AppendTag(e.body, eventFieldSeq, protowire.VarintType), seq)
			if _, err := s.exec(ctx, insertEvent, int64(seq), e.timeNs, e.kind, e.tenant, e.doc,
				int64(e.rev), int64(e.since), len(e.body), e.body); err != nil {
				return fmt.Errorf("store: append event: %w", err)
			}
			st.lastSeq = seq
			st.count++
			st.bytes += uint64(len(e.body))
			r.res.Seqs[i] = seq
		}
	}
	return nil
}

// applyCreate inserts a document; for a repeated (tenant, request id) with
// the same body hash it returns the existing document instead.
func (s *impl) applyCreate(ctx context.Context, d *docRow) (*DocumentRecord, error) {
	rec := d.rec
	if d.requestID.Valid {
		var id string
		var hash []byte
		err := s.queryRow(ctx, "SELECT id, body_hash FROM documents WHERE tenant = ? AND request_id = ?", rec.Tenant, d.requestID.String).Scan(&id, &hash)
		switch {
		case err == nil:
			if string(hash) != string(rec.BodyHash) {
				return nil, fmt.Errorf("%w: request id %q was used for document %s with a different body", ErrConflict, d.requestID.String, id)
			}
			return s.readDocumentTx(ctx, rec.Tenant, id)
		case !errors.Is(err, sql.ErrNoRows):
			return nil, fmt.Errorf("store: idempotency lookup: %w", err)
		}
	}
	var one int
	err := s.queryRow(ctx, "SELECT 1 FROM documents WHERE id = ?", rec.Doc.GetId()).Scan(&one)
	if err == nil {
		return nil, fmt.Errorf("%w: document id %s exists", ErrConflict, rec.Doc.GetId())
	} else if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: document lookup: %w", err)
	}
	if _, err := s.exec(ctx, `INSERT INTO documents
		(id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time,
		 spool_path, result_path, result_content_type, dispatch_attempts, private, body)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, rec.Doc.GetId(), rec.Tenant, d.state, d.terminal, int64(d.rev), d.requestID, rec.BodyHash,
		d.createNs, d.updateNs, rec.SpoolPath, rec.ResultPath, rec.ResultContentType,
		rec.DispatchAttempts, rec.Private, d.body); err != nil {
		return nil, fmt.Errorf("store: insert document %s: %w", rec.Doc.GetId(), err)
	}
	return nil, nil
}

func (s *impl) applyUpdate(ctx context.Context, d *docRow) error {
	rec := d.rec
	res, err := s.exec(ctx, `UPDATE documents SET state=?, terminal=?, rev=?, update_time=?,
		spool_path=?, result_path=?, result_content_type=?, dispatch_attempts=?, private=?, body=?
		WHERE id=? AND tenant=? AND rev=?`, d.state, d.terminal, int64(d.rev), d.updateNs, rec.SpoolPath, rec.ResultPath,
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
		return fmt.Errorf("%w: document %s", ErrNotFound, rec.Doc.GetId())
	} else if err != nil {
		return fmt.Errorf("store: update document %s: %w", rec.Doc.GetId(), err)
	}
	return fmt.Errorf("%w: document %s is at rev %d, update expected %d", ErrStaleRev, rec.Doc.GetId(), rev, d.prevRev)
}

func (s *impl) applyClaim(ctx context.Context, c ClaimRecord) error {
	x := c.Claim
	res, err := s.exec(ctx, `INSERT INTO claims
		(claim_id, tenant, doc_id, entity_id, scope_id, state, expire_time, create_time, redeem_time)
		VALUES (?,?,?,?,?,?,?,?,?)
		ON CONFLICT(claim_id) DO UPDATE SET doc_id=excluded.doc_id, entity_id=excluded.entity_id,
		scope_id=excluded.scope_id, state=excluded.state, expire_time=excluded.expire_time,
		create_time=excluded.create_time, redeem_time=excluded.redeem_time
		WHERE claims.tenant = excluded.tenant`, x.GetClaimId(), c.Tenant, x.GetDocumentId(), x.GetEntityId(), x.GetScopeId(), int32(x.GetState()),
		tsNanos(x.GetExpireTime()), tsNanos(x.GetCreateTime()), tsNanos(x.GetRedeemTime()))
	if err != nil {
		return fmt.Errorf("store: upsert claim %s: %w", x.GetClaimId(), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: claim id %s belongs to another tenant", ErrConflict, x.GetClaimId())
	}
	return nil
}

func (s *impl) applyRedeem(ctx context.Context, rd *RedeemClaim) (*gatewayv1.ClaimCheck, error) {
	var state int32
	var expire int64
	err := s.queryRow(ctx, "SELECT state, expire_time FROM claims WHERE claim_id = ? AND tenant = ?", rd.ClaimID, rd.Tenant).Scan(&state, &expire)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: claim %s", ErrNotFound, rd.ClaimID)
	} else if err != nil {
		return nil, fmt.Errorf("store: redeem claim %s: %w", rd.ClaimID, err)
	}
	switch gatewayv1.ClaimCheck_ClaimState(state) {
	case gatewayv1.ClaimCheck_ISSUED:
	case gatewayv1.ClaimCheck_EXPIRED:
		return nil, fmt.Errorf("%w: claim %s", ErrClaimExpired, rd.ClaimID)
	default:
		return nil, fmt.Errorf("%w: claim %s", ErrClaimRedeemed, rd.ClaimID)
	}
	now := rd.Now
	if now.IsZero() {
		now = time.Now()
	}
	if expire <= now.UnixNano() {
		return nil, fmt.Errorf("%w: claim %s expired at %s", ErrClaimExpired, rd.ClaimID, fromNanos(expire).Format(time.RFC3339))
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

func (s *impl) applyPrune(ctx context.Context, r *request, st *txState) error {
	var n, size int64
	if err := s.queryRow(ctx, "SELECT count(*), coalesce(sum(size), 0) FROM events WHERE seq < ?", int64(min(r.before, MaxSeq))).Scan(&n, &size); err != nil {
		return fmt.Errorf("store: prune: %w", err)
	}
	if n == 0 {
		return nil
	}
	if _, err := s.exec(ctx, "DELETE FROM events WHERE seq < ?", int64(min(r.before, MaxSeq))); err != nil {
		return fmt.Errorf("store: prune: %w", err)
	}
	r.pres = PruneResult{Removed: uint64(n), Bytes: uint64(size)}
	st.count -= uint64(n)
	st.bytes -= uint64(size)
	return nil
}
