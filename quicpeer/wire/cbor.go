package wire

import (
	"errors"

	"github.com/fxamacker/cbor/v2"
)

// CBOR modes, built once (Section 3.4.2, Appendix C).
//
// Encoding is deterministic: map keys sorted length-first then bytewise
// (RFC 8949 4.2.3, as vectors/control-cbor/valid-capabilities-default.bin),
// shortest integers, shortest floats, no indefinite lengths.
//
// Decoding accepts any valid CBOR (Appendix C: receivers MUST accept any
// valid CBOR uint; docs/profile.md 1): non-shortest integers, any key order
// and indefinite-length items are accepted. It rejects duplicate map keys,
// invalid UTF-8, nesting deeper than cborMaxNestedLevels and containers
// larger than cborMaxMapPairs / cborMaxArrayElements; member names match
// case-sensitively and unknown members are ignored.
var (
	cborEnc cbor.EncMode
	cborDec cbor.DecMode
)

func init() {
	var err error
	cborEnc, err = cbor.EncOptions{
		Sort:          cbor.SortLengthFirst,
		ShortestFloat: cbor.ShortestFloat16,
		NaNConvert:    cbor.NaNConvert7e00,
		InfConvert:    cbor.InfConvertFloat16,
		IndefLength:   cbor.IndefLengthForbidden,
	}.EncMode()
	if err != nil {
		panic(err)
	}
	cborDec, err = cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthAllowed,
		MaxNestedLevels:   cborMaxNestedLevels,
		MaxMapPairs:       cborMaxMapPairs,
		MaxArrayElements:  cborMaxArrayElements,
		UTF8:              cbor.UTF8RejectInvalid,
		FieldNameMatching: cbor.FieldNameMatchingCaseSensitive,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

type cborCodec struct{}

var cborCodecInstance Codec = cborCodec{}

func (cborCodec) Format() Format { return FormatCBOR }

// Decoding shadows: required members are pointers so absence is detected.
type (
	cborCaps struct {
		Layer0Core          *bool   `cbor:"layer0-core"`
		Layer1Recursive     *bool   `cbor:"layer1-recursive"`
		Layer2Resilience    *bool   `cbor:"layer2-resilience"`
		MaxScopeDepth       *uint64 `cbor:"max-scope-depth"`
		MaxEntitiesPerScope *uint64 `cbor:"max-entities-per-scope"`
		MaxWindowSize       *uint64 `cbor:"max-window-size"`
		SerializationFormat *Format `cbor:"serialization-format"`
		KeepaliveTimeoutMs  *uint64 `cbor:"keepalive-timeout-ms"`
	}
	cborCheckpoint struct {
		CheckpointID       *string `cbor:"checkpoint-id"`
		SequenceNumber     *uint64 `cbor:"sequence-number"`
		CheckpointEntityID *uint32 `cbor:"checkpoint-entity-id"`
		ScopeID            *uint32 `cbor:"scope-id"`
		Flags              *uint64 `cbor:"flags"`
		TimeoutMs          *uint64 `cbor:"timeout-ms"`
	}
	cborChunkInfo struct {
		TotalChunks *uint64 `cbor:"total-chunks"`
		ChunkIndex  *uint64 `cbor:"chunk-index"`
		ChunkOffset *uint64 `cbor:"chunk-offset"`
	}
	cborHeader struct {
		EntityID         *uint32           `cbor:"entity-id"`
		ParentID         *uint32           `cbor:"parent-id"`
		ScopeID          *uint32           `cbor:"scope-id"`
		Layer            *uint8            `cbor:"layer"`
		ContentType      string            `cbor:"content-type"`
		PayloadLength    *uint64           `cbor:"payload-length"`
		Checksum         []byte            `cbor:"checksum"`
		Metadata         map[string]string `cbor:"metadata"`
		ChunkInfo        *cborChunkInfo    `cbor:"chunk-info"`
		CompletionPolicy *CompletionPolicy `cbor:"completion-policy"`
	}
	cborOwnership struct {
		OwnerID *string  `cbor:"owner-id"`
		GroupID string   `cbor:"group-id"`
		Scopes  []string `cbor:"scopes"`
	}
	cborPipeDoc struct {
		DocID     *string        `cbor:"doc-id"`
		EntityID  *uint32        `cbor:"entity-id"`
		Ownership *cborOwnership `cbor:"ownership"`
		Blob      []byte         `cbor:"blob"`
	}
)

func cborDecode(what string, b []byte, v any) error {
	if err := cborDec.Unmarshal(b, v); err != nil {
		var te *cbor.UnmarshalTypeError
		if errors.As(err, &te) {
			return Errorf(CodeEntityInvalid, "%s: member %q: %v", what, te.StructFieldName, err)
		}
		return Errorf(CodeEntityInvalid, "%s: invalid CBOR: %v", what, err)
	}
	return nil
}

func missing(what, member string) error {
	return Errorf(CodeEntityInvalid, "%s: required member %q is missing", what, member)
}

func cborEncode(what string, v any) ([]byte, error) {
	b, err := cborEnc.Marshal(v)
	if err != nil {
		return nil, Errorf(CodeInternalError, "%s: encode: %v", what, err)
	}
	return b, nil
}

func (cborCodec) MarshalCapabilities(c *Capabilities) ([]byte, error) {
	return cborEncode("capabilities", c)
}

func (cborCodec) UnmarshalCapabilities(b []byte) (*Capabilities, error) {
	var s cborCaps
	if err := cborDecode("capabilities", b, &s); err != nil {
		return nil, err
	}
	switch {
	case s.Layer0Core == nil:
		return nil, missing("capabilities", "layer0-core")
	case s.Layer1Recursive == nil:
		return nil, missing("capabilities", "layer1-recursive")
	case s.Layer2Resilience == nil:
		return nil, missing("capabilities", "layer2-resilience")
	}
	return &Capabilities{
		Layer0Core: *s.Layer0Core, Layer1Recursive: *s.Layer1Recursive, Layer2Resilience: *s.Layer2Resilience,
		MaxScopeDepth: s.MaxScopeDepth, MaxEntitiesPerScope: s.MaxEntitiesPerScope, MaxWindowSize: s.MaxWindowSize,
		SerializationFormat: s.SerializationFormat, KeepaliveTimeoutMs: s.KeepaliveTimeoutMs,
	}, nil
}

func (cborCodec) MarshalCheckpoint(c *CheckpointFrame) ([]byte, error) {
	return cborEncode("checkpoint", c)
}

func (cborCodec) UnmarshalCheckpoint(b []byte) (*CheckpointFrame, error) {
	var s cborCheckpoint
	if err := cborDecode("checkpoint", b, &s); err != nil {
		return nil, err
	}
	switch {
	case s.CheckpointID == nil:
		return nil, missing("checkpoint", "checkpoint-id")
	case s.SequenceNumber == nil:
		return nil, missing("checkpoint", "sequence-number")
	case s.CheckpointEntityID == nil:
		return nil, missing("checkpoint", "checkpoint-entity-id")
	}
	return &CheckpointFrame{
		CheckpointID: *s.CheckpointID, SequenceNumber: *s.SequenceNumber, CheckpointEntityID: *s.CheckpointEntityID,
		ScopeID: s.ScopeID, Flags: s.Flags, TimeoutMs: s.TimeoutMs,
	}, nil
}

func (c cborCodec) MarshalEntityHeader(h *EntityHeader) ([]byte, error) {
	return c.appendEntityHeader(nil, h)
}

// appendEntityHeader appends the CBOR of h to b (headerAppender).
func (cborCodec) appendEntityHeader(b []byte, h *EntityHeader) ([]byte, error) {
	if out, ok := appendCBORHeaderFast(b, h); ok {
		return out, nil
	}
	hb, err := cborEncode("entity header", h)
	if err != nil {
		return nil, err
	}
	return append(b, hb...), nil
}

func (cborCodec) UnmarshalEntityHeader(b []byte) (*EntityHeader, error) {
	if h, ok := decodeCBORHeaderFast(b); ok {
		if err := validateEntityHeader(h); err != nil {
			return nil, err
		}
		return h, nil
	}
	return decodeCBORHeaderGeneric(b)
}

// decodeCBORHeaderGeneric decodes and validates an entity header with the
// generic cbor/v2 mode (any valid CBOR, Appendix C).
func decodeCBORHeaderGeneric(b []byte) (*EntityHeader, error) {
	var s cborHeader
	if err := cborDecode("entity header", b, &s); err != nil {
		return nil, err
	}
	switch {
	case s.EntityID == nil:
		return nil, missing("entity header", "entity-id")
	case s.Layer == nil:
		return nil, missing("entity header", "layer")
	case s.PayloadLength == nil:
		return nil, missing("entity header", "payload-length")
	}
	h := &EntityHeader{
		EntityID: *s.EntityID, ParentID: s.ParentID, ScopeID: s.ScopeID, Layer: *s.Layer,
		ContentType: s.ContentType, PayloadLength: *s.PayloadLength, Checksum: s.Checksum,
		Metadata: s.Metadata, CompletionPolicy: s.CompletionPolicy,
	}
	if ci := s.ChunkInfo; ci != nil {
		switch {
		case ci.TotalChunks == nil:
			return nil, missing("chunk-info", "total-chunks")
		case ci.ChunkIndex == nil:
			return nil, missing("chunk-info", "chunk-index")
		case ci.ChunkOffset == nil:
			return nil, missing("chunk-info", "chunk-offset")
		}
		h.ChunkInfo = &ChunkInfo{TotalChunks: *ci.TotalChunks, ChunkIndex: *ci.ChunkIndex, ChunkOffset: *ci.ChunkOffset}
	}
	if err := validateEntityHeader(h); err != nil {
		return nil, err
	}
	return h, nil
}

func (cborCodec) MarshalPipeDoc(d *PipeDoc) ([]byte, error) {
	if pipeDocFast(d) {
		size := 48 + len(d.DocID) + len(d.Blob)
		if o := d.Ownership; o != nil {
			size += 32 + len(o.OwnerID) + len(o.GroupID)
		}
		b, _ := appendCBORPipeDocFast(make([]byte, 0, size), d)
		return b, nil
	}
	return cborEncode("pipe-doc", d)
}

func (cborCodec) UnmarshalPipeDoc(b []byte) (*PipeDoc, error) {
	return unmarshalCBORPipeDoc(b, false)
}

// UnmarshalPipeDocShared is c.UnmarshalPipeDoc(b), except that the
// decoded blob may alias b (it does on the CBOR fast path, which copies
// nothing): for a receiver that reads the envelope into a buffer of its
// own and keeps the blob no longer than that buffer. Every check
// UnmarshalPipeDoc makes is made.
func UnmarshalPipeDocShared(c Codec, b []byte) (*PipeDoc, error) {
	if _, ok := c.(cborCodec); ok {
		return unmarshalCBORPipeDoc(b, true)
	}
	return c.UnmarshalPipeDoc(b)
}

func unmarshalCBORPipeDoc(b []byte, share bool) (*PipeDoc, error) {
	if d, ok := decodeCBORPipeDocFast(b, share); ok {
		if err := validatePipeDoc(d); err != nil {
			return nil, err
		}
		return d, nil
	}
	return decodeCBORPipeDocGeneric(b)
}

// decodeCBORPipeDocGeneric decodes and validates a pipe-doc with the
// generic cbor/v2 mode.
func decodeCBORPipeDocGeneric(b []byte) (*PipeDoc, error) {
	var s cborPipeDoc
	if err := cborDecode("pipe-doc", b, &s); err != nil {
		return nil, err
	}
	switch {
	case s.DocID == nil:
		return nil, missing("pipe-doc", "doc-id")
	case s.EntityID == nil:
		return nil, missing("pipe-doc", "entity-id")
	}
	d := &PipeDoc{DocID: *s.DocID, EntityID: *s.EntityID, Blob: s.Blob}
	if o := s.Ownership; o != nil {
		if o.OwnerID == nil {
			return nil, missing("ownership", "owner-id")
		}
		d.Ownership = &OwnershipContext{OwnerID: *o.OwnerID, GroupID: o.GroupID, Scopes: o.Scopes}
	}
	if err := validatePipeDoc(d); err != nil {
		return nil, err
	}
	return d, nil
}
