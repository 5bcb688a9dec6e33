package bridge

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// DefaultSnapshotPage and MaxSnapshotPage bound StreamSnapshot's chunks:
// 2,000 small documents are ~200 KB encoded (~600 KB as JSON), large
// enough to amortize the store's three queries per page and a stream
// message (1.8x the throughput of 500 in BenchmarkSnapshotLargeStore),
// small enough that memory is a constant per stream. The maximum is the
// store's page cap.
const (
	DefaultSnapshotPage = 2000
	MaxSnapshotPage     = 10000
)

func (e events) StreamSnapshot(ctx context.Context, t Tenant, pageSize int, send func(*gatewayv1.SnapshotChunk) error) error {
	if pageSize < 0 || pageSize > MaxSnapshotPage {
		return fmt.Errorf("page_size %d is out of range: use 1 to %d, or 0 for %d: %w", pageSize, MaxSnapshotPage, DefaultSnapshotPage, ErrInvalid)
	}
	if pageSize == 0 {
		pageSize = DefaultSnapshotPage
	}
	var total, last uint64
	err := e.b.ev.StreamSnapshot(ctx, string(t), pageSize, func(seq uint64, docs []*gatewayv1.Document) error {
		last = seq
		if len(docs) == 0 {
			return nil // only the empty store's single call: the final chunk says it
		}
		for _, d := range docs {
			d.Name = "documents/" + d.Id
			for _, c := range d.ClaimChecks {
				c.Name = "claims/" + c.ClaimId
			}
		}
		total += uint64(len(docs))
		return send(&gatewayv1.SnapshotChunk{Seq: seq, Documents: docs})
	})
	if err != nil {
		return e.b.mapEventErr(err, 0)
	}
	return send(&gatewayv1.SnapshotChunk{Seq: last, Last: true, TotalDocuments: total})
}

// SnapshotPosition is a place in the snapshot's order:
// StreamSnapshotEncoded sends the documents after it and passes the
// position after each chunk to send. The zero position is the start.
// Row is the SQLite store's (its table order); CreateTime (Unix ns) and
// ID the create-time order of a backend without raw reads.
type SnapshotPosition struct {
	Row        int64
	CreateTime int64
	ID         string
}

// Field numbers of the encoded public forms StreamSnapshotEncoded writes.
const (
	chunkFieldSeq       = 1
	chunkFieldDocuments = 2
	chunkFieldLast      = 3
	chunkFieldTotal     = 4
	docFieldName        = 1
	docFieldDigests     = 14
	docFieldClaimChecks = 15
	claimFieldName      = 1
)

// StreamSnapshotEncoded is StreamSnapshot with every chunk already encoded
// (a gatewayv1.SnapshotChunk in protobuf wire form), built from the
// documents' stored bytes without decoding them: each document is the
// stored body with its public name (publicDoc) and its digests and claims
// spliced in, so the chunk decodes to exactly what StreamSnapshot sends.
// The chunk is only valid during send; next is the position after its
// last document (the page form's next token).
func (e events) StreamSnapshotEncoded(ctx context.Context, t Tenant, pageSize int, after SnapshotPosition, send func(chunk []byte, next SnapshotPosition) error) error {
	if pageSize < 0 || pageSize > MaxSnapshotPage {
		return fmt.Errorf("page_size %d is out of range: use 1 to %d, or 0 for %d: %w", pageSize, MaxSnapshotPage, DefaultSnapshotPage, ErrInvalid)
	}
	if pageSize == 0 {
		pageSize = DefaultSnapshotPage
	}
	var (
		total, last uint64
		chunk, doc  []byte
		err         error
	)
	key := store.SnapshotKey{Row: after.Row, CreateTime: after.CreateTime, ID: after.ID}
	next := after
	err = e.b.ev.StreamSnapshotRaw(ctx, string(t), key, pageSize, func(seq uint64, docs []store.RawDocument) error {
		last = seq
		if len(docs) == 0 {
			return nil // only the empty store's single call: the final chunk says it
		}
		chunk = appendUintField(chunk[:0], chunkFieldSeq, seq)
		for _, d := range docs {
			if doc, err = AppendPublicDocument(doc[:0], d); err != nil {
				return err
			}
			chunk = protowire.AppendBytes(protowire.AppendTag(chunk, chunkFieldDocuments, protowire.BytesType), doc)
		}
		total += uint64(len(docs))
		d := docs[len(docs)-1]
		next = SnapshotPosition{Row: d.Row, CreateTime: d.CreateTime, ID: d.ID}
		return send(chunk, next)
	})
	if err != nil {
		return e.b.mapEventErr(err, 0)
	}
	chunk = appendUintField(chunk[:0], chunkFieldSeq, last)
	chunk = protowire.AppendVarint(protowire.AppendTag(chunk, chunkFieldLast, protowire.VarintType), 1)
	chunk = appendUintField(chunk, chunkFieldTotal, total)
	return send(chunk, next)
}

// appendUintField appends a varint field unless v is 0 (proto3 default).
func appendUintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// AppendPublicDocument appends the encoding of d's public form (what
// publicDoc makes of the decoded document): name "documents/<id>" first,
// then the stored fields in their order with the digests (14) and claims
// (15, each named "claims/<claim id>") before the first field numbered
// above 15. A stored name is replaced. It fails only on a malformed body.
func AppendPublicDocument(b []byte, d store.RawDocument) ([]byte, error) {
	b = protowire.AppendTag(b, docFieldName, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len("documents/")+len(d.ID)))
	b = append(append(b, "documents/"...), d.ID...)
	body, spliced := d.Body, false
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 {
			return b, fmt.Errorf("document %s: %w", d.ID, protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, body[n:])
		if m < 0 {
			return b, fmt.Errorf("document %s: %w", d.ID, protowire.ParseError(m))
		}
		if num > docFieldClaimChecks && !spliced {
			b, spliced = appendChildren(b, d), true
		}
		if num != docFieldName {
			b = append(b, body[:n+m]...)
		}
		body = body[n+m:]
	}
	if !spliced {
		b = appendChildren(b, d)
	}
	return b, nil
}

// appendChildren appends d's digests (stored encoded) and named claims.
func appendChildren(b []byte, d store.RawDocument) []byte {
	for _, g := range d.Digests {
		b = protowire.AppendBytes(protowire.AppendTag(b, docFieldDigests, protowire.BytesType), g)
	}
	for _, c := range d.Claims {
		if c.GetName() != "" {
			c = proto.CloneOf(c)
			c.Name = ""
		}
		name := "claims/" + c.GetClaimId()
		size := protowire.SizeTag(claimFieldName) + protowire.SizeBytes(len(name)) + proto.Size(c)
		b = protowire.AppendVarint(protowire.AppendTag(b, docFieldClaimChecks, protowire.BytesType), uint64(size))
		b = protowire.AppendString(protowire.AppendTag(b, claimFieldName, protowire.BytesType), name)
		b, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, c)
	}
	return b
}
