package pgstore

import (
	"strings"

	"github.com/pipestream/gateway/bridge/store"
)

// Multi-row statements of a group (pipeline.go): the entity upserts and
// the inline payload writes of all its batches go as one statement each
// (INSERT ... SELECT FROM unnest, DELETE ... USING unnest) instead of one
// per row, after every batch's document, digest and claim statements.
// Only when no key repeats in the group (then the rows commute and one
// statement cannot touch a row twice, which ON CONFLICT DO UPDATE
// refuses) and no row belongs to a document that a later batch of the
// group creates (moved after that create it would succeed where, in queue
// order, it fails). Otherwise each batch sends its own rows in field order. These
// statements have no per-row outcome to check: a failure (a missing
// document) cannot be pinned on one batch, and the group's batches are
// rerun one by one (commitGroup).

// upsertEntitiesSQL is upsertEntitySQL for the columns $1..$14 as arrays.
var upsertEntitiesSQL = `INSERT INTO entities
		(doc_id, attempt, scope_id, scope_instance, entity_id, parent_id, depth, status, chunk_index, chunk_offset, size, checksum, attempts, message)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[],
		$8::int[], $9::bigint[], $10::bigint[], $11::bigint[], $12::text[], $13::bigint[], $14::text[])
		ON CONFLICT` + strings.SplitN(upsertEntitySQL, "ON CONFLICT", 2)[1]

// upsertPayloadsSQL writes the group's inline payloads. Their bodies come
// as one bytea ($3), each row a substring of it (1-based offset $4, length
// $5), not as a bytea[]: pgx encodes an array element by element into a
// parameter buffer that starts at 256 octets and grows by about a quarter
// each time it is full, so a group of N 4 KiB bodies reallocated and
// copied the whole buffer N times, quadratic in the group (runtime.growslice
// was ~10% of the PostgreSQL gateway's CPU per small document,
// docs/performance.md "Session 20"). One bytea is appended in one step.
const (
	upsertPayloadsSQL = `INSERT INTO payloads (doc_id, kind, body)
		SELECT d, k, substring($3::bytea FROM o FOR n) FROM unnest($1::text[], $2::int[], $4::int[], $5::int[]) AS t(d, k, o, n)
		ON CONFLICT (doc_id, kind) DO UPDATE SET body=excluded.body`
	deletePayloadsSQL = `DELETE FROM payloads p USING unnest($1::text[], $2::int[]) AS k(doc_id, kind)
		WHERE p.doc_id = k.doc_id AND p.kind = k.kind`
)

// groupRows are the entity and payload rows of a group, column by column.
type groupRows struct {
	ents       [14][]any
	nEnts      int
	putDoc     []string
	putKind    []int32
	putBody    [][]byte
	putBytes   int64 // the sum of putBody's lengths
	delDoc     []string
	delKind    []int32
	entityKeys map[entityKey]bool
	payKeys    map[payloadKey]bool
}

type entityKey struct {
	doc                                  string
	attempt, scope, scopeInstance, ident uint64
}

type payloadKey struct {
	doc  string
	kind store.PayloadKind
}

// collectGroupRows gathers the entity and payload rows of ps; false when a
// key repeats or a row belongs to a document a later batch of the group
// creates (the batches then send their own rows, in queue order, so such a
// row fails as it would alone).
func collectGroupRows(ps []*prepared) (*groupRows, bool) {
	g := &groupRows{entityKeys: map[entityKey]bool{}, payKeys: map[payloadKey]bool{}}
	created := map[string]int{}
	for i, p := range ps {
		if p.create != nil {
			created[p.create.rec.Doc.GetId()] = i
		}
	}
	later := func(i int, doc string) bool {
		j, ok := created[doc]
		return ok && j > i
	}
	for i, p := range ps {
		for _, e := range p.b.Entities {
			if later(i, e.DocID) {
				return nil, false
			}
			k := entityKey{e.DocID, uint64(e.Attempt), uint64(e.Entity.GetScopeId()), uint64(e.ScopeInstance), uint64(e.Entity.GetEntityId())}
			if g.entityKeys[k] {
				return nil, false
			}
			g.entityKeys[k] = true
			for i, v := range entityArgs(e) {
				g.ents[i] = append(g.ents[i], v)
			}
			g.nEnts++
		}
		for _, x := range p.b.Payloads {
			k := payloadKey{x.DocID, x.Kind}
			if g.payKeys[k] || later(i, x.DocID) {
				return nil, false
			}
			g.payKeys[k] = true
			if x.Body == nil {
				g.delDoc, g.delKind = append(g.delDoc, x.DocID), append(g.delKind, int32(x.Kind))
			} else {
				g.putDoc, g.putKind, g.putBody = append(g.putDoc, x.DocID), append(g.putKind, int32(x.Kind)), append(g.putBody, x.Body)
				if g.putBytes += int64(len(x.Body)); g.putBytes > maxMergedPayloadBytes {
					return nil, false
				}
			}
		}
	}
	return g, true
}

// queue adds the group's multi-row statements to pl.
func (g *groupRows) queue(pl *pipeline) {
	if g.nEnts > 0 {
		pl.exec(-1, false, upsertEntitiesSQL, g.entityColumns()...)
	}
	if len(g.delDoc) > 0 {
		pl.exec(-1, false, deletePayloadsSQL, g.delDoc, g.delKind)
	}
	if len(g.putDoc) > 0 {
		bodies, offsets, lengths := concatBodies(g.putBody)
		pl.exec(-1, false, upsertPayloadsSQL, g.putDoc, g.putKind, bodies, offsets, lengths)
	}
}

// maxMergedPayloadBytes bounds the inline payload bytes one multi-row
// statement carries (concatBodies' int32 offsets, PostgreSQL's 1 GB limit
// on a value); a group over it sends each batch's rows on their own. The
// gateway's inline payloads are at most 64 KiB, so 128 batches stay far
// below it.
const maxMergedPayloadBytes = 256 << 20

// concatBodies joins bodies into one slice and returns each one's 1-based
// offset and length in it (upsertPayloadsSQL); their sum is at most
// maxMergedPayloadBytes.
func concatBodies(bodies [][]byte) (all []byte, offsets, lengths []int32) {
	n := 0
	for _, b := range bodies {
		n += len(b)
	}
	all = make([]byte, 0, n)
	offsets, lengths = make([]int32, len(bodies)), make([]int32, len(bodies))
	for i, b := range bodies {
		offsets[i], lengths[i] = int32(len(all)+1), int32(len(b))
		all = append(all, b...)
	}
	return all, offsets, lengths
}

// entityColumns turns the collected entity arguments (entityArgs' types)
// into typed arrays.
func (g *groupRows) entityColumns() []any {
	out := make([]any, len(g.ents))
	for i, col := range g.ents {
		switch col[0].(type) {
		case string:
			out[i] = typed[string](col)
		case int32:
			out[i] = typed[int32](col)
		default:
			out[i] = typed[int64](col)
		}
	}
	return out
}

func typed[T any](col []any) []T {
	out := make([]T, len(col))
	for i, v := range col {
		out[i] = v.(T)
	}
	return out
}
