package wire

import (
	"math"

	"google.golang.org/protobuf/proto"

	protocolv1 "github.com/pipestream/gateway/gen/pipestream/protocol/v1"
)

// The Protobuf codec (Section 3.4.2, Appendix D) maps the contract types to
// the generated pipestream.protocol.v1 messages (edition 2023: explicit
// presence, so a missing required member is detected as in CBOR).
//
// Appendix D declares some members uint32 where the CDDL says uint
// (max-scope-depth, max-entities-per-scope, max-window-size,
// keepalive-timeout-ms, total-chunks, chunk-index, checkpoint flags and
// timeout-ms); Marshal rejects values that do not fit with *Error 0x01.
// Unknown fields are discarded; a closed-enum value the schema does not
// define is treated as absent (protobuf-go keeps it as an unknown field).
type protoCodec struct{}

var protoCodecInstance Codec = protoCodec{}

var (
	pbMarshal   = proto.MarshalOptions{Deterministic: true}
	pbUnmarshal = proto.UnmarshalOptions{DiscardUnknown: true, RecursionLimit: cborMaxNestedLevels}
)

func (protoCodec) Format() Format { return FormatProtobuf }

func pbEncode(what string, m proto.Message) ([]byte, error) {
	b, err := pbMarshal.Marshal(m)
	if err != nil {
		return nil, Errorf(CodeInternalError, "%s: protobuf encode: %v", what, err)
	}
	return b, nil
}

func pbDecode(what string, b []byte, m proto.Message) error {
	if err := pbUnmarshal.Unmarshal(b, m); err != nil {
		return Errorf(CodeEntityInvalid, "%s: invalid protobuf: %v", what, err)
	}
	return nil
}

// narrow converts an optional uint64 to the uint32 of Appendix D.
func narrow(what, member string, p *uint64) (*uint32, error) {
	if p == nil {
		return nil, nil
	}
	if *p > math.MaxUint32 {
		return nil, Errorf(CodeInternalError, "%s: %s %d does not fit the protobuf uint32", what, member, *p)
	}
	return proto.Uint32(uint32(*p)), nil
}

func widen(p *uint32) *uint64 {
	if p == nil {
		return nil
	}
	v := uint64(*p)
	return &v
}

func (protoCodec) MarshalCapabilities(c *Capabilities) ([]byte, error) {
	m := &protocolv1.Capabilities{
		Layer0Core: proto.Bool(c.Layer0Core), Layer1Recursive: proto.Bool(c.Layer1Recursive),
		Layer2Resilience: proto.Bool(c.Layer2Resilience),
	}
	var err error
	if m.MaxScopeDepth, err = narrow("capabilities", "max-scope-depth", c.MaxScopeDepth); err != nil {
		return nil, err
	}
	if m.MaxEntitiesPerScope, err = narrow("capabilities", "max-entities-per-scope", c.MaxEntitiesPerScope); err != nil {
		return nil, err
	}
	if m.MaxWindowSize, err = narrow("capabilities", "max-window-size", c.MaxWindowSize); err != nil {
		return nil, err
	}
	if m.KeepaliveTimeoutMs, err = narrow("capabilities", "keepalive-timeout-ms", c.KeepaliveTimeoutMs); err != nil {
		return nil, err
	}
	if c.SerializationFormat != nil {
		m.SerializationFormat = protocolv1.SerializationFormat(*c.SerializationFormat).Enum()
	}
	return pbEncode("capabilities", m)
}

func (protoCodec) UnmarshalCapabilities(b []byte) (*Capabilities, error) {
	var m protocolv1.Capabilities
	if err := pbDecode("capabilities", b, &m); err != nil {
		return nil, err
	}
	switch {
	case m.Layer0Core == nil:
		return nil, missing("capabilities", "layer0_core")
	case m.Layer1Recursive == nil:
		return nil, missing("capabilities", "layer1_recursive")
	case m.Layer2Resilience == nil:
		return nil, missing("capabilities", "layer2_resilience")
	}
	c := &Capabilities{
		Layer0Core: *m.Layer0Core, Layer1Recursive: *m.Layer1Recursive, Layer2Resilience: *m.Layer2Resilience,
		MaxScopeDepth: widen(m.MaxScopeDepth), MaxEntitiesPerScope: widen(m.MaxEntitiesPerScope),
		MaxWindowSize: widen(m.MaxWindowSize), KeepaliveTimeoutMs: widen(m.KeepaliveTimeoutMs),
	}
	if m.SerializationFormat != nil {
		f := Format(*m.SerializationFormat)
		c.SerializationFormat = &f
	}
	return c, nil
}

func (protoCodec) MarshalCheckpoint(c *CheckpointFrame) ([]byte, error) {
	m := &protocolv1.CheckpointFrame{
		CheckpointId: proto.String(c.CheckpointID), SequenceNumber: proto.Uint64(c.SequenceNumber),
		CheckpointEntityId: proto.Uint32(c.CheckpointEntityID), ScopeId: c.ScopeID,
	}
	var err error
	if m.Flags, err = narrow("checkpoint", "flags", c.Flags); err != nil {
		return nil, err
	}
	if m.TimeoutMs, err = narrow("checkpoint", "timeout-ms", c.TimeoutMs); err != nil {
		return nil, err
	}
	return pbEncode("checkpoint", m)
}

func (protoCodec) UnmarshalCheckpoint(b []byte) (*CheckpointFrame, error) {
	var m protocolv1.CheckpointFrame
	if err := pbDecode("checkpoint", b, &m); err != nil {
		return nil, err
	}
	switch {
	case m.CheckpointId == nil:
		return nil, missing("checkpoint", "checkpoint_id")
	case m.SequenceNumber == nil:
		return nil, missing("checkpoint", "sequence_number")
	case m.CheckpointEntityId == nil:
		return nil, missing("checkpoint", "checkpoint_entity_id")
	}
	return &CheckpointFrame{
		CheckpointID: *m.CheckpointId, SequenceNumber: *m.SequenceNumber, CheckpointEntityID: *m.CheckpointEntityId,
		ScopeID: m.ScopeId, Flags: widen(m.Flags), TimeoutMs: widen(m.TimeoutMs),
	}, nil
}

func (protoCodec) MarshalEntityHeader(h *EntityHeader) ([]byte, error) {
	m := &protocolv1.EntityHeader{
		EntityId: proto.Uint32(h.EntityID), ParentId: h.ParentID, ScopeId: h.ScopeID,
		Layer: proto.Uint32(uint32(h.Layer)), PayloadLength: proto.Uint64(h.PayloadLength),
		Checksum: h.Checksum, Metadata: h.Metadata,
	}
	if h.ContentType != "" {
		m.ContentType = proto.String(h.ContentType)
	}
	if ci := h.ChunkInfo; ci != nil {
		if ci.TotalChunks > math.MaxUint32 || ci.ChunkIndex > math.MaxUint32 {
			return nil, Errorf(CodeInternalError, "chunk-info: total-chunks/chunk-index do not fit the protobuf uint32")
		}
		m.ChunkInfo = &protocolv1.ChunkInfo{TotalChunks: proto.Uint32(uint32(ci.TotalChunks)),
			ChunkIndex: proto.Uint32(uint32(ci.ChunkIndex)), ChunkOffset: proto.Uint64(ci.ChunkOffset)}
	}
	if p := h.CompletionPolicy; p != nil {
		m.CompletionPolicy = &protocolv1.CompletionPolicy{MaxRetries: p.MaxRetries, RetryDelayMs: p.RetryDelayMs,
			TimeoutMs: p.TimeoutMs, MinSuccessRatio: p.MinSuccessRatio}
		if p.Mode != nil {
			m.CompletionPolicy.Mode = protocolv1.CompletionMode(*p.Mode).Enum()
		}
		if p.OnTimeout != nil {
			m.CompletionPolicy.OnTimeout = protocolv1.FailureAction(*p.OnTimeout).Enum()
		}
		if p.OnFailure != nil {
			m.CompletionPolicy.OnFailure = protocolv1.FailureAction(*p.OnFailure).Enum()
		}
	}
	return pbEncode("entity header", m)
}

func (protoCodec) UnmarshalEntityHeader(b []byte) (*EntityHeader, error) {
	var m protocolv1.EntityHeader
	if err := pbDecode("entity header", b, &m); err != nil {
		return nil, err
	}
	switch {
	case m.EntityId == nil:
		return nil, missing("entity header", "entity_id")
	case m.Layer == nil:
		return nil, missing("entity header", "layer")
	case m.PayloadLength == nil:
		return nil, missing("entity header", "payload_length")
	case *m.Layer > 3:
		return nil, Errorf(CodeEntityInvalid, "entity header: layer %d, want 0-3", *m.Layer)
	}
	h := &EntityHeader{
		EntityID: *m.EntityId, ParentID: m.ParentId, ScopeID: m.ScopeId, Layer: uint8(*m.Layer),
		ContentType: m.GetContentType(), PayloadLength: *m.PayloadLength, Checksum: m.Checksum, Metadata: m.Metadata,
	}
	if ci := m.ChunkInfo; ci != nil {
		switch {
		case ci.TotalChunks == nil:
			return nil, missing("chunk_info", "total_chunks")
		case ci.ChunkIndex == nil:
			return nil, missing("chunk_info", "chunk_index")
		case ci.ChunkOffset == nil:
			return nil, missing("chunk_info", "chunk_offset")
		}
		h.ChunkInfo = &ChunkInfo{TotalChunks: uint64(*ci.TotalChunks), ChunkIndex: uint64(*ci.ChunkIndex), ChunkOffset: *ci.ChunkOffset}
	}
	if p := m.CompletionPolicy; p != nil {
		cp := &CompletionPolicy{MaxRetries: p.MaxRetries, RetryDelayMs: p.RetryDelayMs, TimeoutMs: p.TimeoutMs, MinSuccessRatio: p.MinSuccessRatio}
		if p.Mode != nil {
			v := CompletionMode(*p.Mode)
			cp.Mode = &v
		}
		if p.OnTimeout != nil {
			v := FailureAction(*p.OnTimeout)
			cp.OnTimeout = &v
		}
		if p.OnFailure != nil {
			v := FailureAction(*p.OnFailure)
			cp.OnFailure = &v
		}
		h.CompletionPolicy = cp
	}
	if err := validateEntityHeader(h); err != nil {
		return nil, err
	}
	return h, nil
}

func (protoCodec) MarshalPipeDoc(d *PipeDoc) ([]byte, error) {
	m := &protocolv1.PipeDoc{DocId: proto.String(d.DocID), EntityId: proto.Uint32(d.EntityID), Blob: d.Blob}
	if o := d.Ownership; o != nil {
		m.Ownership = &protocolv1.OwnershipContext{OwnerId: proto.String(o.OwnerID), Scopes: o.Scopes}
		if o.GroupID != "" {
			m.Ownership.GroupId = proto.String(o.GroupID)
		}
	}
	return pbEncode("pipe-doc", m)
}

func (protoCodec) UnmarshalPipeDoc(b []byte) (*PipeDoc, error) {
	var m protocolv1.PipeDoc
	if err := pbDecode("pipe-doc", b, &m); err != nil {
		return nil, err
	}
	switch {
	case m.DocId == nil:
		return nil, missing("pipe-doc", "doc_id")
	case m.EntityId == nil:
		return nil, missing("pipe-doc", "entity_id")
	}
	d := &PipeDoc{DocID: *m.DocId, EntityID: *m.EntityId, Blob: m.Blob}
	if o := m.Ownership; o != nil {
		if o.OwnerId == nil {
			return nil, missing("ownership", "owner_id")
		}
		d.Ownership = &OwnershipContext{OwnerID: *o.OwnerId, GroupID: o.GetGroupId(), Scopes: o.Scopes}
	}
	if err := validatePipeDoc(d); err != nil {
		return nil, err
	}
	return d, nil
}
