package assembly_test

import (
	"slices"
	"testing"

	"github.com/pipestream/gateway/quicpeer/assembly"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func ptr[T any](v T) *T { return &v }

// finish drives children to the given final statuses along valid paths.
func finish(t *testing.T, m *assembly.Manifest, final []wire.Status) {
	t.Helper()
	for i, s := range final {
		id := uint32(i + 1)
		path := map[wire.Status][]wire.Status{
			wire.StatusComplete:  {wire.StatusProcessing, wire.StatusComplete},
			wire.StatusFailed:    {wire.StatusProcessing, wire.StatusFailed},
			wire.StatusSkipped:   {wire.StatusSkipped},
			wire.StatusAbandoned: {wire.StatusProcessing, wire.StatusAbandoned},
		}[s]
		for _, st := range path {
			if _, err := m.SetStatus(id, st); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestCompletionPolicies(t *testing.T) {
	C, F, S, A := wire.StatusComplete, wire.StatusFailed, wire.StatusSkipped, wire.StatusAbandoned
	type want struct {
		state  assembly.ResolutionState
		parent wire.Status
	}
	cases := []struct {
		name     string
		policy   *wire.CompletionPolicy
		children []wire.Status
		want     want
	}{
		{"strict-all", nil, []wire.Status{C, C}, want{assembly.StateResolved, C}},
		{"strict-one-failed", nil, []wire.Status{C, F}, want{assembly.StateFailed, F}},
		{"unspecified-is-strict", &wire.CompletionPolicy{Mode: ptr(wire.ModeUnspecified)}, []wire.Status{C, A}, want{assembly.StateFailed, F}},
		{"unknown-mode-is-strict", &wire.CompletionPolicy{Mode: ptr(wire.CompletionMode(9))}, []wire.Status{C, F}, want{assembly.StateFailed, F}},
		// A SKIP action excludes the child: it leaves STRICT's denominator
		// (docs/profile.md 5), so the parent completes, partially.
		{"strict-skipped-excluded", nil, []wire.Status{C, S}, want{assembly.StatePartial, C}},
		{"strict-abandoned", nil, []wire.Status{C, A}, want{assembly.StateFailed, F}},
		{"lenient-some", &wire.CompletionPolicy{Mode: ptr(wire.ModeLenient)}, []wire.Status{C, F, S}, want{assembly.StatePartial, C}},
		{"lenient-none", &wire.CompletionPolicy{Mode: ptr(wire.ModeLenient)}, []wire.Status{F, F}, want{assembly.StateFailed, F}},
		{"best-effort-none", &wire.CompletionPolicy{Mode: ptr(wire.ModeBestEffort)}, []wire.Status{F, S}, want{assembly.StatePartial, C}},
		{"best-effort-all", &wire.CompletionPolicy{Mode: ptr(wire.ModeBestEffort)}, []wire.Status{C}, want{assembly.StateResolved, C}},
		{"quorum-met", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum), MinSuccessRatio: ptr(float32(0.5))}, []wire.Status{C, F}, want{assembly.StatePartial, C}},
		{"quorum-missed", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum), MinSuccessRatio: ptr(float32(0.75))}, []wire.Status{C, C, F, F}, want{assembly.StateFailed, F}},
		{"quorum-skipped-not-succeeded", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum), MinSuccessRatio: ptr(float32(0.6))}, []wire.Status{C, S}, want{assembly.StateFailed, F}},
		// No min-success-ratio (or one outside [0, 1]): a simple majority.
		{"quorum-default-ratio", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum)}, []wire.Status{C, F}, want{assembly.StatePartial, C}},
		{"quorum-default-ratio-missed", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum)}, []wire.Status{C, F, F}, want{assembly.StateFailed, F}},
		{"quorum-invalid-ratio", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum), MinSuccessRatio: ptr(float32(1.5))}, []wire.Status{C, F}, want{assembly.StatePartial, C}},
		{"no-children", nil, nil, want{assembly.StateResolved, C}},
		{"lenient-no-children", &wire.CompletionPolicy{Mode: ptr(wire.ModeLenient)}, nil, want{assembly.StateFailed, F}},
		{"quorum-no-children", &wire.CompletionPolicy{Mode: ptr(wire.ModeQuorum)}, nil, want{assembly.StateResolved, C}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := assembly.NewManifest(100, 0, tc.policy, 1)
			for i := range tc.children {
				if err := m.AddChild(uint32(i + 1)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := m.Evaluate(); err == nil {
				t.Fatal("evaluated before Seal")
			}
			m.Seal()
			finish(t, m, tc.children)
			o, err := m.Evaluate()
			if err != nil {
				t.Fatal(err)
			}
			if o.State != tc.want.state || o.ParentStatus != tc.want.parent || m.State() != tc.want.state {
				t.Fatalf("got %v/%v, want %v/%v", o.State, o.ParentStatus, tc.want.state, tc.want.parent)
			}
			var wantRe []uint32
			for i, s := range tc.children {
				if s == C {
					wantRe = append(wantRe, uint32(i+1))
				}
			}
			if !slices.Equal(o.Rehydrate, wantRe) {
				t.Fatalf("rehydrate %v want %v", o.Rehydrate, wantRe)
			}
		})
	}
}

// TestRetriesKeepChildUnresolved: Section 9.1 - FAILED with retries left is
// not resolved; after the last retry FAILED is terminal.
func TestRetriesKeepChildUnresolved(t *testing.T) {
	p := &wire.CompletionPolicy{OnFailure: ptr(wire.ActionRetry), MaxRetries: ptr(uint32(1))}
	m := assembly.NewManifest(1, 0, p, 0)
	_ = m.AddChild(2)
	m.Seal()
	step := func(s wire.Status, wantResolved bool) {
		t.Helper()
		r, err := m.SetStatus(2, s)
		if err != nil || r != wantResolved {
			t.Fatalf("%v: resolved=%v err=%v", s, r, err)
		}
	}
	step(wire.StatusProcessing, false)
	step(wire.StatusFailed, false) // one retry left
	if m.Ready() || !m.RetriesLeft(2) {
		t.Fatal("FAILED with a retry left counted as resolved")
	}
	step(wire.StatusRetrying, false)
	step(wire.StatusProcessing, false)
	step(wire.StatusFailed, true) // budget spent: terminal
	if _, err := m.SetStatus(2, wire.StatusRetrying); err == nil {
		t.Fatal("RETRYING beyond max-retries accepted")
	}
	if !m.Ready() {
		t.Fatal("not ready")
	}
	// No retry policy: FAILED resolves at once, RETRYING is refused.
	m2 := assembly.NewManifest(1, 0, nil, 0)
	_ = m2.AddChild(3)
	_, _ = m2.SetStatus(3, wire.StatusProcessing)
	if r, _ := m2.SetStatus(3, wire.StatusFailed); !r {
		t.Fatal("FAILED without retries not resolved")
	}
	if _, err := m2.SetStatus(3, wire.StatusRetrying); err == nil {
		t.Fatal("RETRYING without policy accepted")
	}
}

func TestManifestErrors(t *testing.T) {
	m := assembly.NewManifest(1, 0, nil, 0)
	if err := m.AddChild(0); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal(err)
	}
	_ = m.AddChild(5)
	if err := m.AddChild(5); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal(err)
	}
	if _, err := m.SetStatus(6, wire.StatusProcessing); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal(err)
	}
	if _, err := m.SetStatus(5, wire.StatusComplete); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatal("PENDING -> COMPLETE accepted")
	}
	if _, err := m.SetStatus(5, wire.StatusPending); err != nil {
		t.Fatal("repeated status must be a no-op", err)
	}
	m.Seal()
	if err := m.AddChild(9); err == nil {
		t.Fatal("child after Seal")
	}
	if c := m.Children(); len(c) != 1 || c[0].ID != 5 || c[0].Status != wire.StatusPending {
		t.Fatal(c)
	}
}

func TestTrackerReadiness(t *testing.T) {
	tr := assembly.NewTracker()
	keys := []assembly.Key{{0, 10}, {0, 20}, {3, 10}}
	for _, k := range keys {
		m := assembly.NewManifest(k.Parent, k.Scope, nil, 0)
		if err := tr.Add(m); err != nil {
			t.Fatal(err)
		}
		for c := uint32(1); c <= 3; c++ {
			if err := tr.AddChild(k, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tr.Add(assembly.NewManifest(10, 0, nil, 0)); err == nil {
		t.Fatal("duplicate manifest accepted")
	}
	complete := func(k assembly.Key, c uint32) {
		t.Helper()
		for _, s := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
			if err := tr.SetStatus(k, c, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Finish the last manifest first, out of order.
	for c := uint32(3); c >= 1; c-- {
		complete(keys[2], c)
	}
	if _, ok := tr.PopReady(); ok {
		t.Fatal("unsealed manifest ready")
	}
	_ = tr.Seal(keys[2])
	complete(keys[0], 1)
	m, ok := tr.PopReady()
	if !ok || m.ScopeID != 3 || m.ParentID != 10 {
		t.Fatalf("PopReady = %+v %v", m, ok)
	}
	if _, ok := tr.PopReady(); ok {
		t.Fatal("second ready manifest")
	}
	// Both remaining finish; readiness in arrival order.
	for i, k := range keys[:2] {
		_ = tr.Seal(k)
		for c := uint32(2 - i); c <= 3; c++ { // keys[0] child 1 is done
			complete(k, c)
		}
	}
	a, _ := tr.PopReady()
	b, _ := tr.PopReady()
	if a == nil || b == nil || a.ParentID != 10 || b.ParentID != 20 || tr.Len() != 0 {
		t.Fatalf("%+v %+v", a, b)
	}
	tr.Remove(keys[0]) // absent: no-op
}
