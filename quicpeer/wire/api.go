package wire

// This file lists the codec's API contract. Implementations: the fixed
// frames in status.go, scopedigest.go, barrier.go and goaway.go; stream-0
// reading and variable frames in varframe.go; draft-04 framing in
// framing.go; the frame, header and CHECKPOINT types in types.go;
// capabilities.go; entity frames in entity.go; the codecs in serialize.go,
// cbor.go (with the fast header path in cborfast.go) and protobuf.go;
// ids.go, transitions.go, merkle.go; limits in params.go, errors in
// errors.go.
//
//   Fixed frames (byte-slice API, quic-go style; Append never allocates when
//   cap(b) suffices; Length agrees with Append):
//     func ParseStatus(b []byte) (StatusFrame, int, error)  // 0 allocs
//     func (f *StatusFrame) Append(b []byte) []byte
//     func (f *StatusFrame) Length() int
//     func (f *StatusFrame) Yield() (YieldExtension, error)        // Stat=YIELDED, E=1
//     func (f *StatusFrame) ClaimCheck() (ClaimCheckExtension, error) // Stat=DEFERRED, E=1
//     func AppendYieldExt(b []byte, y YieldExtension) []byte
//     func AppendClaimCheckExt(b []byte, c ClaimCheckExtension) []byte
//     func AppendInlineResultExt(b []byte, c Codec, h *EntityHeader, payload []byte) ([]byte, error)
//     func (f *StatusFrame) InlineResult(c Codec, maxExt int) (*EntityHeader, []byte, error) // Stat=COMPLETE, E=1 (profile 4.3.2)
//     ParseScopeDigest / ParseBarrier / ParseGoAway + Append/Length alike.
//
//   Control stream reader (stream 0):
//     type ControlReader  // wraps an io.Reader; bounded internal buffer
//     func NewControlReader(r io.Reader, maxVar int) *ControlReader
//     func (r *ControlReader) Next() (Frame, error)
//     func (r *ControlReader) SetCompleteExtLimit(n int) // longer COMPLETE extensions skipped unread (ExtSkipped)
//   Frame is a tagged union: Type FrameType and one of Status, ScopeDigest,
//   Barrier, GoAway (values), or Body []byte for variable frames
//   (CAPABILITIES/CHECKPOINT; the body is valid until the next call to Next).
//   Unknown variable types are skipped; unknown fixed types -> *Error 0x05;
//   lengths > MaxVariableLength -> *Error 0x06.
//     func AppendVariable(b []byte, t FrameType, body []byte) []byte
//
//   Serialization (Section 3.4.2): a Codec per Format, built once, immutable:
//     type Codec interface {
//       Format() Format
//       MarshalCapabilities(*Capabilities) ([]byte, error)   // always CBOR on the wire for CONNECT
//       UnmarshalCapabilities([]byte) (*Capabilities, error)
//       MarshalCheckpoint(*CheckpointFrame) ([]byte, error)
//       UnmarshalCheckpoint([]byte) (*CheckpointFrame, error)
//       MarshalEntityHeader(*EntityHeader) ([]byte, error)
//       UnmarshalEntityHeader([]byte) (*EntityHeader, error)  // validates: id != 0, parent != 0, layer <= 3, checksum len 32 (0x04)
//       MarshalPipeDoc(*PipeDoc) ([]byte, error)
//       UnmarshalPipeDoc([]byte) (*PipeDoc, error)
//     }
//     func CodecFor(f Format) Codec
//
//   Entity frames (Section 6.8):
//     func WriteEntityHeader(w io.Writer, c Codec, h *EntityHeader) error // 4-octet len + header
//     func ReadEntityHeader(r io.Reader, c Codec, maxHeader int) (*EntityHeader, error)
//     type PayloadReader  // io.Reader over the payload that hashes as it reads;
//                         // at EOF checks length == PayloadLength (else 0x05) and
//                         // checksum (else 0x04) and returns the *Error instead of io.EOF.
//     func NewPayloadReader(r io.Reader, h *EntityHeader) *PayloadReader
//     func (p *PayloadReader) Init(r io.Reader, h *EntityHeader) // same, for an embedded PayloadReader
//
//   State machine (Section 6.2.3):
//     func ValidTransition(from, to Status) bool
//     func (s Status) IsTerminal() bool  // COMPLETE, SKIPPED, ABANDONED (FAILED per policy)
//     func CheckLayer(s Status, layer2 bool) error  // 0x0C when Layer 2 status without Layer 2
//
//   IDs and cursor (Section 9.1, 9.3):
//     func NextID(lastAssigned uint32) uint32
//     func WindowSize(cursor, lastAssigned uint32) uint32
//     func IsBefore(a, b uint32) bool
//     type IDSpace struct{...} // cursor, last_assigned, max window, resolved set; Assign() (uint32, bool); Resolve(id) (newCursor uint32, advanced bool)
//
//   Merkle (Section 9.5):
//     type Leaf struct{ EntityID uint32; Status Status }
//     func MerkleRoot(leaves []Leaf) [32]byte // sorts by entity ID ascending
//
// Additions (implemented; see the files for the contracts):
//
//   Frame (varframe.go): Type plus one of Status / ScopeDigest / Barrier /
//     GoAway / Body; ControlReader.Next returns io.EOF at a clean end of
//     stream, *Error 0x05 when the stream ends inside a frame, and passes
//     other read errors through unchanged.
//   func CheckStatusFrame(f *StatusFrame, layer1, layer2 bool) error // 0x05 / 0x0C frame-local rules
//   func IsResolved(s Status, retriesLeft bool) bool                 // Section 9.1 cursor resolution
//   func ValidateCapabilities(c *Capabilities) error                 // 0x0C layer0 false, 0x07 depth, 0x06 window
//   func Negotiate(local, remote *Capabilities) Negotiated           // Section 3.4, profile 1
//   func Answer(local, remote *Capabilities) Capabilities            // a server's CAPABILITIES: the negotiated set
//   func ValidateAnswer(offer, answer *Capabilities) error           // 0x0D answer above the offer (draft-04 client)
//   const MaxSafeWindow = 0x7FFFFFFE                                  // effective max/default window
//   func NewIDSpace(maxWindow uint32) *IDSpace; NewIDSpaceAfter(maxWindow, lastAssigned uint32) *IDSpace
//   (*IDSpace) Cursor, LastAssigned, Outstanding, MaxWindow, InFlight(id)
//   (*PayloadReader) Sum() [32]byte, N() uint64
//   DefaultMaxEntityHeader (params.go), MaxExtensionLength, MaxYieldToken
