// Package randdoc generates randomized documents for the tests that
// compare two encodings of one document (the snapshot's fast paths with
// protobuf and protojson): every field of gatewayv1.Document that a
// snapshot carries, set or left at its default at random, with strings
// that need JSON escaping and timestamps with and without fractions.
package randdoc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// terminal are the states a stored document can be left in without a
// bridge dispatching it again on start.
var terminal = []gatewayv1.State{gatewayv1.State_SUCCEEDED, gatewayv1.State_FAILED,
	gatewayv1.State_CANCELLED, gatewayv1.State_PARTIALLY_SUCCEEDED}

// Document returns a random terminal document with id created at created
// (its create_time), without digests and claims (Digests and Claims make
// those, stored in their own tables).
func Document(r *rand.Rand, id string, created time.Time) *gatewayv1.Document {
	maybe := func() bool { return r.IntN(2) == 0 }
	d := &gatewayv1.Document{Id: id, State: terminal[r.IntN(len(terminal))], Rev: r.Uint64N(1 << 40),
		CreateTime: timestamppb.New(created)}
	if maybe() {
		d.Name = "documents/" + id // a stored name is replaced by the public one
	}
	if maybe() {
		d.ContentType = String(r)
	}
	if maybe() {
		d.DisplayName = String(r)
	}
	if maybe() {
		d.SizeBytes = r.Uint64()
	}
	if maybe() {
		d.Checksum = fmt.Sprintf("%064x", r.Uint64())
	}
	if maybe() {
		d.RequestId = id + String(r) // unique per tenant: the store's idempotency key
	}
	if maybe() {
		d.Split = &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy(r.IntN(5)), ChunkBytes: r.Uint32(),
			MaxDepth: r.Uint32N(4), Processor: String(r)}
	}
	if maybe() {
		d.CompletionPolicy = &gatewayv1.CompletionPolicy{Mode: gatewayv1.CompletionPolicy_Mode(r.IntN(6)),
			MaxRetries: r.Uint32N(10), RetryDelayMs: r.Uint32(), TimeoutMs: r.Uint32(),
			MinSuccessRatio: Float32(r), OnTimeout: gatewayv1.CompletionPolicy_Action(r.IntN(5)),
			OnFailure: gatewayv1.CompletionPolicy_Action(r.IntN(5))}
	}
	if maybe() {
		d.Metadata = map[string]string{}
		for range r.IntN(4) {
			d.Metadata[String(r)] = String(r)
		}
	}
	if maybe() {
		d.EntityCounts = &gatewayv1.EntityCounts{Total: r.Uint32(), Pending: r.Uint32N(9), Processing: r.Uint32N(9),
			Complete: r.Uint32(), Failed: r.Uint32N(3), Deferred: r.Uint32N(3), Skipped: r.Uint32N(3),
			Abandoned: r.Uint32N(3), Yielded: r.Uint32N(3), Retrying: r.Uint32N(3)}
	}
	if maybe() {
		d.Error = String(r)
	}
	if maybe() {
		d.ResultSizeBytes = r.Uint64()
	}
	if maybe() {
		d.UpdateTime = Timestamp(r, created)
	}
	if maybe() {
		d.FinishTime = Timestamp(r, created)
	}
	if maybe() {
		d.WaitReason = String(r)
	}
	d.ResultAbsent = maybe()
	return d
}

// Digests returns 0 to 3 random scope digests.
func Digests(r *rand.Rand) []*gatewayv1.ScopeDigest {
	var out []*gatewayv1.ScopeDigest
	for i := range r.IntN(4) {
		out = append(out, &gatewayv1.ScopeDigest{ScopeId: uint32(i), EntitiesProcessed: r.Uint64(),
			EntitiesSucceeded: r.Uint64N(100), EntitiesFailed: r.Uint64N(3), EntitiesDeferred: r.Uint64N(3),
			MerkleRoot: String(r), Verified: r.IntN(2) == 0})
	}
	return out
}

// Claims returns 0 to 2 random claims of document docID (unnamed, as
// stored), with ids unique across calls through next.
func Claims(r *rand.Rand, docID string, created time.Time, next *uint64) []*gatewayv1.ClaimCheck {
	var out []*gatewayv1.ClaimCheck
	for range r.IntN(3) {
		*next++
		c := &gatewayv1.ClaimCheck{ClaimId: fmt.Sprint(*next), DocumentId: docID, EntityId: r.Uint32N(100),
			ScopeId: r.Uint32N(3), State: gatewayv1.ClaimCheck_ClaimState(1 + r.IntN(4)),
			ExpireTime: timestamppb.New(created.Add(time.Hour)), CreateTime: timestamppb.New(created.Add(time.Duration(len(out))))}
		if c.State == gatewayv1.ClaimCheck_REDEEMED {
			c.RedeemTime = Timestamp(r, created)
		}
		out = append(out, c)
	}
	return out
}

// String returns a short random string: empty, ASCII, JSON specials
// (quotes, backslashes, control characters, HTML characters) or
// multi-byte UTF-8, including U+2028 and characters outside the BMP.
func String(r *rand.Rand) string {
	const alphabet = "abcXYZ019 _-./\"\\\n\r\t\b\f\x00\x01\x1f\x7f<>&'é€\u2028\u2029😀\ufffd"
	runes := []rune(alphabet)
	n := r.IntN(12)
	out := make([]rune, n)
	for i := range out {
		out[i] = runes[r.IntN(len(runes))]
	}
	return string(out)
}

// Timestamp returns a time after base with 0, 3, 6 or 9 significant
// fraction digits, or nil.
func Timestamp(r *rand.Rand, base time.Time) *timestamppb.Timestamp {
	if r.IntN(5) == 0 {
		return nil
	}
	t := base.Truncate(time.Second).Add(time.Duration(r.Int64N(1<<40)) * time.Second / 1000)
	switch r.IntN(4) {
	case 0:
		t = t.Truncate(time.Second)
	case 1:
		t = t.Truncate(time.Millisecond)
	case 2:
		t = t.Truncate(time.Microsecond).Add(time.Duration(r.IntN(1000)) * time.Microsecond)
	default:
		t = t.Add(time.Duration(r.IntN(1e9)))
	}
	return timestamppb.New(t)
}

// Float32 returns a float32 that exercises protojson's number forms:
// zero, ordinary fractions, very small and very large values (exponent
// form), and NaN and the infinities (strings).
func Float32(r *rand.Rand) float32 {
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return float32(math.NaN())
	case 2:
		return float32(math.Inf(1 - 2*r.IntN(2)))
	case 3:
		return float32(r.Float64() * 1e-9)
	case 4:
		return float32(r.Float64() * 1e30)
	default:
		return float32(r.Float64())
	}
}
