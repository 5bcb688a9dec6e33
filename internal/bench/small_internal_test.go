package bench

import (
	"strings"
	"testing"
)

// topLevelID takes the id only from the Document's first two members,
// and only when both agree; anything else goes to encoding/json.
func TestTopLevelID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		id   string
		want bool
	}{
		{`{"name":"documents/abc","id":"abc","state":"PENDING"}`, "abc", true},
		{`{"name":"documents/abc","id":"abd"}`, "", false},
		{`{"id":"abc","name":"documents/abc"}`, "", false},
		{`{"name":"documents/abc","state":"x","id":"abc"}`, "", false},
		{`{"name":"documents/ab`, "", false},
	} {
		id, ok := topLevelID([]byte(tc.in))
		if ok != tc.want || id != tc.id {
			t.Errorf("topLevelID(%s) = %q, %v; want %q, %v", tc.in, id, ok, tc.id, tc.want)
		}
	}
}

// TestTargetBudget: the small-document target's budget is the machine's
// CPU per document at 0.3x the unary rate, less the client's share
// (issue 25's table: 45,183 unary calls/s on 2 CPUs give 147.5 µs per
// document; a 109 µs client leaves 38.5).
func TestTargetBudget(t *testing.T) {
	if g := targetBudget(45183, 2, 109); g < 38.4 || g > 38.6 {
		t.Errorf("targetBudget(45183, 2, 109) = %.2f, want 38.5", g)
	}
	if g := targetBudget(0, 2, 109); g != 0 {
		t.Errorf("targetBudget without a baseline = %v, want 0", g)
	}
	n := budgetNote(45183, 2, 109, 425)
	for _, want := range []string{"13555 docs/s", "148 µs per document", "client took 109", "leaving the gateway 39 µs", "used 425 (11.0x that budget)"} {
		if !strings.Contains(n, want) {
			t.Errorf("budgetNote = %q, want it to say %q", n, want)
		}
	}
	if n := budgetNote(45183, 2, 200, 425); !strings.Contains(n, "nothing is left for the gateway") {
		t.Errorf("budgetNote with a client over the budget = %q", n)
	}
}
