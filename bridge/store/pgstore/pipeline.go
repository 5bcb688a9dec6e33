package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
)

// The write statements of a Commit, shared by the pipelined and the
// step-by-step path.
const (
	insertDocSQL = `INSERT INTO documents
		(id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time,
		 content_payload, result_payload, result_content_type, dispatch_attempts, private, body,
		 owner, lease_epoch, lease_expires)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,
		 $16, 1, clock_timestamp() + make_interval(secs => $17)) ON CONFLICT DO NOTHING`
	updateDocSQL = `UPDATE documents SET state=$1, terminal=$2, rev=$3, update_time=$4,
		content_payload=$5, result_payload=$6, result_content_type=$7, dispatch_attempts=$8, private=$9, body=$10
		WHERE id=$11 AND tenant=$12 AND rev=$13`
	// fencedDocSQL also requires the lease this replica holds (lease.go).
	fencedDocSQL    = updateDocSQL + ` AND owner=$14 AND lease_epoch=$15`
	upsertEntitySQL = `INSERT INTO entities
		(doc_id, attempt, scope_id, scope_instance, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)
		ON CONFLICT (doc_id, attempt, scope_id, scope_instance, entity_id) DO UPDATE SET
		parent_id=excluded.parent_id, depth=excluded.depth, status=excluded.status,
		chunk_index=excluded.chunk_index, chunk_offset=excluded.chunk_offset, size=excluded.size,
		checksum=excluded.checksum, attempts=excluded.attempts, message=excluded.message`
	upsertDigestSQL = `INSERT INTO digests (doc_id, attempt, scope_id, scope_instance, body) VALUES ($1,$2,$3,$4,$5)
		ON CONFLICT (doc_id, attempt, scope_id, scope_instance) DO UPDATE SET body=excluded.body`
	upsertClaimSQL = `INSERT INTO claims
		(claim_id, tenant, doc_id, entity_id, scope_id, state, expire_time, create_time, redeem_time, chunk)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)
		ON CONFLICT (claim_id) DO UPDATE SET doc_id=excluded.doc_id, entity_id=excluded.entity_id,
		scope_id=excluded.scope_id, expire_time=excluded.expire_time, create_time=excluded.create_time,
		` + store.ClaimStateUpsertSQL + `,
		chunk=coalesce(excluded.chunk, claims.chunk)
		WHERE claims.tenant = excluded.tenant`
	upsertPayloadSQL = `INSERT INTO payloads (doc_id, kind, body) VALUES ($1,$2,$3)
		ON CONFLICT (doc_id, kind) DO UPDATE SET body=excluded.body`
	deletePayloadSQL = "DELETE FROM payloads WHERE doc_id = $1 AND kind = $2"
)

// insertDocArgs are the arguments of insertDocSQL for p's created
// document: the creating replica holds its lease (epoch 1).
func insertDocArgs(p *prepared) []any {
	d := p.create
	rec := d.rec
	return []any{rec.Doc.GetId(), rec.Tenant, d.state, d.terminal, d.rev, d.requestID, rec.BodyHash,
		d.createNs, d.updateNs, rec.ContentPayload, rec.ResultPayload, rec.ResultContentType,
		int64(rec.DispatchAttempts), rec.Private, d.body, p.owner, p.leaseSecs}
}

// updateDocStatement is the UPDATE of d at its expected rev, fenced by the
// lease when this replica holds d's (p.fence, set by leases.fence).
func updateDocStatement(p *prepared, d *docRow) (string, []any) {
	rec := d.rec
	args := []any{d.state, d.terminal, d.rev, d.updateNs, rec.ContentPayload, rec.ResultPayload,
		rec.ResultContentType, int64(rec.DispatchAttempts), rec.Private, d.body,
		rec.Doc.GetId(), rec.Tenant, d.prevRev}
	if epoch, fenced := p.fence[rec.Doc.GetId()]; fenced {
		return fencedDocSQL, append(args, p.owner, epoch)
	}
	return updateDocSQL, args
}

func entityArgs(e store.EntityRecord) []any {
	x := e.Entity
	return []any{e.DocID, int64(e.Attempt), int64(x.GetScopeId()), int64(e.ScopeInstance), int64(x.GetEntityId()),
		int64(x.GetParentId()), int64(x.GetDepth()), int32(x.GetStatus()), int64(x.GetChunkIndex()),
		int64(x.GetChunkOffset()), int64(x.GetSizeBytes()), x.GetChecksum(), int64(x.GetAttempts()), x.GetMessage()}
}

func digestArgs(d store.DigestRecord, body []byte) []any {
	return []any{d.DocID, int64(d.Attempt), int64(d.Digest.GetScopeId()), int64(d.ScopeInstance), body}
}

func claimArgs(c store.ClaimRecord) []any {
	x := c.Claim
	var chunk *int64
	if c.Chunk.Set {
		chunk = &c.Chunk.Index
	}
	return []any{x.GetClaimId(), c.Tenant, x.GetDocumentId(), int64(x.GetEntityId()),
		int64(x.GetScopeId()), int32(x.GetState()), tsNanos(x.GetExpireTime()), tsNanos(x.GetCreateTime()),
		tsNanos(x.GetRedeemTime()), chunk}
}

// errSlowPath rolls back a pipelined group whose outcome is not the plain
// one (a statement failed, a create found its id taken, an update found
// another rev, a claim another tenant's): commitGroup reruns the batch
// step by step, which names the outcome exactly, and the others without
// it.
var errSlowPath = errors.New("pgstore: pipelined commit needs the step-by-step path")

// pipelinable reports whether p can be sent in a pipeline: everything but
// a claim redemption, whose lookups depend on the UPDATE's outcome.
func pipelinable(p *prepared) bool { return p.b.Redeem == nil }

// runPipelined applies the batches ps in one transaction of two round
// trips: BEGIN and every statement in one pipeline (applyPipelined), then
// COMMIT. Anything but the plain outcome rolls back and is errSlowPath,
// with the index of the batch whose statement met it (-1: not one batch's);
// nothing of ps stays, also no seq. A connection left inside a
// transaction (ROLLBACK failed, ctx ended) is not reused: the pool destroys
// a released connection whose transaction status is not idle.
func (s *Store) runPipelined(ctx context.Context, ps []*prepared) ([]store.EventRecord, int, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, -1, mapErr("acquire a connection", err)
	}
	defer conn.Release()
	evs, failed, err := applyPipelined(ctx, conn.Conn(), ps)
	if err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_, _ = conn.Exec(rctx, "ROLLBACK")
			cancel()
		}
		return nil, failed, err
	}
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		return nil, -1, fmt.Errorf("pgstore: commit: %w", err)
	}
	if tag.String() != "COMMIT" {
		return nil, -1, fmt.Errorf("pgstore: commit: the server answered %q", tag.String())
	}
	return evs, -1, nil
}

// pipeline is a pgx.Batch with the check of each statement's outcome and
// the batch (index in the group) it belongs to.
type pipeline struct {
	batch pgx.Batch
	steps []pipelineStep
}

// pipelineStep checks one statement's outcome in the pipeline.
type pipelineStep struct {
	of    int // index of the group's batch; -1: the group's own statements
	check func(br pgx.BatchResults) error
}

// exec queues a statement of batch of; with wantRow it must change exactly
// one row.
func (pl *pipeline) exec(of int, wantRow bool, sql string, args ...any) {
	pl.batch.Queue(sql, args...)
	pl.steps = append(pl.steps, pipelineStep{of: of, check: func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil || (wantRow && tag.RowsAffected() != 1) {
			return errSlowPath
		}
		return nil
	}})
}

// applyPipelined sends BEGIN, the statements of every batch of ps in
// order and one event append for all their events, last, in one pgx.Batch
// (one round trip instead of one per statement) and checks each outcome in
// order. Anything but the plain outcome is errSlowPath with the index of
// the batch that met it; the transaction is left open for the caller to
// end.
func applyPipelined(ctx context.Context, conn *pgx.Conn, ps []*prepared) ([]store.EventRecord, int, error) {
	var pl pipeline
	pl.exec(-1, false, "BEGIN")
	rows, merged := collectGroupRows(ps)
	var events []encEvent
	for i, p := range ps {
		if !pl.queueBatch(i, p, !merged) {
			return nil, i, errSlowPath
		}
		events = append(events, p.events...)
	}
	if merged {
		rows.queue(&pl)
	}
	var last int64
	if len(events) > 0 {
		pl.batch.Queue(appendEventsSQL, appendEventsArgs(events)...)
		pl.steps = append(pl.steps, pipelineStep{of: -1, check: func(br pgx.BatchResults) error {
			var notified string
			if err := br.QueryRow().Scan(&last, &notified); err != nil {
				return errSlowPath
			}
			return nil
		}})
	}
	br := conn.SendBatch(ctx, &pl.batch)
	for _, step := range pl.steps {
		if err := step.check(br); err != nil {
			br.Close()
			return nil, step.of, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, -1, errSlowPath
	}
	if len(events) == 0 {
		return nil, -1, nil
	}
	evs, err := eventRecords(events, last)
	return evs, -1, err
}

// queueBatch queues the statements of p, batch i of the group, in field
// order (store.Batch); its entity and payload rows only with rows (else
// they go in the group's multi-row statements, grouprows.go). False: a
// digest does not encode (the step-by-step rerun of p reports it).
func (pl *pipeline) queueBatch(i int, p *prepared, rows bool) bool {
	if p.create != nil {
		pl.exec(i, true, insertDocSQL, insertDocArgs(p)...)
	}
	for j := range p.updates {
		sql, args := updateDocStatement(p, &p.updates[j])
		pl.exec(i, true, sql, args...)
	}
	if sql, args, n := childFenceStatement(p); n > 0 {
		pl.batch.Queue(sql, args...)
		pl.steps = append(pl.steps, pipelineStep{of: i, check: childFenceCheck(n)})
	}
	for _, e := range p.b.Entities {
		if rows {
			pl.exec(i, false, upsertEntitySQL, entityArgs(e)...)
		}
	}
	for _, d := range p.b.Digests {
		body, err := proto.Marshal(d.Digest)
		if err != nil {
			return false
		}
		pl.exec(i, false, upsertDigestSQL, digestArgs(d, body)...)
	}
	for _, c := range p.b.Claims {
		pl.exec(i, true, upsertClaimSQL, claimArgs(c)...)
	}
	for _, x := range p.b.Payloads {
		if !rows {
			break
		}
		if x.Body == nil {
			pl.exec(i, false, deletePayloadSQL, x.DocID, int32(x.Kind))
		} else {
			pl.exec(i, false, upsertPayloadSQL, x.DocID, int32(x.Kind), x.Body)
		}
	}
	return true
}
