package sqlite

import (
	"database/sql"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
)

// docRow is a DocumentRecord with its columns extracted and its body encoded.
type docRow struct {
	rec                *store.DocumentRecord
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
	// body is the encoded event; the writer appends the seq field after
	// body[:n] (n is the length without it).
	body []byte
	n    int
}

// Fields of gatewayv1.Document kept in their own tables, stripped from the
// document body.
const (
	docFieldEntities    = 13
	docFieldDigests     = 14
	docFieldClaimChecks = 15
	eventFieldSeq       = 1
)

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
		return docRow{}, fmt.Errorf("store: encode document %s: %w", d.GetId(), err)
	}
	body, err := store.StripFields(full, docFieldEntities, docFieldDigests, docFieldClaimChecks)
	if err != nil {
		return docRow{}, err
	}
	r := docRow{
		rec: rec, body: body, state: int32(d.GetState()), terminal: store.IsTerminal(d.GetState()),
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

func encodeEvent(e store.EventAppend) (encEvent, error) {
	ev := e.Event
	if ev == nil || ev.GetTime() == nil || ev.GetKind() == "" {
		return encEvent{}, fmt.Errorf("%w: event needs Time and Kind", store.ErrInvalid)
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
		body: body, n: len(body),
	}, nil
}

// prepare validates and encodes b in the caller's goroutine, so the writer
// only runs SQL.
func prepare(b *store.Batch) (*request, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil batch", store.ErrInvalid)
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
			return nil, fmt.Errorf("%w: entity record needs DocID and Entity", store.ErrInvalid)
		}
	}
	for _, d := range b.Digests {
		if d.Digest == nil || d.DocID == "" {
			return nil, fmt.Errorf("%w: digest record needs DocID and Digest", store.ErrInvalid)
		}
	}
	for _, p := range b.Payloads {
		if p.DocID == "" || (p.Kind != store.PayloadContent && p.Kind != store.PayloadResult) {
			return nil, fmt.Errorf("%w: payload record needs DocID and a known Kind (got %q, %d)", store.ErrInvalid, p.DocID, p.Kind)
		}
	}
	for _, c := range b.Claims {
		if err := validClaim(c); err != nil {
			return nil, err
		}
	}
	if b.Redeem != nil {
		if _, err := strconv.ParseUint(b.Redeem.ClaimID, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: claim id %q is not a decimal uint64", store.ErrNotFound, b.Redeem.ClaimID)
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
