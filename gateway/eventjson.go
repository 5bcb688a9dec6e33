package gateway

import (
	"strconv"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// appendEventJSON appends ev as the REST marshaler (protojson,
// EmitUnpopulated) writes it, without reflection; false (and b to drop)
// for an event protojson would refuse or render otherwise (a string that
// is not UTF-8, a timestamp out of range). Issue 25: grpc-gateway's
// NDJSON chunk of every event was ~6% of the REST path's CPU (protojson,
// then encoding/json over the result).
func appendEventJSON(b []byte, ev *gatewayv1.Event) ([]byte, bool) {
	ok := true
	str := func(key, v string) {
		b = append(b, key...)
		if ok {
			b, ok = appendStringJSON(b, v)
		}
	}
	b = appendUint64JSON(append(b, `{"seq":`...), ev.GetSeq())
	b = append(b, `,"time":`...)
	b, ok = appendTimeJSON(b, ev.GetTime(), ok)
	str(`,"kind":`, ev.GetKind())
	str(`,"documentId":`, ev.GetDocumentId())
	b = appendUint64JSON(append(b, `,"rev":`...), ev.GetRev())
	b = appendUint64JSON(append(b, `,"since":`...), ev.GetSince())
	b = strconv.AppendUint(append(b, `,"entityId":`...), uint64(ev.GetEntityId()), 10)
	b = strconv.AppendUint(append(b, `,"scopeId":`...), uint64(ev.GetScopeId()), 10)
	b = appendEnumJSON(append(b, `,"entityStatus":`...), int32(ev.GetEntityStatus()), gatewayv1.EntityStatus_name)
	b = appendEnumJSON(append(b, `,"state":`...), int32(ev.GetState()), gatewayv1.State_name)
	str(`,"claimId":`, ev.GetClaimId())
	str(`,"claimAction":`, ev.GetClaimAction())
	str(`,"name":`, ev.GetName())
	str(`,"message":`, ev.GetMessage())
	return append(b, '}'), ok
}

// appendNDJSONEventChunk appends grpc-gateway's NDJSON chunk of ev,
// {"result": ev}: encoding/json over protojson's bytes, which compacts
// them and escapes <, >, & and U+2028/U+2029 (HTML-safe). An event whose
// JSON has any of those is left to the marshaler (false), as is one
// appendEventJSON refuses.
func appendNDJSONEventChunk(b []byte, ev *gatewayv1.Event) ([]byte, bool) {
	start := len(b)
	b = append(b, `{"result":`...)
	b, ok := appendEventJSON(b, ev)
	if !ok || htmlEscaped(b[start:]) {
		return b[:start], false
	}
	return append(b, '}'), true
}

// htmlEscaped reports whether b holds a character encoding/json escapes
// for HTML: <, >, & or U+2028/U+2029 (E2 80 A8/A9 in UTF-8). One pass
// over the bytes: bytes.ContainsAny with those two non-ASCII characters
// in its set decodes b rune by rune (2% of a small REST document's CPU).
func htmlEscaped(b []byte) bool {
	for i, c := range b {
		switch c {
		case '<', '>', '&':
			return true
		case 0xE2:
			if i+2 < len(b) && b[i+1] == 0x80 && (b[i+2] == 0xA8 || b[i+2] == 0xA9) {
				return true
			}
		}
	}
	return false
}
