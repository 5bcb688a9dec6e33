package wire

// Codec encodes and decodes the serialized messages of Section 3.4.2 in one
// Format. Codecs are built once, immutable and safe for concurrent use.
//
// Unmarshal methods never panic on any input and return *Error:
//   - 0x05 for undecodable input, a missing required member, a value that
//     does not fit its field, or a CDDL constraint violation;
//   - 0x04 for an entity-header checksum that is not 32 octets (Section
//     10.2.1).
//
// Unknown members are ignored (docs/profile.md 1). Marshal methods return a
// new slice owned by the caller; the CBOR codec emits deterministic CBOR
// (length-first key order, shortest integers and floats).
//
// The first CAPABILITIES of a connection is always CBOR (Section 3.4); the
// session, not the codec, maps a failure to decode it to 0x01 (Section 3.4.2).
type Codec interface {
	Format() Format
	MarshalCapabilities(*Capabilities) ([]byte, error)
	UnmarshalCapabilities([]byte) (*Capabilities, error)
	MarshalCheckpoint(*CheckpointFrame) ([]byte, error)
	UnmarshalCheckpoint([]byte) (*CheckpointFrame, error)
	MarshalEntityHeader(*EntityHeader) ([]byte, error)
	UnmarshalEntityHeader([]byte) (*EntityHeader, error)
	MarshalPipeDoc(*PipeDoc) ([]byte, error)
	UnmarshalPipeDoc([]byte) (*PipeDoc, error)
}

// CodecFor returns the shared Codec of f; an unknown format gets the CBOR
// codec (the Section 3.4.2 fallback).
func CodecFor(f Format) Codec {
	if f == FormatProtobuf {
		return protoCodecInstance
	}
	return cborCodecInstance
}

// validateEntityHeader applies the checks of Sections 6.8.2.1, 9.1 and
// 10.2.1 that hold in every format.
func validateEntityHeader(h *EntityHeader) error {
	if h.EntityID == NullEntity {
		return Errorf(CodeEntityInvalid, "entity header: entity-id 0 is the reserved NULL entity")
	}
	if h.ParentID != nil && *h.ParentID == NullEntity {
		return Errorf(CodeEntityInvalid, "entity header: parent-id 0 is the reserved NULL entity")
	}
	if h.Layer > 3 {
		return Errorf(CodeEntityInvalid, "entity header: layer %d, want 0-3", h.Layer)
	}
	if h.Checksum != nil && len(h.Checksum) != 32 {
		return Errorf(CodeIntegrityError, "entity header: checksum is %d octets, SHA-256 needs 32", len(h.Checksum))
	}
	if p := h.CompletionPolicy; p != nil {
		if p.Mode != nil && *p.Mode > ModeQuorum {
			return Errorf(CodeEntityInvalid, "completion-policy: mode %d, want 0-4", *p.Mode)
		}
		if p.OnFailure != nil && *p.OnFailure > ActionDefer {
			return Errorf(CodeEntityInvalid, "completion-policy: on-failure %d, want 0-4", *p.OnFailure)
		}
		if p.OnTimeout != nil && *p.OnTimeout > ActionDefer {
			return Errorf(CodeEntityInvalid, "completion-policy: on-timeout %d, want 0-4", *p.OnTimeout)
		}
		if r := p.MinSuccessRatio; r != nil && !(*r >= 0 && *r <= 1) {
			return Errorf(CodeEntityInvalid, "completion-policy: min-success-ratio %v, want 0..1", *r)
		}
	}
	return nil
}

func validatePipeDoc(d *PipeDoc) error {
	if d.EntityID == NullEntity {
		return Errorf(CodeEntityInvalid, "pipe-doc: entity-id 0 is the reserved NULL entity")
	}
	return nil
}
