package gateway

import (
	"fmt"
	"time"

	"github.com/fxamacker/cbor/v2"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// WebSocket frame encoding, draft-holmgren-at-synchronization-00, "Frame
// Format": every binary frame is a CBOR header map {op, t} followed by a CBOR
// payload map, both in deterministic encoding. op 1 is a message whose type
// name is t ("#status", "#document", "#claim", "#sync", "#info"); op -1 is an
// error frame whose payload is {error, message} ("Error Frames").

// Frame operations.
const (
	wsOpMessage = 1
	wsOpError   = -1
)

// cborEnc is built once: deterministic encoding with length-first map key
// order (RFC 7049 canonical, as DAG-CBOR and the profile use), shortest
// integers and floats, no indefinite lengths. Immutable and goroutine-safe.
var cborEnc = func() cbor.EncMode {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		panic(err) // static options; cannot fail
	}
	return em
}()

type wsHeader struct {
	Op int    `cbor:"op"`
	T  string `cbor:"t,omitempty"`
}

type wsError struct {
	Error   string `cbor:"error"`
	Message string `cbor:"message,omitempty"`
}

// wsEvent is the payload of a message frame: the draft's common fields seq
// and time (ISO 8601), then this API's event fields under the same
// lowerCamelCase names as the JSON API. Enums are their names. Zero fields
// are omitted (seq is never 0 on a sequenced event; #info carries none).
type wsEvent struct {
	Seq          uint64 `cbor:"seq,omitempty"`
	Time         string `cbor:"time"`
	DocumentID   string `cbor:"documentId,omitempty"`
	Rev          uint64 `cbor:"rev,omitempty"`
	Since        uint64 `cbor:"since,omitempty"`
	EntityID     uint32 `cbor:"entityId,omitempty"`
	ScopeID      uint32 `cbor:"scopeId,omitempty"`
	EntityStatus string `cbor:"entityStatus,omitempty"`
	State        string `cbor:"state,omitempty"`
	ClaimID      string `cbor:"claimId,omitempty"`
	ClaimAction  string `cbor:"claimAction,omitempty"`
	Name         string `cbor:"name,omitempty"`
	Message      string `cbor:"message,omitempty"`
}

// appendEventFrame appends the message frame for ev to dst. It fails when
// the frame would exceed the draft's 5 MB limit.
func appendEventFrame(dst []byte, ev *gatewayv1.Event) ([]byte, error) {
	kind := ev.GetKind()
	if kind == "" {
		kind = "#unknown"
	}
	t := time.Now().UTC()
	if ev.GetTime() != nil {
		t = ev.GetTime().AsTime().UTC()
	}
	p := wsEvent{
		Seq:         ev.GetSeq(),
		Time:        t.Format(time.RFC3339Nano),
		DocumentID:  ev.GetDocumentId(),
		Rev:         ev.GetRev(),
		Since:       ev.GetSince(),
		EntityID:    ev.GetEntityId(),
		ScopeID:     ev.GetScopeId(),
		ClaimID:     ev.GetClaimId(),
		ClaimAction: ev.GetClaimAction(),
		Name:        ev.GetName(),
		Message:     ev.GetMessage(),
	}
	if s := ev.GetEntityStatus(); s != gatewayv1.EntityStatus_ENTITY_STATUS_UNSPECIFIED {
		p.EntityStatus = s.String()
	}
	if s := ev.GetState(); s != gatewayv1.State_STATE_UNSPECIFIED {
		p.State = s.String()
	}
	return appendFrame(dst, wsHeader{Op: wsOpMessage, T: kind}, p)
}

// appendErrorFrame appends an error frame (op -1, {error, message}).
func appendErrorFrame(dst []byte, name, msg string) ([]byte, error) {
	return appendFrame(dst, wsHeader{Op: wsOpError}, wsError{Error: name, Message: msg})
}

func appendFrame(dst []byte, h wsHeader, payload any) ([]byte, error) {
	hb, err := cborEnc.Marshal(h)
	if err != nil {
		return dst, err
	}
	pb, err := cborEnc.Marshal(payload)
	if err != nil {
		return dst, err
	}
	if n := len(hb) + len(pb); n > wsMaxFrameBytes {
		return dst, fmt.Errorf("event frame is %d bytes, above the 5 MB frame limit", n)
	}
	dst = append(dst, hb...)
	return append(dst, pb...), nil
}
