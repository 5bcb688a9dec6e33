package store

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Fields of gatewayv1.Document that the backends keep in their own tables
// and strip from the stored document body (what RawDocument.Body lacks).
const (
	rawDocFieldEntities    = 13
	rawDocFieldDigests     = 14
	rawDocFieldClaimChecks = 15
)

// RawDocument is one document of a snapshot as stored, not decoded (the
// SQLite backend's SnapshotRaw; eventlog.StreamSnapshotRaw): Body
// is the encoded gatewayv1.Document without its entities, digests and
// claims (encodeDoc strips fields 13-15), Digests the newest attempt's
// encoded ScopeDigests in (scope, instance) order, Claims its claims
// oldest first. The slices are the caller's.
type RawDocument struct {
	ID string
	// Row is the document's rowid: its position in SnapshotRaw's order
	// (SnapshotKey.Row). 0 from EncodeRaw.
	Row int64
	// CreateTime is the create time (Unix ns): with ID, the position in
	// the create-time order of a backend without SnapshotRaw (EncodeRaw
	// sets it; SnapshotRaw does not).
	CreateTime int64
	Body       []byte
	Digests    [][]byte
	Claims     []*gatewayv1.ClaimCheck
}

// EncodeRaw is the RawDocument of a decoded document (with its digests
// and claims; entities are not part of it): what SnapshotRaw returns for
// the same stored document, for a backend that reads documents decoded.
func EncodeRaw(d *gatewayv1.Document) (RawDocument, error) {
	full, err := proto.Marshal(d)
	if err != nil {
		return RawDocument{}, fmt.Errorf("store: encode document %s: %w", d.GetId(), err)
	}
	body, err := StripFields(full, rawDocFieldEntities, rawDocFieldDigests, rawDocFieldClaimChecks)
	if err != nil {
		return RawDocument{}, err
	}
	r := RawDocument{ID: d.GetId(), CreateTime: d.GetCreateTime().AsTime().UnixNano(), Body: body, Claims: d.GetClaimChecks()}
	for _, g := range d.GetDigests() {
		b, err := proto.Marshal(g)
		if err != nil {
			return RawDocument{}, fmt.Errorf("store: encode digest of %s: %w", d.GetId(), err)
		}
		r.Digests = append(r.Digests, b)
	}
	return r, nil
}

// SnapshotKey is a position in a snapshot: the documents after it. The
// zero key is the start. SnapshotRaw reads Row (the SQLite order);
// CreateTime and ID are the create-time order of SnapshotPages, which a
// backend without SnapshotRaw is read in (eventlog.StreamSnapshotRaw).
type SnapshotKey struct {
	Row        int64
	CreateTime int64 // Unix ns
	ID         string
}
