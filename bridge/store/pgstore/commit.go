package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
)

// Commit applies b atomically in one PostgreSQL transaction (READ
// COMMITTED) and returns once it committed. Concurrent Commits of this
// Store share one transaction (group commit, group.go): BEGIN, every
// batch's statements and one event append for the group in one pipeline,
// then COMMIT; a batch that meets anything but the plain outcome is rerun
// alone step by step, which classifies the outcome, and the others are
// rerun without it. A claim redemption always runs step by step (its
// lookups depend on the UPDATE's outcome). On error nothing of b was
// applied, except when ctx ends first: then the outcome is unknown
// (idempotent creates make a retry safe). Events get their seqs last, from
// the one-row counter (package doc, Event sequence); the event hook has seen
// them when Commit returns. A lost or refused connection (a database
// restart) is store.ErrUnavailable.
func (s *Store) Commit(ctx context.Context, b *store.Batch) (store.CommitResult, error) {
	res, err := s.commit(ctx, b)
	return res, asUnavailable(err)
}

func (s *Store) commit(ctx context.Context, b *store.Batch) (store.CommitResult, error) {
	p, err := prepare(b)
	if err != nil {
		return store.CommitResult{}, err
	}
	if err := s.enter(); err != nil {
		return store.CommitResult{}, err
	}
	defer s.wg.Done()
	if err := s.lease.fence(p, time.Now()); err != nil {
		return store.CommitResult{}, err
	}
	s.batches.Add(1)
	if !pipelinable(p) {
		return s.applyStepwise(ctx, p)
	}
	return s.commitGrouped(ctx, p)
}

// apply runs the ops of one batch in field order (store.Batch).
func apply(ctx context.Context, tx pgx.Tx, p *prepared) (store.CommitResult, error) {
	var res store.CommitResult
	b := p.b
	if p.create != nil {
		dup, err := applyCreate(ctx, tx, p)
		if err != nil || dup != nil {
			res.Duplicate = dup
			return res, err
		}
	}
	if b.Redeem != nil {
		c, err := applyRedeem(ctx, tx, b.Redeem)
		if err != nil {
			return res, err
		}
		if err := notifyRedeemed(ctx, tx, p.owner, c.GetClaimId(), c.GetDocumentId()); err != nil {
			return res, err
		}
		res.Claim = c
	}
	for i := range p.updates {
		if err := applyUpdate(ctx, tx, p, &p.updates[i]); err != nil {
			return res, err
		}
	}
	if err := checkChildFence(ctx, tx, p); err != nil {
		return res, err
	}
	if err := applyEntities(ctx, tx, b.Entities); err != nil {
		return res, err
	}
	if err := applyDigests(ctx, tx, b.Digests); err != nil {
		return res, err
	}
	for _, c := range b.Claims {
		if err := applyClaim(ctx, tx, c); err != nil {
			return res, err
		}
	}
	for _, pl := range b.Payloads {
		if err := applyPayload(ctx, tx, pl); err != nil {
			return res, err
		}
	}
	return res, nil
}

// isUniqueViolation reports a foreign-key (23503) or unique (23505) error.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// applyCreate inserts a document with ON CONFLICT DO NOTHING: a concurrent
// insert of the same id or (tenant, request id) by another replica waits for
// that transaction and then reports the conflict as "no row" instead of
// aborting ours. The lookups that classify it run only then.
func applyCreate(ctx context.Context, tx pgx.Tx, p *prepared) (*store.DocumentRecord, error) {
	d := p.create
	rec := d.rec
	tag, err := tx.Exec(ctx, insertDocSQL, insertDocArgs(p)...)
	if err != nil {
		return nil, fmt.Errorf("pgstore: insert document %s: %w", rec.Doc.GetId(), err)
	}
	if tag.RowsAffected() == 1 {
		return nil, nil
	}
	// The request id decides before the document id (a retry reuses both).
	if d.requestID != nil {
		var id string
		var hash []byte
		err := tx.QueryRow(ctx, "SELECT id, body_hash FROM documents WHERE tenant = $1 AND request_id = $2",
			rec.Tenant, *d.requestID).Scan(&id, &hash)
		switch {
		case err == nil:
			if string(hash) != string(rec.BodyHash) {
				return nil, fmt.Errorf("%w: request id %q was used for document %s with a different body", store.ErrConflict, *d.requestID, id)
			}
			return readDocument(ctx, tx, rec.Tenant, id, false)
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, fmt.Errorf("pgstore: idempotency lookup: %w", err)
		}
	}
	return nil, fmt.Errorf("%w: document id %s exists", store.ErrConflict, rec.Doc.GetId())
}

func applyUpdate(ctx context.Context, tx pgx.Tx, p *prepared, d *docRow) error {
	rec := d.rec
	sql, args := updateDocStatement(p, d)
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("pgstore: update document %s: %w", rec.Doc.GetId(), err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	if epoch, fenced := p.fence[rec.Doc.GetId()]; fenced {
		if err := leaseLost(ctx, tx, rec.Doc.GetId(), rec.Tenant, p.owner, epoch); err != nil {
			return err
		}
	}
	var rev int64
	err = tx.QueryRow(ctx, "SELECT rev FROM documents WHERE id = $1 AND tenant = $2", rec.Doc.GetId(), rec.Tenant).Scan(&rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: document %s", store.ErrNotFound, rec.Doc.GetId())
	} else if err != nil {
		return fmt.Errorf("pgstore: update document %s: %w", rec.Doc.GetId(), err)
	}
	return fmt.Errorf("%w: document %s is at rev %d, update expected %d", store.ErrStaleRev, rec.Doc.GetId(), rev, d.prevRev)
}

func applyEntities(ctx context.Context, tx pgx.Tx, ents []store.EntityRecord) error {
	for _, e := range ents {
		x := e.Entity
		_, err := tx.Exec(ctx, upsertEntitySQL, entityArgs(e)...)
		if err != nil {
			return childErr(err, "upsert entity", fmt.Sprintf("%s/%d/%d", e.DocID, x.GetScopeId(), x.GetEntityId()))
		}
	}
	return nil
}

func applyDigests(ctx context.Context, tx pgx.Tx, digests []store.DigestRecord) error {
	for _, d := range digests {
		body, err := proto.Marshal(d.Digest)
		if err != nil {
			return fmt.Errorf("pgstore: encode digest: %w", err)
		}
		if _, err := tx.Exec(ctx, upsertDigestSQL, digestArgs(d, body)...); err != nil {
			return childErr(err, "upsert digest", fmt.Sprintf("%s/%d", d.DocID, d.Digest.GetScopeId()))
		}
	}
	return nil
}

// childErr wraps an error of a row that belongs to a document; a missing
// document (foreign key) is ErrNotFound.
func childErr(err error, what, key string) error {
	if sqlState(err) == "23503" {
		return fmt.Errorf("%w: %s %s: no such document: %v", store.ErrNotFound, what, key, err)
	}
	return fmt.Errorf("pgstore: %s %s: %w", what, key, err)
}

func applyClaim(ctx context.Context, tx pgx.Tx, c store.ClaimRecord) error {
	x := c.Claim
	tag, err := tx.Exec(ctx, upsertClaimSQL, claimArgs(c)...)
	if err != nil {
		return childErr(err, "upsert claim", x.GetClaimId())
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: claim id %s belongs to another tenant", store.ErrConflict, x.GetClaimId())
	}
	return nil
}

// applyRedeem redeems a claim with one conditional UPDATE: the row lock it
// takes makes a concurrent redemption (any replica) wait, and that one then
// re-checks state = ISSUED against the committed row and updates nothing,
// so exactly one redemption succeeds. The lookup that names the reason runs
// only when nothing was updated.
func applyRedeem(ctx context.Context, tx pgx.Tx, rd *store.RedeemClaim) (*gatewayv1.ClaimCheck, error) {
	now := rd.Now
	if now.IsZero() {
		now = time.Now()
	}
	c, err := scanClaim(tx.QueryRow(ctx, `UPDATE claims SET state = $1, redeem_time = $2
		WHERE claim_id = $3 AND tenant = $4 AND state = $5 AND expire_time > $2 RETURNING `+claimCols,
		int32(gatewayv1.ClaimCheck_REDEEMED), now.UnixNano(), rd.ClaimID, rd.Tenant, int32(gatewayv1.ClaimCheck_ISSUED)))
	if err == nil {
		return c.Claim, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgstore: redeem claim %s: %w", rd.ClaimID, err)
	}
	var state int32
	var expire int64
	err = tx.QueryRow(ctx, "SELECT state, expire_time FROM claims WHERE claim_id = $1 AND tenant = $2", rd.ClaimID, rd.Tenant).Scan(&state, &expire)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("%w: claim %s", store.ErrNotFound, rd.ClaimID)
	case err != nil:
		return nil, fmt.Errorf("pgstore: redeem claim %s: %w", rd.ClaimID, err)
	case gatewayv1.ClaimCheck_ClaimState(state) == gatewayv1.ClaimCheck_EXPIRED:
		return nil, fmt.Errorf("%w: claim %s", store.ErrClaimExpired, rd.ClaimID)
	case gatewayv1.ClaimCheck_ClaimState(state) == gatewayv1.ClaimCheck_CANCELLED:
		return nil, fmt.Errorf("%w: claim %s", store.ErrClaimCancelled, rd.ClaimID)
	case gatewayv1.ClaimCheck_ClaimState(state) != gatewayv1.ClaimCheck_ISSUED:
		return nil, fmt.Errorf("%w: claim %s", store.ErrClaimRedeemed, rd.ClaimID)
	}
	return nil, fmt.Errorf("%w: claim %s expired at %s", store.ErrClaimExpired, rd.ClaimID,
		time.Unix(0, expire).UTC().Format(time.RFC3339))
}

// applyPayload upserts (or, with a nil Body, deletes) one inline payload.
func applyPayload(ctx context.Context, tx pgx.Tx, p store.PayloadRecord) error {
	if p.Body == nil {
		if _, err := tx.Exec(ctx, deletePayloadSQL, p.DocID, int32(p.Kind)); err != nil {
			return fmt.Errorf("pgstore: delete payload %s/%d: %w", p.DocID, p.Kind, err)
		}
		return nil
	}
	if _, err := tx.Exec(ctx, upsertPayloadSQL, p.DocID, int32(p.Kind), p.Body); err != nil {
		return childErr(err, "store payload", p.DocID+"/"+strconv.Itoa(int(p.Kind)))
	}
	return nil
}

// appendEventsSQL takes the seqs, inserts the events as one block
// (schema migration 4, events.go), updates the counters and notifies, in
// ONE statement: the counter row's lock is held for this statement and the
// COMMIT only. $1 is the number of events, $2 the sum of their bodies
// without the seq field, $3.. the block's columns.
const appendEventsSQL = `WITH m AS (
	UPDATE meta SET last_seq = last_seq + $1, event_count = event_count + $1,
		event_bytes = event_bytes + $2 + (SELECT sum(pipestream_seq_field_len(g))
			FROM generate_series(last_seq + 1, last_seq + $1) g)
	WHERE id = 1 RETURNING last_seq),
ins AS (INSERT INTO event_blocks (first_seq, last_seq, times, kinds, tenants, doc_ids, revs, sinces, sizes, bodies)
	SELECT m.last_seq - $1 + 1, m.last_seq, $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[],
		$8::bigint[], $9::int[], $10::bytea[] FROM m)
SELECT last_seq, pg_notify('` + notifyChannel + `', last_seq::text) FROM m`

// appendEvents takes len(evs) seqs from the counter row and inserts the
// events, as the last statement of the transaction. The UPDATE of the
// counter row holds its row lock until COMMIT: an event-writing transaction
// of any replica that reaches this point waits for ours to commit, and then
// reads the counter we committed. So seqs are taken in commit order, and
// when seq n is visible every seq below n is already visible (package doc,
// Event sequence). The NOTIFY is delivered at commit, in commit order.
func appendEvents(ctx context.Context, tx pgx.Tx, evs []encEvent) ([]store.EventRecord, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	var last int64
	var notified string
	err := tx.QueryRow(ctx, appendEventsSQL, appendEventsArgs(evs)...).Scan(&last, &notified)
	if err != nil {
		return nil, fmt.Errorf("pgstore: append events: %w", err)
	}
	return eventRecords(evs, last)
}

// appendEventsArgs are the parameters of appendEventsSQL for evs.
func appendEventsArgs(evs []encEvent) []any {
	var cols eventColumns
	var bodies int64
	for i := range evs {
		cols.add(&evs[i])
		bodies += int64(evs[i].n)
	}
	return []any{int64(len(evs)), bodies, cols.time, cols.kind, cols.tenant, cols.doc, cols.rev, cols.since, cols.size, cols.body}
}

// eventRecords are evs with their seqs, last being the counter after them.
func eventRecords(evs []encEvent, last int64) ([]store.EventRecord, error) {
	if uint64(last) >= store.MaxSeq {
		return nil, fmt.Errorf("%w: last seq %d", store.ErrSeqExhausted, uint64(last)-uint64(len(evs)))
	}
	first := uint64(last) - uint64(len(evs)) + 1
	out := make([]store.EventRecord, len(evs))
	for i := range evs {
		e := &evs[i]
		seq := first + uint64(i)
		out[i] = store.EventRecord{Seq: seq, Time: time.Unix(0, e.timeNs).UTC(), Kind: e.kind, Tenant: e.tenant,
			DocID: e.doc, Rev: uint64(e.rev), Since: uint64(e.since), Body: e.withSeq(seq)}
	}
	return out, nil
}

// eventColumns are the events of one INSERT ... unnest, column by column
// (bodies without their seq field).
type eventColumns struct {
	time, rev, since  []int64
	kind, tenant, doc []string
	size              []int32
	body              [][]byte
}

func (c *eventColumns) add(e *encEvent) {
	c.time = append(c.time, e.timeNs)
	c.kind = append(c.kind, e.kind)
	c.tenant = append(c.tenant, e.tenant)
	c.doc = append(c.doc, e.doc)
	c.rev = append(c.rev, e.rev)
	c.since = append(c.since, e.since)
	c.size = append(c.size, int32(e.n))
	c.body = append(c.body, e.body[:e.n])
}

// PruneEvents deletes every event with seq < beforeSeq (last_seq is kept,
// so seqs never repeat) and reports what it removed. It locks the counter
// row first, like an event-writing commit, so the counts stay exact.
// Blocks wholly below beforeSeq are deleted; a block that straddles it is
// kept, and meta.floor_seq hides its earlier events (events.go).
func (s *Store) PruneEvents(ctx context.Context, beforeSeq uint64) (store.PruneResult, error) {
	if err := s.enter(); err != nil {
		return store.PruneResult{}, err
	}
	defer s.wg.Done()
	var res store.PruneResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var floor, last int64
		if err := tx.QueryRow(ctx, "SELECT floor_seq, last_seq FROM meta WHERE id = 1 FOR UPDATE").Scan(&floor, &last); err != nil {
			return fmt.Errorf("pgstore: prune: %w", err)
		}
		before := min(int64(min(beforeSeq, store.MaxSeq)), last+1)
		if before <= floor {
			return nil
		}
		var n, size int64
		if err := tx.QueryRow(ctx, pruneCountSQL, floor, before).Scan(&n, &size); err != nil {
			return fmt.Errorf("pgstore: prune: %w", err)
		}
		if _, err := tx.Exec(ctx, pruneDeleteSQL, before); err != nil {
			return fmt.Errorf("pgstore: prune: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE meta SET floor_seq = $3, event_count = event_count - $1,
			event_bytes = event_bytes - $2 WHERE id = 1`, n, size, before); err != nil {
			return fmt.Errorf("pgstore: prune: %w", err)
		}
		res = store.PruneResult{Removed: uint64(n), Bytes: uint64(size)}
		return nil
	})
	return res, err
}

// pruneDeleteSQL deletes the blocks wholly below $1. The condition on
// first_seq is implied by the one on last_seq (a block's first seq is at
// most its last), but it is the one the primary key can seek: on last_seq
// alone, which no index covers, every prune read every retained block to
// delete the few below the floor, 200,000 rows for 10
// (TestPruneScansOnlyThePrunedBlocks).
const pruneDeleteSQL = "DELETE FROM event_blocks WHERE first_seq < $1 AND last_seq < $1"

// pruneCountSQL counts the retained events in [$1, $2) and their encoded
// size (body and seq field), as the counters hold them.
const pruneCountSQL = `SELECT count(*), coalesce(sum(u.sz + pipestream_seq_field_len(b.first_seq + u.ord - 1)), 0)::bigint
	FROM event_blocks b, unnest(b.sizes) WITH ORDINALITY AS u(sz, ord)
	WHERE b.first_seq < $2 AND b.last_seq >= $1
		AND b.first_seq + u.ord - 1 >= $1 AND b.first_seq + u.ord - 1 < $2`
