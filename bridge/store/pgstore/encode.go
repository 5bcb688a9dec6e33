package pgstore

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
)

// Fields of gatewayv1.Document kept in their own tables, stripped from the
// stored document body (as in the SQLite store).
const (
	docFieldEntities    = 13
	docFieldDigests     = 14
	docFieldClaimChecks = 15
	eventFieldSeq       = 1
)

// docRow is a DocumentRecord with its columns extracted and its body encoded.
type docRow struct {
	rec                *store.DocumentRecord
	body               []byte
	state              int32
	terminal           bool
	rev, prevRev       int64
	createNs, updateNs int64
	requestID          *string
}

// encEvent is an EventAppend encoded without its seq; the seq field is
// appended after body[:n] once the seq is known.
type encEvent struct {
	tenant, kind, doc string
	rev, since        int64
	timeNs            int64
	body              []byte
	n                 int
}

// prepared is a validated, encoded Batch.
type prepared struct {
	b       *store.Batch
	create  *docRow
	updates []docRow
	events  []encEvent

	// Leases (lease.go): the owner written by a create, the lease length,
	// and the epoch each fenced update must find.
	owner     string
	leaseSecs float64
	fence     map[string]int64
	// childFence: held documents the batch writes rows of (entities,
	// digests, claims, inline payloads) without updating them, and their
	// epochs; checked by one statement in the transaction (lease.go).
	childFence map[string]int64
}

func encodeDoc(rec *store.DocumentRecord) (docRow, error) {
	if rec == nil || rec.Doc == nil {
		return docRow{}, fmt.Errorf("%w: document record without Doc", store.ErrInvalid)
	}
	d := rec.Doc
	if d.GetId() == "" || len(d.GetId()) > maxDocIDLen {
		return docRow{}, fmt.Errorf("%w: document id must be 1..%d bytes", store.ErrInvalid, maxDocIDLen)
	}
	if d.GetCreateTime() == nil {
		return docRow{}, fmt.Errorf("%w: document %s has no create_time", store.ErrInvalid, d.GetId())
	}
	full, err := proto.Marshal(d)
	if err != nil {
		return docRow{}, fmt.Errorf("pgstore: encode document %s: %w", d.GetId(), err)
	}
	body, err := store.StripFields(full, docFieldEntities, docFieldDigests, docFieldClaimChecks)
	if err != nil {
		return docRow{}, err
	}
	r := docRow{
		rec: rec, body: body, state: int32(d.GetState()), terminal: store.IsTerminal(d.GetState()),
		rev: int64(d.GetRev()), createNs: d.GetCreateTime().AsTime().UnixNano(),
	}
	r.updateNs = r.createNs
	if d.GetUpdateTime() != nil {
		r.updateNs = d.GetUpdateTime().AsTime().UnixNano()
	}
	if id := d.GetRequestId(); id != "" {
		r.requestID = &id
	}
	return r, nil
}

func encodeEvent(e store.EventAppend) (encEvent, error) {
	ev := e.Event
	if ev == nil || ev.GetTime() == nil || ev.GetKind() == "" {
		return encEvent{}, fmt.Errorf("%w: event needs Time and Kind", store.ErrInvalid)
	}
	body, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, proto.Size(ev)+10), ev)
	if err != nil {
		return encEvent{}, fmt.Errorf("pgstore: encode event: %w", err)
	}
	return encEvent{
		tenant: e.Tenant, kind: ev.GetKind(), doc: ev.GetDocumentId(),
		rev: int64(ev.GetRev()), since: int64(ev.GetSince()), timeNs: ev.GetTime().AsTime().UnixNano(),
		body: body, n: len(body),
	}, nil
}

// withSeq returns the event body with its seq field.
func (e *encEvent) withSeq(seq uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(e.body[:e.n], eventFieldSeq, protowire.VarintType), seq)
}

// prepare validates and encodes b before any SQL runs (the same checks as
// the SQLite store, so both answer bad input alike).
func prepare(b *store.Batch) (*prepared, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil batch", store.ErrInvalid)
	}
	p := &prepared{b: b}
	if b.Create != nil {
		row, err := encodeDoc(b.Create)
		if err != nil {
			return nil, err
		}
		p.create = &row
	}
	for _, u := range b.Updates {
		row, err := encodeDoc(u.Record)
		if err != nil {
			return nil, err
		}
		row.prevRev = int64(u.PrevRev)
		p.updates = append(p.updates, row)
	}
	// Row locks in id order: a renewal (renewSQL) and another commit
	// lock theirs in the same order, so they wait on each other instead of
	// deadlocking (the flusher's batch lists its documents in map order).
	slices.SortFunc(p.updates, func(a, b docRow) int { return strings.Compare(a.rec.Doc.GetId(), b.rec.Doc.GetId()) })
	if err := validateChildren(b); err != nil {
		return nil, err
	}
	p.events = make([]encEvent, len(b.Events))
	for i, e := range b.Events {
		ee, err := encodeEvent(e)
		if err != nil {
			return nil, err
		}
		p.events[i] = ee
	}
	return p, nil
}

func validateChildren(b *store.Batch) error {
	for _, e := range b.Entities {
		if e.Entity == nil || e.DocID == "" {
			return fmt.Errorf("%w: entity record needs DocID and Entity", store.ErrInvalid)
		}
	}
	for _, d := range b.Digests {
		if d.Digest == nil || d.DocID == "" {
			return fmt.Errorf("%w: digest record needs DocID and Digest", store.ErrInvalid)
		}
	}
	for _, p := range b.Payloads {
		if p.DocID == "" || (p.Kind != store.PayloadContent && p.Kind != store.PayloadResult) {
			return fmt.Errorf("%w: payload record needs DocID and a known Kind (got %q, %d)", store.ErrInvalid, p.DocID, p.Kind)
		}
	}
	for _, c := range b.Claims {
		if err := validClaim(c); err != nil {
			return err
		}
	}
	if b.Redeem != nil {
		if _, err := strconv.ParseUint(b.Redeem.ClaimID, 10, 64); err != nil {
			return fmt.Errorf("%w: claim id %q is not a decimal uint64", store.ErrNotFound, b.Redeem.ClaimID)
		}
	}
	return nil
}

func validClaim(c store.ClaimRecord) error {
	if c.Claim == nil {
		return fmt.Errorf("%w: claim record without Claim", store.ErrInvalid)
	}
	if _, err := strconv.ParseUint(c.Claim.GetClaimId(), 10, 64); err != nil {
		return fmt.Errorf("%w: claim id %q is not a decimal uint64", store.ErrInvalid, c.Claim.GetClaimId())
	}
	if c.Claim.GetDocumentId() == "" || c.Claim.GetExpireTime() == nil {
		return fmt.Errorf("%w: claim %s needs document_id and expire_time", store.ErrInvalid, c.Claim.GetClaimId())
	}
	return nil
}

func tsNanos(t *timestamppb.Timestamp) int64 {
	if t == nil {
		return 0
	}
	return t.AsTime().UnixNano()
}
