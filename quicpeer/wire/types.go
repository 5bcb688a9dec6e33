package wire

import "fmt"

// FrameType is the 1-octet UCF frame type (Section 6.1.1).
type FrameType uint8

// Frame types of the PipeStream Frame Type Registry (Section 11.2).
const (
	FrameStatus       FrameType = 0x50
	FrameScopeDigest  FrameType = 0x54
	FrameBarrier      FrameType = 0x55
	FrameGoAway       FrameType = 0x56
	FrameCapabilities FrameType = 0x80
	FrameCheckpoint   FrameType = 0x81
)

// IsFixed reports whether t is in the fixed-size class 0x50-0x7F.
func (t FrameType) IsFixed() bool { return t >= 0x50 && t <= 0x7F }

// IsVariable reports whether t is in the length-prefixed class 0x80-0xFF.
func (t FrameType) IsVariable() bool { return t >= 0x80 }

// Fixed frame sizes (Section 6.1.2).
const (
	StatusFrameLen      = 16
	CursorLen           = 4
	ExtensionHeaderLen  = 4
	ScopeDigestFrameLen = 72
	BarrierFrameLen     = 12
	GoAwayFrameLen      = 8
	// MaxVariableLength is the largest variable-frame length a receiver
	// accepts (Section 6.1.1); larger lengths are PIPESTREAM_ENTITY_TOO_LARGE.
	MaxVariableLength = 16_777_215
	// Version is the STATUS Ver field value for draft-02.
	Version = 0x1
)

// Status is the 4-bit entity status code (Section 6.2.2).
type Status uint8

// Status codes (Section 6.2.2 / 11.3).
const (
	StatusUnspecified Status = 0x0
	StatusPending     Status = 0x1
	StatusProcessing  Status = 0x2
	StatusComplete    Status = 0x3
	StatusFailed      Status = 0x4
	StatusCheckpoint  Status = 0x5
	StatusDehydrating Status = 0x6
	StatusRehydrating Status = 0x7
	StatusYielded     Status = 0x8
	StatusDeferred    Status = 0x9
	StatusRetrying    Status = 0xA
	StatusSkipped     Status = 0xB
	StatusAbandoned   Status = 0xC
)

var statusNames = [...]string{"UNSPECIFIED", "PENDING", "PROCESSING", "COMPLETE", "FAILED",
	"CHECKPOINT", "DEHYDRATING", "REHYDRATING", "YIELDED", "DEFERRED", "RETRYING", "SKIPPED", "ABANDONED"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(0x%X)", uint8(s))
}

// Layer returns the protocol layer that introduces s (0 or 2; UNSPECIFIED is 0).
func (s Status) Layer() int {
	if s >= StatusYielded && s <= StatusAbandoned {
		return 2
	}
	return 0
}

// Special entity IDs.
const (
	NullEntity       uint32 = 0          // reserved, never assigned (Section 9.1)
	ConnectionEntity uint32 = 0xFFFFFFFF // CONNECTION_LEVEL (heartbeat)
	IDModulus        uint32 = 0xFFFFFFFD // MAX of Section 9.1 / 9.3
	MaxScopeDepth           = 7
)

// StatusFrame is a decoded STATUS frame (Section 6.2.1), including the
// optional cursor update (C=1) and extension (E=1).
//
// Ext aliases the buffer passed to ParseStatus; it is valid only until that
// buffer is reused. Copy it if you keep it.
type StatusFrame struct {
	Status   Status
	Depth    uint8 // D, 0-7 (Layer 1)
	EntityID uint32
	ScopeID  uint32
	// HasCursor is the C flag; Cursor is the new cursor value.
	HasCursor bool
	Cursor    uint32
	// HasExt is the E flag; Ext is the extension data after the 4-octet
	// Extension Length (Yield layout for YIELDED, Claim Check layout for
	// DEFERRED, opaque otherwise).
	HasExt bool
	Ext    []byte
	// ExtSkipped is the Extension Length of an extension the
	// ControlReader skipped unread (SetCompleteExtLimit: a COMPLETE
	// extension above the receiver's limit, Section 6.6.1); Ext is nil
	// then. 0 when the data is in Ext. Never encoded.
	ExtSkipped uint32
}

// YieldExtension is the Yield extension layout (Section 6.6.2, Stat=0x8).
type YieldExtension struct {
	Reason uint8
	Token  []byte // aliases the parsed buffer
}

// ClaimCheckExtension is the Claim Check extension layout (Section 6.6.3, Stat=0x9).
type ClaimCheckExtension struct {
	ClaimID      uint64
	ExpiryMicros uint64 // Unix epoch microseconds
}

// ScopeDigestFrame is a SCOPE_DIGEST frame (Section 6.3).
type ScopeDigestFrame struct {
	ScopeID    uint32
	Processed  uint64
	Succeeded  uint64
	Failed     uint64
	Deferred   uint64
	MerkleRoot [32]byte
}

// BarrierFrame is a BARRIER frame (Section 6.4).
type BarrierFrame struct {
	Released       bool // S bit
	ScopeID        uint32
	ParentEntityID uint32
}

// GoAwayFrame is a GOAWAY frame (Section 6.5).
type GoAwayFrame struct {
	LastEntityID uint32
}

// Format is the negotiated serialization format (Section 3.4.2 / 11.5).
type Format uint8

const (
	FormatCBOR     Format = 0
	FormatProtobuf Format = 1
)

func (f Format) String() string {
	switch f {
	case FormatCBOR:
		return "cbor"
	case FormatProtobuf:
		return "protobuf"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// Capabilities is the CONNECT capabilities structure (Section 3.4). Optional
// members are pointers: nil means absent (the draft default applies).
type Capabilities struct {
	Layer0Core          bool    `cbor:"layer0-core"`
	Layer1Recursive     bool    `cbor:"layer1-recursive"`
	Layer2Resilience    bool    `cbor:"layer2-resilience"`
	MaxScopeDepth       *uint64 `cbor:"max-scope-depth,omitempty"`
	MaxEntitiesPerScope *uint64 `cbor:"max-entities-per-scope,omitempty"`
	MaxWindowSize       *uint64 `cbor:"max-window-size,omitempty"`
	SerializationFormat *Format `cbor:"serialization-format,omitempty"`
	KeepaliveTimeoutMs  *uint64 `cbor:"keepalive-timeout-ms,omitempty"`
}

// CheckpointFrame is the CHECKPOINT message (Section 9.3, type 0x81).
type CheckpointFrame struct {
	CheckpointID       string  `cbor:"checkpoint-id"`
	SequenceNumber     uint64  `cbor:"sequence-number"`
	CheckpointEntityID uint32  `cbor:"checkpoint-entity-id"`
	ScopeID            *uint32 `cbor:"scope-id,omitempty"`
	Flags              *uint64 `cbor:"flags,omitempty"`
	TimeoutMs          *uint64 `cbor:"timeout-ms,omitempty"`
}

// ChunkInfo is chunk-info (Section 6.8.2.2).
type ChunkInfo struct {
	TotalChunks uint64 `cbor:"total-chunks"`
	ChunkIndex  uint64 `cbor:"chunk-index"`
	ChunkOffset uint64 `cbor:"chunk-offset"`
}

// CompletionMode (Section 8.3).
type CompletionMode uint8

const (
	ModeUnspecified CompletionMode = 0 // treated as STRICT
	ModeStrict      CompletionMode = 1
	ModeLenient     CompletionMode = 2
	ModeBestEffort  CompletionMode = 3
	ModeQuorum      CompletionMode = 4
)

// FailureAction (Section 8.3).
type FailureAction uint8

const (
	ActionUnspecified FailureAction = 0 // treated as FAIL
	ActionFail        FailureAction = 1
	ActionSkip        FailureAction = 2
	ActionRetry       FailureAction = 3
	ActionDefer       FailureAction = 4
)

// CompletionPolicy is completion-policy (Section 8.3). Absent members are nil.
type CompletionPolicy struct {
	Mode            *CompletionMode `cbor:"mode,omitempty"`
	MaxRetries      *uint32         `cbor:"max-retries,omitempty"`    // default 3
	RetryDelayMs    *uint32         `cbor:"retry-delay-ms,omitempty"` // default 1000
	TimeoutMs       *uint32         `cbor:"timeout-ms,omitempty"`     // default 300000
	MinSuccessRatio *float32        `cbor:"min-success-ratio,omitempty"`
	OnTimeout       *FailureAction  `cbor:"on-timeout,omitempty"`
	OnFailure       *FailureAction  `cbor:"on-failure,omitempty"`
}

// EntityHeader is entity-header (Section 6.8.2.1). Optional members are
// pointers/nil when absent.
type EntityHeader struct {
	EntityID         uint32            `cbor:"entity-id"`
	ParentID         *uint32           `cbor:"parent-id,omitempty"`
	ScopeID          *uint32           `cbor:"scope-id,omitempty"`
	Layer            uint8             `cbor:"layer"`
	ContentType      string            `cbor:"content-type,omitempty"`
	PayloadLength    uint64            `cbor:"payload-length"`
	Checksum         []byte            `cbor:"checksum,omitempty"` // exactly 32 octets when present
	Metadata         map[string]string `cbor:"metadata,omitempty"`
	ChunkInfo        *ChunkInfo        `cbor:"chunk-info,omitempty"`
	CompletionPolicy *CompletionPolicy `cbor:"completion-policy,omitempty"`
}

// PipeDoc is the application envelope carried in a root entity payload
// (Section 7). Its EntityID MUST match the enclosing header's entity-id.
type PipeDoc struct {
	DocID     string            `cbor:"doc-id"`
	EntityID  uint32            `cbor:"entity-id"`
	Ownership *OwnershipContext `cbor:"ownership,omitempty"`
	// Blob is the profile extension carrying a whole document's content
	// (BlobBag, data layer 0) in the root entity; see docs/profile.md 4.
	Blob []byte `cbor:"blob,omitempty"`
}

// OwnershipContext is ownership-context (Appendix C).
type OwnershipContext struct {
	OwnerID string   `cbor:"owner-id"`
	GroupID string   `cbor:"group-id,omitempty"`
	Scopes  []string `cbor:"scopes,omitempty"`
}

// StoppingPointValidation is stopping-point-validation (Section 9.7).
type StoppingPointValidation struct {
	StateChecksum    []byte  `cbor:"state-checksum,omitempty"`
	BytesProcessed   *uint64 `cbor:"bytes-processed,omitempty"`
	ChildrenComplete *uint64 `cbor:"children-complete,omitempty"`
	ChildrenTotal    *uint64 `cbor:"children-total,omitempty"`
	IsResumable      *bool   `cbor:"is-resumable,omitempty"`
	CheckpointRef    string  `cbor:"checkpoint-ref,omitempty"`
}
