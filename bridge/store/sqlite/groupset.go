package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pipestream/gateway/bridge/store"
)

// The set path: a group whose batches only create and update documents,
// upsert entities and put or delete inline payloads (the whole life of a
// small document) is written with one multi-row statement per table for
// the whole group instead of one statement per row. Rows that the group
// writes more than once are merged first (a document created and updated,
// or updated twice, is written once with its last values; a payload put
// and then deleted is only deleted), so the tables end exactly as if each
// batch had run in turn. Anything the merge cannot prove equal to running
// the batches in turn (a create of an id the group already touched, an
// update whose expected revision is not the group's previous one for that
// document, another tenant) makes planGroup decline, and the group runs
// batch by batch as before. A statement failing on the set path (a
// constraint, a stale revision) fails the run with errBatchFailed, so the
// group reruns with a savepoint per batch and the failing batch gets its
// own error (runGroup).

// errSetDeclined: the set path applied nothing; run the group batch by batch.
var errSetDeclined = errors.New("store: the group runs batch by batch")

// setDoc is one document row the group writes: an INSERT (created) or an
// UPDATE expecting prevRev, with the values of the last batch that changed
// it.
type setDoc struct {
	row     docRow // values to write (the last change of the group)
	created bool   // the group creates it: INSERT with the creation's identity
	ident   *docRow
	prevRev uint64 // an update's expected stored revision
}

// payKey names one inline payload row.
type payKey struct {
	doc  string
	kind store.PayloadKind
}

// groupPlan is what the set path writes for a group, in the order it
// writes it.
type groupPlan struct {
	inserts  []*setDoc
	updates  []*setDoc
	entities []store.EntityRecord
	puts     []store.PayloadRecord
	dels     []payKey
}

// planGroup merges the rows of reqs for the set path, or reports false if
// the group must run batch by batch.
func planGroup(reqs []*request) (*groupPlan, bool) {
	docs := make(map[string]*setDoc, len(reqs))
	refs := make(map[string]bool) // doc ids written by an entity or payload so far
	var order []*setDoc
	pays := make(map[payKey]int) // index into payOps
	var payOps []store.PayloadRecord
	p := &groupPlan{}
	for _, r := range reqs {
		b := r.b
		if r.prune || b.Redeem != nil || len(b.Claims) > 0 || len(b.Digests) > 0 {
			return nil, false
		}
		if r.create != nil {
			id := r.create.rec.Doc.GetId()
			if docs[id] != nil || refs[id] {
				return nil, false // the batch order decides; let it
			}
			d := &setDoc{row: *r.create, created: true, ident: r.create}
			docs[id] = d
			order = append(order, d)
		}
		for i := range r.updates {
			u := &r.updates[i]
			id := u.rec.Doc.GetId()
			d := docs[id]
			if d == nil {
				d = &setDoc{row: *u, prevRev: u.prevRev}
				docs[id] = d
				order = append(order, d)
				continue
			}
			if d.row.rec.Tenant != u.rec.Tenant || d.row.rev != u.prevRev {
				return nil, false // would fail in turn: let the savepoint run say why
			}
			d.row = *u
		}
		for _, e := range b.Entities {
			refs[e.DocID] = true
			p.entities = append(p.entities, e)
		}
		for _, pr := range b.Payloads {
			refs[pr.DocID] = true
			k := payKey{pr.DocID, pr.Kind}
			if i, ok := pays[k]; ok {
				payOps[i] = pr
				continue
			}
			pays[k] = len(payOps)
			payOps = append(payOps, pr)
		}
	}
	for _, d := range order {
		if d.created {
			p.inserts = append(p.inserts, d)
		} else {
			p.updates = append(p.updates, d)
		}
	}
	for _, pr := range payOps {
		if pr.Body == nil {
			p.dels = append(p.dels, payKey{pr.DocID, pr.Kind})
		} else {
			p.puts = append(p.puts, pr)
		}
	}
	return p, true
}

// applySet writes plan inside the open transaction and assigns the
// events' seqs of every request. Any error leaves the transaction to be
// rolled back by the caller.
//
// The documents' INSERT runs first: if it fails (a create repeating a
// request id or a document id, which is how applyCreate finds duplicates),
// SQLite has backed out that statement alone and nothing of the group is
// applied, so applySet returns errSetDeclined and the caller runs the
// group batch by batch in the same transaction, as if planGroup had
// declined (a duplicate create does not rerun its group).
func (s *Store) applySet(ctx context.Context, reqs []*request, p *groupPlan, st *txState) error {
	if err := s.insertDocs(ctx, p.inserts); err != nil {
		return err
	}
	if err := s.updateDocs(ctx, p.updates); err != nil {
		return err
	}
	if err := s.upsertEntities(ctx, p.entities); err != nil {
		return err
	}
	if err := s.deletePayloads(ctx, p.dels); err != nil {
		return err
	}
	if err := s.putPayloads(ctx, p.puts); err != nil {
		return err
	}
	for _, r := range reqs {
		if err := s.assignSeqs(r, st); err != nil {
			return err
		}
	}
	return nil
}

// chunks calls fn for consecutive runs of at most maxRowsPerStmt of n rows.
func chunks(n int, fn func(lo, hi int) error) error {
	for lo := 0; lo < n; lo += maxRowsPerStmt {
		if err := fn(lo, min(n, lo+maxRowsPerStmt)); err != nil {
			return err
		}
	}
	return nil
}

// execRows runs q's text for n rows with args, then clears args (so the
// reused slice keeps no payload alive).
func (s *Store) execRows(ctx context.Context, q *rowsQuery, n int, args []any) (int64, error) {
	res, err := s.exec(ctx, q.text(n), args...)
	clear(args)
	s.args = args[:0]
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *Store) insertDocs(ctx context.Context, ds []*setDoc) error {
	return chunks(len(ds), func(lo, hi int) error {
		args := s.args[:0]
		for _, d := range ds[lo:hi] {
			id, v := d.ident, &d.row
			rec := v.rec
			args = append(args, id.rec.Doc.GetId(), id.rec.Tenant, v.state, v.terminal, int64(v.rev), id.requestID, id.rec.BodyHash,
				id.createNs, v.updateNs, payloadColumn(spoolDir, id.rec.Doc.GetId(), rec.ContentPayload),
				payloadColumn(resultDir, id.rec.Doc.GetId(), rec.ResultPayload), rec.ResultContentType,
				rec.DispatchAttempts, rec.Private, v.body)
		}
		if _, err := s.execRows(ctx, &insertDocsQ, hi-lo, args); err != nil {
			if lo == 0 { // the first statement of the set path: nothing applied
				return fmt.Errorf("%w: insert %d documents: %w", errSetDeclined, hi-lo, err)
			}
			return fmt.Errorf("store: insert %d documents: %w", hi-lo, err)
		}
		return nil
	})
}

func (s *Store) updateDocs(ctx context.Context, ds []*setDoc) error {
	return chunks(len(ds), func(lo, hi int) error {
		args := s.args[:0]
		for _, d := range ds[lo:hi] {
			v := &d.row
			rec := v.rec
			args = append(args, rec.Doc.GetId(), rec.Tenant, int64(d.prevRev), v.state, v.terminal, int64(v.rev), v.updateNs,
				payloadColumn(spoolDir, rec.Doc.GetId(), rec.ContentPayload), payloadColumn(resultDir, rec.Doc.GetId(), rec.ResultPayload),
				rec.ResultContentType, rec.DispatchAttempts, rec.Private, v.body)
		}
		n, err := s.execRows(ctx, &updateDocsQ, hi-lo, args)
		if err != nil {
			return fmt.Errorf("store: update %d documents: %w", hi-lo, err)
		}
		if n != int64(hi-lo) {
			return fmt.Errorf("store: update %d documents: %d matched their revision", hi-lo, n)
		}
		return nil
	})
}

func (s *Store) upsertEntities(ctx context.Context, es []store.EntityRecord) error {
	return chunks(len(es), func(lo, hi int) error {
		args := s.args[:0]
		for _, e := range es[lo:hi] {
			x := e.Entity
			args = append(args, e.DocID, e.Attempt, x.GetScopeId(), e.ScopeInstance, x.GetEntityId(), x.GetParentId(), x.GetDepth(), int32(x.GetStatus()),
				x.GetChunkIndex(), int64(x.GetChunkOffset()), int64(x.GetSizeBytes()), x.GetChecksum(),
				x.GetAttempts(), x.GetMessage())
		}
		if _, err := s.execRows(ctx, &upsertEntitiesQ, hi-lo, args); err != nil {
			return fmt.Errorf("store: upsert %d entities: %w", hi-lo, err)
		}
		return nil
	})
}

func (s *Store) deletePayloads(ctx context.Context, ks []payKey) error {
	return chunks(len(ks), func(lo, hi int) error {
		args := s.args[:0]
		for _, k := range ks[lo:hi] {
			args = append(args, k.doc, int32(k.kind))
		}
		if _, err := s.execRows(ctx, &deletePayloadsQ, hi-lo, args); err != nil {
			return fmt.Errorf("store: delete %d payloads: %w", hi-lo, err)
		}
		return nil
	})
}

func (s *Store) putPayloads(ctx context.Context, ps []store.PayloadRecord) error {
	return chunks(len(ps), func(lo, hi int) error {
		args := s.args[:0]
		for _, p := range ps[lo:hi] {
			args = append(args, p.DocID, int32(p.Kind), p.Body)
		}
		if _, err := s.execRows(ctx, &putPayloadsQ, hi-lo, args); err != nil {
			return fmt.Errorf("store: store %d payloads: %w", hi-lo, err)
		}
		return nil
	})
}

// rowsQuery is a statement over 1..maxRowsPerStmt rows: prefix, the row
// template repeated with sep, suffix. The texts are built once, so each
// row count is one cached prepared statement of the writer.
type rowsQuery struct {
	texts [maxRowsPerStmt + 1]string
}

func newRowsQuery(prefix, row, sep, suffix string) rowsQuery {
	var q rowsQuery
	var b strings.Builder
	b.WriteString(prefix)
	for i := 1; i <= maxRowsPerStmt; i++ {
		if i > 1 {
			b.WriteString(sep)
		}
		b.WriteString(row)
		q.texts[i] = b.String() + suffix
	}
	return q
}

func (q *rowsQuery) text(n int) string { return q.texts[n] }

var (
	insertDocsQ = newRowsQuery(`INSERT INTO documents
		(id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time,
		 spool_path, result_path, result_content_type, dispatch_attempts, private, body) VALUES `,
		"(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", ",", "")
	// The VALUES rows are (id, tenant, expected rev, then the new values);
	// UPDATE ... FROM touches each document at most once (planGroup merged
	// repeated ones), so RowsAffected counts the documents whose revision
	// matched.
	updateDocsQ = newRowsQuery(`UPDATE documents SET state=v.column4, terminal=v.column5, rev=v.column6, update_time=v.column7,
		spool_path=v.column8, result_path=v.column9, result_content_type=v.column10, dispatch_attempts=v.column11,
		private=v.column12, body=v.column13 FROM (VALUES `, "(?,?,?,?,?,?,?,?,?,?,?,?,?)", ",",
		`) AS v WHERE documents.id = v.column1 AND documents.tenant = v.column2 AND documents.rev = v.column3`)
	upsertEntitiesQ = newRowsQuery(`INSERT INTO entities
		(doc_id, attempt, scope_id, scope_instance, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message)
		VALUES `, "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)", ",", `
		ON CONFLICT(doc_id, attempt, scope_id, scope_instance, entity_id) DO UPDATE SET
		parent_id=excluded.parent_id, depth=excluded.depth, status=excluded.status,
		chunk_index=excluded.chunk_index, chunk_offset=excluded.chunk_offset, size=excluded.size,
		checksum=excluded.checksum, attempts=excluded.attempts, message=excluded.message`)
	deletePayloadsQ = newRowsQuery("DELETE FROM payloads WHERE (doc_id, kind) IN (VALUES ", "(?,?)", ",", ")")
	putPayloadsQ    = newRowsQuery("INSERT INTO payloads (doc_id, kind, body) VALUES ", "(?,?,?)", ",",
		" ON CONFLICT(doc_id, kind) DO UPDATE SET body=excluded.body")
)
