package gateway

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/randdoc"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestNDJSONEventChunkMatchesGRPCGateway: the NDJSON chunk {"result":
// event} the REST mux writes for an event (appendNDJSONEventChunk through
// the event cache) is byte for byte what grpc-gateway's marshaler writes
// (protojson, then encoding/json's HTML-safe compaction), for seeded
// random events: every field zero or set, strings with JSON and HTML
// specials, U+2028, multi-byte UTF-8 and invalid UTF-8, timestamps in and
// out of protojson's range, unknown enum numbers. EVENTJSON_SEED replays.
func TestNDJSONEventChunkMatchesGRPCGateway(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("EVENTJSON_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: EVENTJSON_SEED=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 4))
	plain := restMarshaler()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	hand := 0
	for round := range 2000 {
		ev := randomEvent(r, base)
		ev.Seq = uint64(round + 1)
		m := withEventCache(restMarshaler(), &eventCache{})
		v := map[string]any{"result": ev}
		got, gerr := m.Marshal(v)
		want, werr := plain.Marshal(v)
		if (gerr == nil) != (werr == nil) || (werr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("round %d (seed %d): error %v, grpc-gateway's %v", round, seed, gerr, werr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d (seed %d):\n got %s\nwant %s", round, seed, got, want)
		}
		if _, ok := appendNDJSONEventChunk(nil, ev); ok {
			hand++
		}
	}
	if hand < 500 {
		t.Fatalf("the hand encoder took %d of 2000 events (seed %d)", hand, seed)
	}
	t.Logf("hand encoder took %d of 2000 events", hand)
}

// randomEvent is an event with each field zero or random.
func randomEvent(r *rand.Rand, base time.Time) *gatewayv1.Event {
	s := func() string {
		if r.IntN(3) == 0 {
			return ""
		}
		if r.IntN(4) == 0 {
			return "plain-" + strconv.Itoa(r.IntN(1000))
		}
		if r.IntN(40) == 0 {
			return "bad\xffutf8"
		}
		return randdoc.String(r)
	}
	u := func() uint64 {
		if r.IntN(3) == 0 {
			return 0
		}
		return r.Uint64() >> r.IntN(64)
	}
	ev := &gatewayv1.Event{
		Time: randdoc.Timestamp(r, base), Kind: s(), DocumentId: s(), Rev: u(), Since: u(),
		EntityId: uint32(u()), ScopeId: uint32(u()), EntityStatus: gatewayv1.EntityStatus(r.IntN(8)),
		State: gatewayv1.State(r.IntN(9)), ClaimId: s(), ClaimAction: s(), Name: s(), Message: s(),
	}
	if r.IntN(2) == 0 {
		ev.Kind, ev.DocumentId, ev.Name, ev.Message = "#document", "d-1", "", "" // the common, clean event
	}
	switch r.IntN(40) {
	case 0:
		ev.Time = &timestamppb.Timestamp{Seconds: maxTimestampSeconds + 1}
	case 1:
		ev.Time = &timestamppb.Timestamp{Seconds: 1, Nanos: -1}
	}
	return ev
}

// htmlEscaped finds exactly the characters bytes.ContainsAny finds with
// the HTML-escaped set, in every position (including a truncated
// U+2028 at the end).
func TestHTMLEscapedMatchesContainsAny(t *testing.T) {
	cases := []string{"", "plain", "a<b", "a>", "&", "x\u2028y", "\u2029", "\u2027", "\u202a", "\xe2\x80", "\xe2", "é…ü", "\u2028"[:2] + "a"}
	for _, c := range cases {
		for _, pre := range []string{"", "{\"k\":\""} {
			s := []byte(pre + c)
			if got, want := htmlEscaped(s), bytes.ContainsAny(s, "<>&\u2028\u2029"); got != want {
				t.Errorf("htmlEscaped(%q) = %v, want %v", s, got, want)
			}
		}
	}
}
