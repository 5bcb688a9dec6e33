package gateway

import (
	"math"
	"math/bits"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The snapshot's REST forms encode documents with the hand-written
// appenders below instead of protojson (51 % of the CPU of the NDJSON
// stream through grpc-gateway, docs/performance.md): the same JSON that
// the REST marshaler (protojson, EmitUnpopulated) writes, field for field
// (TestSnapshotJSONMatchesProtojson compares them on randomized
// documents). A document the appenders cannot render as protojson would
// (a string that is not UTF-8, a timestamp outside protojson's range,
// entities, which a snapshot never carries) makes them return false, and
// the caller falls back to protojson for that chunk.

// appendChunkJSON appends c as the REST marshaler would.
func appendChunkJSON(b []byte, c *gatewayv1.SnapshotChunk) ([]byte, bool) {
	b = append(b, `{"seq":`...)
	b = appendUint64JSON(b, c.GetSeq())
	b = append(b, `,"documents":[`...)
	for i, d := range c.GetDocuments() {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		if b, ok = appendDocumentJSON(b, d); !ok {
			return b, false
		}
	}
	b = append(b, `],"last":`...)
	b = strconv.AppendBool(b, c.GetLast())
	b = append(b, `,"totalDocuments":`...)
	b = appendUint64JSON(b, c.GetTotalDocuments())
	return append(b, '}'), true
}

// appendDocumentJSON appends d as the REST marshaler would.
func appendDocumentJSON(b []byte, d *gatewayv1.Document) ([]byte, bool) {
	if len(d.GetEntities()) > 0 {
		return b, false
	}
	ok := true
	str := func(key, v string) {
		b = append(b, key...)
		if ok {
			b, ok = appendStringJSON(b, v)
		}
	}
	str(`{"name":`, d.GetName())
	str(`,"id":`, d.GetId())
	b = appendEnumJSON(append(b, `,"state":`...), int32(d.GetState()), gatewayv1.State_name)
	str(`,"contentType":`, d.GetContentType())
	str(`,"displayName":`, d.GetDisplayName())
	b = appendUint64JSON(append(b, `,"sizeBytes":`...), d.GetSizeBytes())
	str(`,"checksum":`, d.GetChecksum())
	str(`,"requestId":`, d.GetRequestId())
	b = append(b, `,"split":`...)
	if sp := d.GetSplit(); sp == nil {
		b = append(b, "null"...)
	} else {
		b = appendEnumJSON(append(b, `{"strategy":`...), int32(sp.GetStrategy()), gatewayv1.SplitStrategy_name)
		b = strconv.AppendUint(append(b, `,"chunkBytes":`...), uint64(sp.GetChunkBytes()), 10)
		b = strconv.AppendUint(append(b, `,"maxDepth":`...), uint64(sp.GetMaxDepth()), 10)
		str(`,"processor":`, sp.GetProcessor())
		b = append(b, '}')
	}
	b = append(b, `,"completionPolicy":`...)
	b = appendPolicyJSON(b, d.GetCompletionPolicy())
	b = append(b, `,"metadata":{`...)
	if md := d.GetMetadata(); len(md) > 0 {
		keys := make([]string, 0, len(md))
		for k := range md {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			str("", k)
			str(":", md[k])
		}
	}
	b = append(b, `},"entityCounts":`...)
	b = appendCountsJSON(b, d.GetEntityCounts())
	b = append(b, `,"entities":[],"digests":[`...)
	for i, g := range d.GetDigests() {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(append(b, `{"scopeId":`...), uint64(g.GetScopeId()), 10)
		b = appendUint64JSON(append(b, `,"entitiesProcessed":`...), g.GetEntitiesProcessed())
		b = appendUint64JSON(append(b, `,"entitiesSucceeded":`...), g.GetEntitiesSucceeded())
		b = appendUint64JSON(append(b, `,"entitiesFailed":`...), g.GetEntitiesFailed())
		b = appendUint64JSON(append(b, `,"entitiesDeferred":`...), g.GetEntitiesDeferred())
		str(`,"merkleRoot":`, g.GetMerkleRoot())
		b = strconv.AppendBool(append(b, `,"verified":`...), g.GetVerified())
		b = append(b, '}')
	}
	b = append(b, `],"claimChecks":[`...)
	for i, c := range d.GetClaimChecks() {
		if i > 0 {
			b = append(b, ',')
		}
		str(`{"name":`, c.GetName())
		str(`,"claimId":`, c.GetClaimId())
		str(`,"documentId":`, c.GetDocumentId())
		b = strconv.AppendUint(append(b, `,"entityId":`...), uint64(c.GetEntityId()), 10)
		b = strconv.AppendUint(append(b, `,"scopeId":`...), uint64(c.GetScopeId()), 10)
		b = appendEnumJSON(append(b, `,"state":`...), int32(c.GetState()), gatewayv1.ClaimCheck_ClaimState_name)
		b = append(b, `,"expireTime":`...)
		b, ok = appendTimeJSON(b, c.GetExpireTime(), ok)
		b = append(b, `,"createTime":`...)
		b, ok = appendTimeJSON(b, c.GetCreateTime(), ok)
		b = append(b, `,"redeemTime":`...)
		b, ok = appendTimeJSON(b, c.GetRedeemTime(), ok)
		b = append(b, '}')
	}
	b = append(b, ']')
	str(`,"error":`, d.GetError())
	b = appendUint64JSON(append(b, `,"rev":`...), d.GetRev())
	b = appendUint64JSON(append(b, `,"resultSizeBytes":`...), d.GetResultSizeBytes())
	b = append(b, `,"createTime":`...)
	b, ok = appendTimeJSON(b, d.GetCreateTime(), ok)
	b = append(b, `,"updateTime":`...)
	b, ok = appendTimeJSON(b, d.GetUpdateTime(), ok)
	b = append(b, `,"finishTime":`...)
	b, ok = appendTimeJSON(b, d.GetFinishTime(), ok)
	str(`,"waitReason":`, d.GetWaitReason())
	b = strconv.AppendBool(append(b, `,"resultAbsent":`...), d.GetResultAbsent())
	return append(b, '}'), ok
}

func appendPolicyJSON(b []byte, p *gatewayv1.CompletionPolicy) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	b = appendEnumJSON(append(b, `{"mode":`...), int32(p.GetMode()), gatewayv1.CompletionPolicy_Mode_name)
	b = strconv.AppendUint(append(b, `,"maxRetries":`...), uint64(p.GetMaxRetries()), 10)
	b = strconv.AppendUint(append(b, `,"retryDelayMs":`...), uint64(p.GetRetryDelayMs()), 10)
	b = strconv.AppendUint(append(b, `,"timeoutMs":`...), uint64(p.GetTimeoutMs()), 10)
	b = appendFloat32JSON(append(b, `,"minSuccessRatio":`...), p.GetMinSuccessRatio())
	b = appendEnumJSON(append(b, `,"onTimeout":`...), int32(p.GetOnTimeout()), gatewayv1.CompletionPolicy_Action_name)
	b = appendEnumJSON(append(b, `,"onFailure":`...), int32(p.GetOnFailure()), gatewayv1.CompletionPolicy_Action_name)
	return append(b, '}')
}

func appendCountsJSON(b []byte, c *gatewayv1.EntityCounts) []byte {
	if c == nil {
		return append(b, "null"...)
	}
	for i, f := range [...]struct {
		key string
		v   uint32
	}{
		{`{"total":`, c.GetTotal()}, {`,"pending":`, c.GetPending()}, {`,"processing":`, c.GetProcessing()},
		{`,"complete":`, c.GetComplete()}, {`,"failed":`, c.GetFailed()}, {`,"deferred":`, c.GetDeferred()},
		{`,"skipped":`, c.GetSkipped()}, {`,"abandoned":`, c.GetAbandoned()}, {`,"yielded":`, c.GetYielded()},
		{`,"retrying":`, c.GetRetrying()},
	} {
		_ = i
		b = strconv.AppendUint(append(b, f.key...), uint64(f.v), 10)
	}
	return append(b, '}')
}

// appendUint64JSON: protojson writes 64-bit integers as strings.
func appendUint64JSON(b []byte, v uint64) []byte {
	return append(strconv.AppendUint(append(b, '"'), v, 10), '"')
}

// appendEnumJSON writes the value's name, or its number when it has none
// (as protojson does).
func appendEnumJSON(b []byte, v int32, names map[int32]string) []byte {
	if n, ok := names[v]; ok {
		return append(append(append(b, '"'), n...), '"')
	}
	return strconv.AppendInt(b, int64(v), 10)
}

// appendFloat32JSON is protojson's float formatting (encoding/json's):
// NaN and the infinities as strings, exponent form outside [1e-6, 1e21).
func appendFloat32JSON(b []byte, f float32) []byte {
	n := float64(f)
	switch {
	case math.IsNaN(n):
		return append(b, `"NaN"`...)
	case math.IsInf(n, 1):
		return append(b, `"Infinity"`...)
	case math.IsInf(n, -1):
		return append(b, `"-Infinity"`...)
	}
	format := byte('f')
	if abs := float32(math.Abs(n)); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, n, format, -1, 32)
	if format == 'e' {
		if l := len(b); l >= 4 && b[l-4] == 'e' && b[l-3] == '-' && b[l-2] == '0' {
			b[l-2] = b[l-1]
			b = b[:l-1]
		}
	}
	return b
}

// Timestamp range of protojson (0001-01-01 to 9999-12-31).
const (
	minTimestampSeconds = -62135596800
	maxTimestampSeconds = 253402300799
)

// appendTimeJSON is protojson's Timestamp: RFC 3339 in UTC with 0, 3, 6
// or 9 fraction digits, null when unset; ok turns false (and stays) for a
// timestamp protojson refuses.
func appendTimeJSON(b []byte, t *timestamppb.Timestamp, ok bool) ([]byte, bool) {
	if t == nil {
		return append(b, "null"...), ok
	}
	secs, nanos := t.GetSeconds(), t.GetNanos()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds || nanos < 0 || nanos > 999999999 {
		return b, false
	}
	b = append(b, '"')
	b = time.Unix(secs, int64(nanos)).UTC().AppendFormat(b, "2006-01-02T15:04:05")
	if nanos != 0 {
		digits := 9
		switch {
		case nanos%1000000 == 0:
			digits, nanos = 3, nanos/1000000
		case nanos%1000 == 0:
			digits, nanos = 6, nanos/1000
		}
		b = append(b, '.')
		s := strconv.AppendInt(nil, int64(nanos), 10)
		for range digits - len(s) {
			b = append(b, '0')
		}
		b = append(b, s...)
	}
	return append(b, `Z"`...), ok
}

// appendStringJSON is protojson's string escaping: quotes, backslashes
// and control characters only; false for a string that is not UTF-8.
func appendStringJSON(b []byte, s string) ([]byte, bool) {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				return b, false
			}
			i += n
			continue
		}
		if c >= ' ' && c != '"' && c != '\\' {
			i++
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, `\u`...)
			b = append(b, "0000"[1+(bits.Len32(uint32(c))-1)/4:]...)
			b = strconv.AppendUint(b, uint64(c), 16)
		}
		i++
		start = i
	}
	return append(append(b, s[start:]...), '"'), true
}
