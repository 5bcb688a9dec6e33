package peer

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/assembly"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func input(md map[string]string, payload string) *Input {
	return &Input{Header: &wire.EntityHeader{EntityID: 1, Metadata: md, ContentType: "text/plain"}, Payload: []byte(payload), ChunkIndex: -1, MaxDepth: -1}
}

func TestPassthroughReturnsInput(t *testing.T) {
	out, err := Passthrough{}.Process(context.Background(), input(nil, "abc"))
	if err != nil || string(out.Data) != "abc" || out.ContentType != "text/plain" || out.Layer != 0 {
		t.Fatalf("got %+v, %v", out, err)
	}
	merged, _ := Passthrough{}.Rehydrate(context.Background(), []*Output{{Data: []byte("ab")}, {Data: []byte("cd")}})
	if string(merged.Data) != "abcd" {
		t.Fatalf("rehydrate = %q", merged.Data)
	}
}

func stats(t *testing.T, o *Output) TextStatsResult {
	t.Helper()
	var r TextStatsResult
	if err := json.Unmarshal(o.Data, &r); err != nil {
		t.Fatal(err)
	}
	if o.Layer != 2 || o.ContentType != "application/json" {
		t.Fatalf("layer %d type %q, want ParsedData JSON", o.Layer, o.ContentType)
	}
	return r
}

const prose = "The cat sat. The dog ran!\nDid the cat see the dog? Yes.\n"

func TestTextStats(t *testing.T) {
	out, err := TextStats{}.Process(context.Background(), input(nil, prose))
	if err != nil {
		t.Fatal(err)
	}
	r := stats(t, out)
	if r.Bytes != uint64(len(prose)) || r.Lines != 2 || r.Words != 13 || r.Sentences != 4 {
		t.Fatalf("stats = %+v", r)
	}
	if r.TopWords[0] != (WordCount{"the", 4}) || r.TopWords[1] != (WordCount{"cat", 2}) {
		t.Fatalf("top words = %+v", r.TopWords)
	}
}

// Merging the stats of any split equals the stats of the whole text.
func TestTextStatsRehydrateEqualsWhole(t *testing.T) {
	whole, _ := TextStats{}.Process(context.Background(), input(nil, prose))
	want := stats(t, whole)
	for cut := 1; cut < len(prose); cut++ {
		a, _ := TextStats{}.Process(context.Background(), input(nil, prose[:cut]))
		b, _ := TextStats{}.Process(context.Background(), input(nil, prose[cut:]))
		m, err := TextStats{}.Rehydrate(context.Background(), []*Output{a, b})
		if err != nil {
			t.Fatal(err)
		}
		got := stats(t, m)
		if got.Bytes != want.Bytes || got.Lines != want.Lines || got.Words != want.Words || got.Sentences != want.Sentences {
			t.Fatalf("cut %d (%q|%q): merged %+v, whole %+v", cut, prose[:cut], prose[cut:], got, want)
		}
	}
}

func TestSentencesFlatAndNested(t *testing.T) {
	in := input(nil, "One two.  Three\nfour!\n\nHeading\n\nLast one")
	out, err := Sentences{}.Process(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	want := "One two.\nThree four!\nHeading\nLast one\n"
	if string(out.Data) != want || out.Dehydrate != nil {
		t.Fatalf("flat = %q, want %q", out.Data, want)
	}
	in.MaxDepth = 7
	out, _ = Sentences{}.Process(context.Background(), in)
	if len(out.Dehydrate) != 4 || string(out.Dehydrate[1]) != "Three four!\n" {
		t.Fatalf("nested = %q", out.Dehydrate)
	}
	// depth budget exhausted: refuses to nest deeper
	in.Depth, in.MaxDepth = 2, 2
	out, _ = Sentences{}.Process(context.Background(), in)
	if out.Dehydrate != nil || string(out.Data) != want {
		t.Fatalf("at max depth: %+v", out)
	}
}

func TestFaultModes(t *testing.T) {
	ctx := context.Background()
	f := Fault{}
	if _, err := f.Process(ctx, input(map[string]string{MetaFault: "fail"}, "x")); !errors.Is(err, ErrInjected) {
		t.Fatalf("fail: %v", err)
	}
	in := input(map[string]string{MetaFault: "fail-once"}, "x")
	if _, err := f.Process(ctx, in); !errors.Is(err, ErrInjected) {
		t.Fatalf("fail-once attempt 0: %v", err)
	}
	in.Attempt = 1
	if out, err := f.Process(ctx, in); err != nil || string(out.Data) != "x" {
		t.Fatalf("fail-once attempt 1: %v", err)
	}
	in = input(map[string]string{MetaFault: "yield"}, "abcd")
	out, err := f.Process(ctx, in)
	if err != nil || out.Yield == nil || out.Yield.Reason != 1 {
		t.Fatalf("yield: %+v %v", out, err)
	}
	in.Resume, in.Yields = out.Yield.State, 1
	if out, err := f.Process(ctx, in); err != nil || string(out.Data) != "abcd" {
		t.Fatalf("resume: %+v %v", out, err)
	}
	in.Resume = []byte("bogus")
	if _, err := f.Process(ctx, in); err == nil {
		t.Fatal("resume with wrong state accepted")
	}
	out, err = f.Process(ctx, input(map[string]string{MetaFault: "defer", MetaClaimTTL: "1500"}, "x"))
	if err != nil || out.Defer == nil || out.Defer.TTL != 1500*time.Millisecond {
		t.Fatalf("defer: %+v %v", out, err)
	}
	if _, err := f.Process(ctx, input(map[string]string{MetaFault: "defer", MetaClaimTTL: "soon"}, "x")); err == nil {
		t.Fatal("bad claim-ttl-ms accepted")
	}
	// timeout returns at once: the engine waits for the attempt's end
	// without holding a worker.
	if _, err := f.Process(ctx, input(map[string]string{MetaFault: "timeout"}, "x")); !errors.Is(err, errStall) {
		t.Fatalf("timeout: %v", err)
	}
	once := input(map[string]string{MetaFault: "timeout-once"}, "x")
	if _, err := f.Process(ctx, once); !errors.Is(err, errStall) {
		t.Fatalf("timeout-once attempt 0: %v", err)
	}
	once.Attempt = 1
	if out, err := f.Process(ctx, once); err != nil || string(out.Data) != "x" {
		t.Fatalf("timeout-once attempt 1: %+v %v", out, err)
	}
	red := input(map[string]string{MetaFault: "fail"}, "x")
	red.Redeemed = true
	if out, err := f.Process(ctx, red); err != nil || string(out.Data) != "x" {
		t.Fatalf("redeemed entity must not fault: %v", err)
	}
	if _, err := f.Process(ctx, input(map[string]string{MetaFault: "explode"}, "x")); err == nil || !strings.Contains(err.Error(), "fail-once") {
		t.Fatalf("unknown fault: %v", err)
	}
}

func TestFaultChunks(t *testing.T) {
	in := input(map[string]string{MetaFault: "fail", MetaFaultChunks: "0, 2"}, "x")
	for idx, wantFail := range map[int]bool{0: true, 1: false, 2: true, -1: true} {
		in.ChunkIndex = idx
		_, err := Fault{}.Process(context.Background(), in)
		if (err != nil) != wantFail {
			t.Errorf("chunk %d: err %v, want failure %v", idx, err, wantFail)
		}
	}
	// fault-chunks only on the root's metadata
	in = input(map[string]string{MetaFault: "fail"}, "x")
	in.RootMeta = map[string]string{MetaFaultChunks: "3"}
	in.ChunkIndex = 1
	if _, err := (Fault{}).Process(context.Background(), in); err != nil {
		t.Fatalf("chunk 1 not listed on the root: %v", err)
	}
}

func TestProcessorsLookup(t *testing.T) {
	ps := DefaultProcessors()
	if name, _, err := ps.lookup(nil); err != nil || name != "passthrough" {
		t.Fatalf("default = %q %v", name, err)
	}
	if _, _, err := ps.lookup(map[string]string{MetaProcessor: "nope"}); !errors.Is(err, ErrUnknownProcessor) {
		t.Fatalf("unknown: %v", err)
	}
}

func u32(v uint32) *uint32 { return &v }

func TestPolicyEvaluate(t *testing.T) {
	mode := func(m wire.CompletionMode) *wire.CompletionMode { return &m }
	ratio := float32(0.6)
	S, F, K, A := outcomeSucceeded, outcomeFailed, outcomeSkipped, outcomeAbandoned
	cases := []struct {
		name string
		p    *wire.CompletionPolicy
		in   []childOutcome
		want bool
	}{
		{"strict all ok", nil, []childOutcome{S, S}, true},
		{"strict one failed", nil, []childOutcome{S, F}, false},
		{"strict abandoned", &wire.CompletionPolicy{Mode: mode(wire.ModeStrict)}, []childOutcome{S, A}, false},
		{"strict skipped excluded", nil, []childOutcome{S, K}, true},
		{"lenient one ok", &wire.CompletionPolicy{Mode: mode(wire.ModeLenient)}, []childOutcome{F, S}, true},
		{"lenient none", &wire.CompletionPolicy{Mode: mode(wire.ModeLenient)}, []childOutcome{F, F}, false},
		{"best effort none", &wire.CompletionPolicy{Mode: mode(wire.ModeBestEffort)}, []childOutcome{F, A}, true},
		{"quorum met", &wire.CompletionPolicy{Mode: mode(wire.ModeQuorum), MinSuccessRatio: &ratio}, []childOutcome{S, S, F}, true},
		{"quorum missed", &wire.CompletionPolicy{Mode: mode(wire.ModeQuorum), MinSuccessRatio: &ratio}, []childOutcome{S, F, F}, false},
		{"quorum default majority", &wire.CompletionPolicy{Mode: mode(wire.ModeQuorum)}, []childOutcome{S, F}, true},
		{"quorum default majority missed", &wire.CompletionPolicy{Mode: mode(wire.ModeQuorum)}, []childOutcome{S, F, K}, false},
		{"lenient no children", &wire.CompletionPolicy{Mode: mode(wire.ModeLenient)}, nil, false},
		{"strict no children", nil, nil, true},
	}
	// The engine records outcomes in the document's Assembly Manifest and
	// lets it evaluate the policy (docs/profile.md 5).
	for _, c := range cases {
		m := assembly.NewManifest(1, 0, c.p, 0)
		for i, o := range c.in {
			id := uint32(i + 2)
			if err := m.AddChild(id); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Settle(id, o.status()); err != nil {
				t.Fatal(err)
			}
		}
		m.Seal()
		v, err := m.Evaluate()
		if err != nil {
			t.Fatal(err)
		}
		if got := v.ParentStatus == wire.StatusComplete; got != c.want || v.Total != len(c.in) {
			t.Errorf("%s: complete = %v (total %d), want %v", c.name, got, v.Total, c.want)
		}
	}
	p := effectivePolicy(&wire.CompletionPolicy{MaxRetries: u32(2), RetryDelayMs: u32(5), TimeoutMs: u32(7)})
	if p.maxRetries != 2 || p.retryDelay != 5*time.Millisecond || p.timeout != 7*time.Millisecond || p.onFailure != wire.ActionFail {
		t.Fatalf("effective = %+v", p)
	}
	if d := effectivePolicy(nil); d.maxRetries != 3 || d.retryDelay != time.Second || d.timeout != 300*time.Second {
		t.Fatalf("defaults = %+v", d)
	}
}
