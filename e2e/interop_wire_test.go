package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/quic-go/quic-go"
)

// Interop wire codec, written from the drafts' text only (nothing of the
// project's quicpeer package): draft-krickert-pipestream-02 (fixed frames
// without a length) and the reference suite's draft-04 framing (every
// control frame is Type + 4-octet Length + payload; a draft-02 fixed frame
// F maps to the payload F[1] F[2] F[3] 0x00 F[4..]). The partners in
// interop_partner_*_test.go use it; interop_partners_test.go checks it
// against the frozen vectors (the repository's copy in
// quicpeer/wire/testdata/vectors).

type framing int

const (
	framingD02 framing = iota // draft-02: fixed frames carry no length
	framingD04                // draft-04 (reference suite): Type + Length + payload
)

func (f framing) String() string {
	if f == framingD04 {
		return "draft-04"
	}
	return "draft-02"
}

const (
	alpnPipeStream = "pipestream/1"

	ftStatus     = 0x50
	ftDigest     = 0x54
	ftBarrier    = 0x55
	ftGoaway     = 0x56
	ftCaps       = 0x80
	ftCheckpoint = 0x81

	connLevel   = 0xFFFFFFFF // CONNECTION_LEVEL entity id
	maxEntityID = 0xFFFFFFFC // highest assignable id (ids are mod 0xFFFFFFFD, 0 reserved)
	maxWindow   = 0x7FFFFFFE // reference MAX_WINDOW

	maxVarFrameD02   = 1<<24 - 1 // draft-02: larger Variable lengths -> 0x06
	maxControlD04    = 1 << 20   // reference MAX_CONTROL_FRAME
	maxEntityHdrD04  = 1 << 16   // reference MAX_ENTITY_HEADER
	maxEntityBodyD04 = 64 << 20  // reference MAX_PAYLOAD
	checkpointAck    = 1         // draft-04 CHECKPOINT flags bit 0
)

// Status codes (draft-02 Section 6.2.2).
const (
	stUnspecified uint8 = iota
	stPending
	stProcessing
	stComplete
	stFailed
	stCheckpoint
	stDehydrating
	stRehydrating
	stYielded
	stDeferred
	stRetrying
	stSkipped
	stAbandoned
)

var statusNames = []string{"UNSPECIFIED", "PENDING", "PROCESSING", "COMPLETE", "FAILED", "CHECKPOINT",
	"DEHYDRATING", "REHYDRATING", "YIELDED", "DEFERRED", "RETRYING", "SKIPPED", "ABANDONED"}

func statusName(s uint8) string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("0x%X", s)
}

// Error codes (draft-02 Section 11.4; 0x0D is draft-04's FRAME_ERROR).
const (
	errNoError          = 0x00
	errInternal         = 0x01
	errIntegrity        = 0x04
	errEntityInvalid    = 0x05
	errLimitExceeded    = 0x06 // draft-02 ENTITY_TOO_LARGE
	errLayerUnsupported = 0x0C
	errFrame            = 0x0D
)

var errNames = map[uint64]string{
	errNoError: "PIPESTREAM_NO_ERROR", errInternal: "PIPESTREAM_INTERNAL_ERROR", errIntegrity: "PIPESTREAM_INTEGRITY_ERROR",
	errEntityInvalid: "PIPESTREAM_ENTITY_INVALID", errLimitExceeded: "PIPESTREAM_LIMIT_EXCEEDED",
	errLayerUnsupported: "PIPESTREAM_LAYER_UNSUPPORTED", errFrame: "PIPESTREAM_FRAME_ERROR",
}

// protoErr is a protocol error with the code the connection closes with.
type protoErr struct {
	code   uint64
	detail string
}

func (e *protoErr) Error() string { return errNames[e.code] + ": " + e.detail }

func perr(code uint64, format string, a ...any) error {
	return &protoErr{code: code, detail: fmt.Sprintf(format, a...)}
}

// errName is the PIPESTREAM_* name of err ("" when err is not a protoErr).
func errName(err error) string {
	var pe *protoErr
	if errors.As(err, &pe) {
		return errNames[pe.code]
	}
	return ""
}

// ---- CBOR ----

var (
	// cborEnc is deterministic: keys length-first then bytewise, shortest ints.
	cborEnc = mustEncMode(cbor.EncOptions{Sort: cbor.SortLengthFirst})
	// cborStrict is the reference's decoder: definite lengths, no duplicate
	// keys, closed maps (unknown members are errors).
	cborStrict = mustDecMode(cbor.DecOptions{DupMapKey: cbor.DupMapKeyEnforcedAPF, IndefLength: cbor.IndefLengthForbidden,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField})
	// cborLenient is draft-02's: any valid CBOR, unknown members ignored.
	cborLenient = mustDecMode(cbor.DecOptions{})
)

func mustEncMode(o cbor.EncOptions) cbor.EncMode {
	m, err := o.EncMode()
	if err != nil {
		panic(err)
	}
	return m
}

func mustDecMode(o cbor.DecOptions) cbor.DecMode {
	m, err := o.DecMode()
	if err != nil {
		panic(err)
	}
	return m
}

func mustCBOR(v any) []byte {
	b, err := cborEnc.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// cborKeys lists the text keys of the CBOR map b.
func cborKeys(b []byte) ([]string, error) {
	var m map[string]cbor.RawMessage
	if err := cborLenient.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys, nil
}

// ---- control frames ----

// ctlFrame is one control frame. For Fixed frames f holds the draft-02
// layout without the type octet (STATUS: 15 or 19 octets), whichever
// framing carried it; for Variable frames f is the serialized body.
type ctlFrame struct {
	typ byte
	f   []byte
}

// fixedFrame frames the draft-02 fixed frame full (type octet first) in fr.
func fixedFrame(fr framing, full []byte) []byte {
	if fr == framingD02 {
		return full
	}
	payload := append(append(append([]byte{}, full[1:4]...), 0), full[4:]...)
	return varFrame(full[0], payload)
}

// varFrame is Type + 4-octet Length + body (both framings).
func varFrame(typ byte, body []byte) []byte {
	out := make([]byte, 5, 5+len(body))
	out[0] = typ
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)))
	return append(out, body...)
}

// readFrameD02 reads one draft-02 control frame.
func readFrameD02(r io.Reader) (ctlFrame, error) {
	var t [1]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return ctlFrame{}, err
	}
	switch typ := t[0]; {
	case typ >= 0x80:
		return readVarBody(r, typ, maxVarFrameD02)
	case typ == ftStatus:
		return readStatusD02(r)
	case typ == ftDigest, typ == ftBarrier, typ == ftGoaway:
		n := map[byte]int{ftDigest: 71, ftBarrier: 11, ftGoaway: 7}[typ]
		f := make([]byte, n)
		_, err := io.ReadFull(r, f)
		return ctlFrame{typ: typ, f: f}, err
	default:
		return ctlFrame{}, perr(errEntityInvalid, "unknown fixed frame type 0x%02X", typ)
	}
}

func readStatusD02(r io.Reader) (ctlFrame, error) {
	f := make([]byte, 15)
	if _, err := io.ReadFull(r, f); err != nil {
		return ctlFrame{}, err
	}
	if f[1]&0x40 != 0 { // C: cursor follows
		var c [4]byte
		if _, err := io.ReadFull(r, c[:]); err != nil {
			return ctlFrame{}, err
		}
		f = append(f, c[:]...)
	}
	if f[1]&0x80 != 0 { // E: extension header (length) + data
		var l [4]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return ctlFrame{}, err
		}
		n := binary.BigEndian.Uint32(l[:])
		if n == 0 || n > maxVarFrameD02 {
			return ctlFrame{}, perr(errEntityInvalid, "status extension length %d", n)
		}
		ext := make([]byte, n)
		if _, err := io.ReadFull(r, ext); err != nil {
			return ctlFrame{}, err
		}
		f = append(append(f, l[:]...), ext...)
	}
	return ctlFrame{typ: ftStatus, f: f}, nil
}

func readVarBody(r io.Reader, typ byte, limit uint32) (ctlFrame, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return ctlFrame{}, err
	}
	n := binary.BigEndian.Uint32(l[:])
	if n > limit {
		return ctlFrame{}, perr(errLimitExceeded, "frame 0x%02X length %d exceeds %d", typ, n, limit)
	}
	body := make([]byte, n)
	_, err := io.ReadFull(r, body)
	return ctlFrame{typ: typ, f: body}, err
}

// readFrameD04 reads one draft-04 frame the way the reference does (5-octet
// header, Length at most 1 MiB) and maps fixed payloads to the draft-02
// layout.
func readFrameD04(r io.Reader) (ctlFrame, error) {
	var h [1]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return ctlFrame{}, err
	}
	fr, err := readVarBody(r, h[0], maxControlD04)
	if err != nil {
		return fr, err
	}
	return ucfD04(fr.typ, fr.f)
}

// ucfD04 checks a draft-04 payload's length for its type and maps fixed
// payloads (p[3] is the inserted octet) to the draft-02 layout.
func ucfD04(typ byte, p []byte) (ctlFrame, error) {
	want := map[byte][]int{ftStatus: {16, 20}, ftGoaway: {8}, ftBarrier: {12}, ftDigest: {72}}[typ]
	if want == nil {
		return ctlFrame{typ: typ, f: p}, nil
	}
	if !containsInt(want, len(p)) {
		return ctlFrame{}, perr(errFrame, "frame 0x%02X payload length %d, want %v", typ, len(p), want)
	}
	f := append(append([]byte{}, p[:3]...), p[4:]...)
	return ctlFrame{typ: typ, f: f}, nil
}

// decodeUCFD04 decodes one whole draft-04 frame (a vector file).
func decodeUCFD04(b []byte) (ctlFrame, error) {
	if len(b) < 5 {
		return ctlFrame{}, perr(errFrame, "truncated UCF header")
	}
	n := binary.BigEndian.Uint32(b[1:5])
	if n > maxControlD04 {
		return ctlFrame{}, perr(errLimitExceeded, "control frame exceeds local limit")
	}
	if int(n) != len(b)-5 {
		return ctlFrame{}, perr(errFrame, "UCF length %d does not match payload %d", n, len(b)-5)
	}
	return ucfD04(b[0], b[5:])
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// ---- STATUS / GOAWAY ----

// statusFrame is a STATUS frame (draft-02 Section 6.2.1).
type statusFrame struct {
	ver, stat, depth uint8
	ext, hasCursor   bool
	entity, scope    uint32
	cursor           uint32
}

func (s statusFrame) String() string {
	if s.hasCursor {
		return fmt.Sprintf("STATUS(%d %s cursor=%d)", s.entity, statusName(s.stat), s.cursor)
	}
	return fmt.Sprintf("STATUS(%d %s)", s.entity, statusName(s.stat))
}

func isHeartbeat(s statusFrame) bool {
	return s.stat == stUnspecified && s.entity == connLevel && !s.hasCursor
}

// encodeStatus builds a STATUS frame (Ver 1, scope 0, depth 0).
func encodeStatus(fr framing, entity uint32, stat uint8, cursor *uint32) []byte {
	full := make([]byte, 16, 20)
	full[0] = ftStatus
	full[1] = 1<<4 | stat&0x0F
	binary.BigEndian.PutUint32(full[4:], entity)
	if cursor != nil {
		full[2] |= 0x40
		full = binary.BigEndian.AppendUint32(full, *cursor)
	}
	return fixedFrame(fr, full)
}

// decodeStatusLenient reads the draft-02 layout f (reserved bits ignored).
func decodeStatusLenient(f []byte) (statusFrame, error) {
	if len(f) < 15 {
		return statusFrame{}, perr(errEntityInvalid, "short STATUS")
	}
	s := statusFrame{ver: f[0] >> 4, stat: f[0] & 0x0F, ext: f[1]&0x80 != 0, hasCursor: f[1]&0x40 != 0,
		depth: f[1] >> 3 & 7, entity: binary.BigEndian.Uint32(f[3:]), scope: binary.BigEndian.Uint32(f[7:])}
	if s.hasCursor {
		if len(f) < 19 {
			return s, perr(errEntityInvalid, "STATUS C=1 without cursor")
		}
		s.cursor = binary.BigEndian.Uint32(f[15:])
	}
	if s.ver != 1 {
		return s, perr(errLayerUnsupported, "STATUS version %d", s.ver)
	}
	return s, nil
}

// decodeStatusStrict is the reference's Layer 0 decode_status.
func decodeStatusStrict(f []byte) (statusFrame, error) {
	if len(f) != 15 && len(f) != 19 {
		return statusFrame{}, perr(errFrame, "invalid STATUS payload length")
	}
	s, err := decodeStatusLenient(f)
	switch {
	case s.ver != 1:
		return s, perr(errLayerUnsupported, "unsupported STATUS version")
	case s.ext:
		return s, perr(errFrame, "Layer 0 STATUS cannot carry extensions")
	case s.hasCursor != (len(f) == 19):
		return s, perr(errFrame, "STATUS cursor flag and length disagree")
	case err != nil:
		return s, err
	case s.depth != 0 || s.scope != 0:
		return s, perr(errLayerUnsupported, "scope fields require Layer 1")
	case s.stat >= 8:
		return s, perr(errLayerUnsupported, "status requires Layer 2")
	case s.stat == stUnspecified && s.entity != connLevel:
		return s, perr(errEntityInvalid, "UNSPECIFIED is connection-level only")
	case s.hasCursor && (s.stat != stUnspecified || s.entity != connLevel):
		return s, perr(errEntityInvalid, "cursor update must be connection-level")
	}
	return s, nil
}

func encodeGoaway(fr framing, last uint32) []byte {
	full := make([]byte, 8)
	full[0] = ftGoaway
	binary.BigEndian.PutUint32(full[4:], last)
	return fixedFrame(fr, full)
}

// decodeGoaway reads the draft-02 layout f (3 reserved octets, last id).
func decodeGoaway(f []byte) (uint32, error) {
	if len(f) != 7 {
		return 0, perr(errFrame, "invalid GOAWAY length %d", len(f)+1)
	}
	return binary.BigEndian.Uint32(f[3:]), nil
}

// ---- CAPABILITIES ----

// capsMsg is the capabilities map (draft-02 Section 3.4). Pointers: a
// member is sent only when set.
type capsMsg struct {
	Layer0     *bool   `cbor:"layer0-core,omitempty"`
	Layer1     *bool   `cbor:"layer1-recursive,omitempty"`
	Layer2     *bool   `cbor:"layer2-resilience,omitempty"`
	MaxDepth   *uint64 `cbor:"max-scope-depth,omitempty"`
	MaxPerScop *uint64 `cbor:"max-entities-per-scope,omitempty"`
	MaxWindow  *uint64 `cbor:"max-window-size,omitempty"`
	Format     *uint64 `cbor:"serialization-format,omitempty"`
	Keepalive  *uint64 `cbor:"keepalive-timeout-ms,omitempty"`
}

// capsD04 is the reference's closed six-member capabilities map.
type capsD04 struct {
	Layer0    *bool   `cbor:"layer0-core,omitempty"`
	Layer1    *bool   `cbor:"layer1-recursive,omitempty"`
	Layer2    *bool   `cbor:"layer2-resilience,omitempty"`
	MaxWindow *uint32 `cbor:"max-window-size,omitempty"`
	Format    *uint8  `cbor:"serialization-format,omitempty"`
	Keepalive *uint64 `cbor:"keepalive-timeout-ms,omitempty"`
}

func ptr[T any](v T) *T { return &v }

// referenceCaps is the reference's Capabilities::default() (window 1024,
// keepalive 30000, CBOR, Layer 0 only).
func referenceCaps() capsD04 {
	return capsD04{Layer0: ptr(true), Layer1: ptr(false), Layer2: ptr(false), MaxWindow: ptr(uint32(1024)),
		Format: ptr(uint8(0)), Keepalive: ptr(uint64(30000))}
}

// plainCapsD02 is what a plain draft-02 endpoint offers: Layer 0 only.
func plainCapsD02() capsMsg {
	return capsMsg{Layer0: ptr(true), Layer1: ptr(false), Layer2: ptr(false), MaxWindow: ptr(uint64(4096)),
		Format: ptr(uint64(0)), Keepalive: ptr(uint64(30000))}
}

// decodeCapsStrict is the reference's decode_capabilities: closed map,
// every member typed, layer0 true, window 1..MAX_WINDOW, and the bytes
// equal to the canonical encoding of all six members.
func decodeCapsStrict(b []byte) (capsD04, error) {
	var c capsD04
	if err := cborStrict.Unmarshal(b, &c); err != nil {
		return c, perr(errFrame, "capabilities: %v", err)
	}
	if c.Layer0 == nil || c.Layer1 == nil || c.Layer2 == nil {
		return c, perr(errFrame, "capabilities: missing layer member")
	}
	if !*c.Layer0 {
		return c, perr(errLayerUnsupported, "Layer 0 is mandatory")
	}
	full := c
	if full.MaxWindow == nil {
		full.MaxWindow = ptr(uint32(maxWindow))
	}
	if full.Format == nil {
		full.Format = ptr(uint8(0))
	}
	if full.Keepalive == nil {
		full.Keepalive = ptr(uint64(30000))
	}
	if *full.MaxWindow == 0 || *full.MaxWindow > maxWindow {
		return c, perr(errLimitExceeded, "invalid max-window-size")
	}
	if !bytes.Equal(mustCBOR(full), b) {
		return c, perr(errFrame, "capabilities CBOR is not deterministic")
	}
	return full, nil
}

// negotiateD04 is the reference's Capabilities::negotiate (server answer).
func negotiateD04(own, peer capsD04) capsD04 {
	l1 := *own.Layer1 && *peer.Layer1
	return capsD04{Layer0: ptr(true), Layer1: ptr(l1), Layer2: ptr(l1 && *own.Layer2 && *peer.Layer2),
		MaxWindow: ptr(min(*own.MaxWindow, *peer.MaxWindow)), Format: ptr(uint8(0)),
		Keepalive: ptr(min(*own.Keepalive, *peer.Keepalive))}
}

// validateResponseD04 is the reference client's validate_response
// (implementations/rust-quinn/src/lib.rs): the server's CAPABILITIES may
// not exceed the client's offer (no layer not offered, Layer 2 only with
// Layer 1, window 1..offered, keepalive at most offered, format CBOR);
// anything else is PIPESTREAM_FRAME_ERROR (0x0D).
func validateResponseD04(offer, answer capsD04) error {
	switch {
	case !*answer.Layer0,
		*answer.Layer1 && !*offer.Layer1,
		*answer.Layer2 && (!*offer.Layer2 || !*answer.Layer1),
		answer.MaxWindow == nil || *answer.MaxWindow == 0 || *answer.MaxWindow > *offer.MaxWindow,
		answer.Keepalive == nil || *answer.Keepalive > *offer.Keepalive,
		answer.Format != nil && *answer.Format != 0:
		return perr(errFrame, "server exceeded offered capabilities: offered %s, answered %s", capsText(offer), capsText(answer))
	}
	return nil
}

// capsText prints a capsD04 for messages.
func capsText(c capsD04) string {
	v := func(p any) string {
		switch x := p.(type) {
		case *bool:
			if x != nil {
				return fmt.Sprint(*x)
			}
		case *uint32:
			if x != nil {
				return fmt.Sprint(*x)
			}
		case *uint64:
			if x != nil {
				return fmt.Sprint(*x)
			}
		case *uint8:
			if x != nil {
				return fmt.Sprint(*x)
			}
		}
		return "-"
	}
	return fmt.Sprintf("{layer0 %s layer1 %s layer2 %s window %s format %s keepalive %s}",
		v(c.Layer0), v(c.Layer1), v(c.Layer2), v(c.MaxWindow), v(c.Format), v(c.Keepalive))
}

// decodeCapsLenient is draft-02's: any valid CBOR map, unknown members
// ignored (and returned in keys), layer0-core must be true.
func decodeCapsLenient(b []byte) (capsMsg, []string, error) {
	var c capsMsg
	if err := cborLenient.Unmarshal(b, &c); err != nil {
		return c, nil, perr(errInternal, "capabilities undecodable: %v", err)
	}
	keys, _ := cborKeys(b)
	if c.Layer0 == nil || !*c.Layer0 {
		return c, keys, perr(errLayerUnsupported, "layer0-core is not true")
	}
	return c, keys, nil
}

// ---- CHECKPOINT ----

type checkpointMsg struct {
	ID       string  `cbor:"checkpoint-id"`
	Seq      uint64  `cbor:"sequence-number"`
	EntityID uint32  `cbor:"checkpoint-entity-id"`
	Scope    *uint32 `cbor:"scope-id,omitempty"`
	Flags    *uint8  `cbor:"flags,omitempty"`
	Timeout  *uint64 `cbor:"timeout-ms,omitempty"`
}

// checkpointRaw is for presence checks of the required members.
type checkpointRaw struct {
	ID       *string `cbor:"checkpoint-id"`
	Seq      *uint64 `cbor:"sequence-number"`
	EntityID *uint32 `cbor:"checkpoint-entity-id"`
	Scope    *uint32 `cbor:"scope-id"`
	Flags    *uint8  `cbor:"flags"`
	Timeout  *uint64 `cbor:"timeout-ms"`
}

// decodeCheckpointStrict is the reference's decode_checkpoint.
func decodeCheckpointStrict(b []byte) (checkpointMsg, error) {
	var r checkpointRaw
	if err := cborStrict.Unmarshal(b, &r); err != nil {
		return checkpointMsg{}, perr(errFrame, "checkpoint: %v", err)
	}
	if r.ID == nil || *r.ID == "" || len(*r.ID) > 256 || r.Seq == nil || r.EntityID == nil {
		return checkpointMsg{}, perr(errFrame, "checkpoint: missing or invalid member")
	}
	c := checkpointMsg{ID: *r.ID, Seq: *r.Seq, EntityID: *r.EntityID, Scope: r.Scope, Flags: r.Flags, Timeout: r.Timeout}
	if c.Flags == nil {
		c.Flags = ptr(uint8(0))
	}
	switch {
	case c.EntityID == 0 || c.EntityID > maxEntityID:
		return c, perr(errEntityInvalid, "invalid checkpoint-entity-id")
	case c.Scope != nil && *c.Scope != 0:
		return c, perr(errLayerUnsupported, "checkpoint scope requires Layer 1")
	case *c.Flags > checkpointAck:
		return c, perr(errFrame, "unknown checkpoint flags")
	case !bytes.Equal(mustCBOR(c), b):
		return c, perr(errFrame, "checkpoint CBOR is not deterministic")
	}
	return c, nil
}

// ---- entities ----

type chunkInfo struct {
	Total  uint64 `cbor:"total-chunks"`
	Index  uint64 `cbor:"chunk-index"`
	Offset uint64 `cbor:"chunk-offset"`
}

// entityHeader is the draft-02 EntityHeader (Section 6.7.2.1), open map.
type entityHeader struct {
	EntityID      uint32            `cbor:"entity-id"`
	ParentID      *uint32           `cbor:"parent-id,omitempty"`
	ScopeID       *uint32           `cbor:"scope-id,omitempty"`
	Layer         uint8             `cbor:"layer"`
	ContentType   string            `cbor:"content-type,omitempty"`
	PayloadLength uint64            `cbor:"payload-length"`
	Checksum      []byte            `cbor:"checksum,omitempty"`
	Metadata      map[string]string `cbor:"metadata,omitempty"`
	ChunkInfo     *chunkInfo        `cbor:"chunk-info,omitempty"`
	Completion    map[string]any    `cbor:"completion-policy,omitempty"` // read only; any member types
}

// headerD04 is the reference's closed Layer 0 header (at most six members).
type headerD04 struct {
	EntityID      *uint32 `cbor:"entity-id,omitempty"`
	ParentID      *uint32 `cbor:"parent-id,omitempty"`
	Layer         *uint8  `cbor:"layer,omitempty"`
	ContentType   *string `cbor:"content-type,omitempty"`
	PayloadLength *uint64 `cbor:"payload-length,omitempty"`
	Checksum      []byte  `cbor:"checksum,omitempty"`
}

// d04HeaderMembers are the only members a reference header may carry.
var d04HeaderMembers = []string{"entity-id", "parent-id", "layer", "content-type", "payload-length", "checksum"}

// gotEntity is one received entity: header, its raw CBOR keys, payload.
type gotEntity struct {
	hdr     entityHeader
	keys    []string
	raw     []byte // the serialized header
	payload []byte
	stream  int64
}

// plainEntity builds a draft-02 entity frame with a SHA-256 checksum.
func plainEntity(h entityHeader, payload []byte) []byte {
	sum := sha256.Sum256(payload)
	h.Checksum, h.PayloadLength = sum[:], uint64(len(payload))
	hb := mustCBOR(h)
	out := binary.BigEndian.AppendUint32(nil, uint32(len(hb)))
	return append(append(out, hb...), payload...)
}

// referenceEntity is the reference's entity_with_parent: five or six members.
func referenceEntity(id uint32, parent *uint32, payload []byte, contentType string) []byte {
	sum := sha256.Sum256(payload)
	h := headerD04{EntityID: &id, ParentID: parent, Layer: ptr(uint8(0)), ContentType: &contentType,
		PayloadLength: ptr(uint64(len(payload))), Checksum: sum[:]}
	hb := mustCBOR(h)
	out := binary.BigEndian.AppendUint32(nil, uint32(len(hb)))
	return append(append(out, hb...), payload...)
}

// splitEntity splits an entity frame into header bytes and payload.
func splitEntity(b []byte, maxHeader int) (hdr, payload []byte, err error) {
	if len(b) < 4 {
		return nil, nil, perr(errFrame, "truncated entity header length")
	}
	n := binary.BigEndian.Uint32(b)
	if int64(n) > int64(maxHeader) {
		return nil, nil, perr(errLimitExceeded, "entity header length %d exceeds %d", n, maxHeader)
	}
	if len(b) < 4+int(n) {
		return nil, nil, perr(errFrame, "truncated entity header")
	}
	return b[4 : 4+n], b[4+n:], nil
}

// decodeEntityLenient is draft-02's decode: unknown members ignored;
// entity-id, layer and payload-length required; ids not reserved;
// payload-length and checksum verified.
func decodeEntityLenient(b []byte) (gotEntity, error) {
	hb, payload, err := splitEntity(b, maxVarFrameD02)
	if err != nil {
		return gotEntity{}, err
	}
	e := gotEntity{raw: hb, payload: payload}
	if err := cborLenient.Unmarshal(hb, &e.hdr); err != nil {
		return e, perr(errEntityInvalid, "entity header: %v", err)
	}
	e.keys, _ = cborKeys(hb)
	for _, k := range []string{"entity-id", "layer", "payload-length"} {
		if !contains(e.keys, k) {
			return e, perr(errEntityInvalid, "entity header without %s", k)
		}
	}
	return e, checkEntity(e)
}

func checkEntity(e gotEntity) error {
	h := e.hdr
	switch {
	case h.EntityID == 0 || h.EntityID > maxEntityID:
		return perr(errEntityInvalid, "entity-id %d is reserved", h.EntityID)
	case h.ParentID != nil && (*h.ParentID == 0 || *h.ParentID > maxEntityID):
		return perr(errEntityInvalid, "parent-id %d is reserved", *h.ParentID)
	case h.Layer > 3:
		return perr(errEntityInvalid, "layer %d", h.Layer)
	case h.PayloadLength != uint64(len(e.payload)):
		return perr(errEntityInvalid, "payload-length %d, payload %d octets", h.PayloadLength, len(e.payload))
	case h.Checksum != nil && len(h.Checksum) != 32:
		return perr(errIntegrity, "checksum must contain 32 octets")
	}
	if h.Checksum != nil {
		if sum := sha256.Sum256(e.payload); !bytes.Equal(sum[:], h.Checksum) {
			return perr(errIntegrity, "checksum mismatch for entity %d", h.EntityID)
		}
	}
	return nil
}

// decodeEntityStrict is the reference's decode_entity: closed six-member
// map, typed members, canonical bytes, verified length and checksum.
func decodeEntityStrict(b []byte) (gotEntity, error) {
	hb, payload, err := splitEntity(b, maxEntityHdrD04)
	if err != nil {
		return gotEntity{}, err
	}
	if len(payload) > maxEntityBodyD04 {
		return gotEntity{}, perr(errLimitExceeded, "entity payload exceeds local limit")
	}
	var h headerD04
	if err := cborStrict.Unmarshal(hb, &h); err != nil {
		return gotEntity{}, strictHeaderErr(err)
	}
	if h.EntityID == nil || h.Layer == nil {
		return gotEntity{}, perr(errEntityInvalid, "entity-id or layer is absent")
	}
	if h.Checksum != nil && len(h.Checksum) != 32 {
		return gotEntity{}, perr(errIntegrity, "checksum must contain 32 octets")
	}
	e := gotEntity{raw: hb, payload: payload, hdr: entityHeader{EntityID: *h.EntityID, ParentID: h.ParentID,
		Layer: *h.Layer, Checksum: h.Checksum, PayloadLength: uint64(len(payload))}}
	if h.ContentType != nil {
		e.hdr.ContentType = *h.ContentType
	}
	if h.PayloadLength != nil {
		e.hdr.PayloadLength = *h.PayloadLength
	}
	e.keys, _ = cborKeys(hb)
	if err := checkEntity(e); err != nil {
		return e, err
	}
	if !bytes.Equal(mustCBOR(h), hb) {
		return e, perr(errFrame, "entity header CBOR is not deterministic")
	}
	return e, nil
}

func strictHeaderErr(err error) error {
	var ufe *cbor.UnknownFieldError
	if errors.As(err, &ufe) {
		return perr(errFrame, "unsupported Layer 0 entity field: %v", err)
	}
	return perr(errFrame, "entity header CBOR: %v", err)
}

// ---- TLS and QUIC ----

// partnerCert makes a throwaway self-signed certificate for 127.0.0.1 and
// localhost and writes it as PEM (the gateway's --peer-ca) into dir.
func partnerCert(t testing.TB, dir string) (tls.Certificate, string) {
	t.Helper()
	c, path, err := partnerCertE(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c, path
}

// partnerCertE is partnerCert for a goroutine the test started: an error
// instead of failing the test (internal/lint/gofatal).
func partnerCertE(dir string) (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "interop partner"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	path := filepath.Join(dir, "partner-cert.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return tls.Certificate{}, "", err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, path, nil
}

func partnerQUICConfig() *quic.Config {
	return &quic.Config{MaxIdleTimeout: 30 * time.Second, MaxIncomingStreams: 4, MaxIncomingUniStreams: 1000,
		HandshakeIdleTimeout: 10 * time.Second}
}

// listenPartner listens for QUIC on a free loopback UDP port with a
// throwaway certificate; returns the listener and the PEM to pin.
func listenPartner(t testing.TB) (*quic.Listener, string) {
	t.Helper()
	return listenPartnerConfig(t, partnerQUICConfig())
}

func listenPartnerConfig(t testing.TB, cfg *quic.Config) (*quic.Listener, string) {
	t.Helper()
	cert, pemPath := partnerCert(t, t.TempDir())
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{alpnPipeStream}, MinVersion: tls.VersionTLS13}
	ln, err := quic.ListenAddr("127.0.0.1:0", tc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, pemPath
}

// dialPartner dials addr with ALPN pipestream/1, verifying it with caPEM.
func dialPartner(ctx context.Context, addr, caPEM string) (*quic.Conn, error) {
	return dialPartnerConfig(ctx, addr, caPEM, partnerQUICConfig())
}

func dialPartnerConfig(ctx context.Context, addr, caPEM string, cfg *quic.Config) (*quic.Conn, error) {
	b, err := os.ReadFile(caPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("no certificate in %s", caPEM)
	}
	host, _, _ := net.SplitHostPort(addr)
	tc := &tls.Config{RootCAs: pool, ServerName: host, NextProtos: []string{alpnPipeStream}, MinVersion: tls.VersionTLS13}
	return quic.DialAddr(ctx, addr, tc, cfg)
}

// closeCode is the application error code conn was closed with (-1: not
// an application close), and whether the peer closed it.
func closeCode(err error) (code int64, remote bool) {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) {
		return int64(ae.ErrorCode), ae.Remote
	}
	return -1, false
}

// closeFor closes conn with err's PipeStream code (INTERNAL if none).
func closeFor(conn *quic.Conn, err error) {
	code := uint64(errInternal)
	var pe *protoErr
	if errors.As(err, &pe) {
		code = pe.code
	}
	_ = conn.CloseWithError(quic.ApplicationErrorCode(code), truncate(err.Error(), 200))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// notifier is a broadcast "something changed" signal.
type notifier struct{ ch chan struct{} }

func newNotifier() *notifier { return &notifier{ch: make(chan struct{})} }

// wake must be called with the owner's lock held.
func (n *notifier) wake() {
	close(n.ch)
	n.ch = make(chan struct{})
}

// waitFor blocks until cond (called with mu, the owner's lock, held) holds
// or ctx ends.
func (n *notifier) waitFor(ctx context.Context, mu *sync.Mutex, what string, cond func() bool) error {
	for {
		mu.Lock()
		if cond() {
			mu.Unlock()
			return nil
		}
		ch := n.ch
		mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}
