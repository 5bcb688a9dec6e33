package fence

import (
	"testing"
	"time"
)

// TestCheck: the rule of docs/scale-out.md, Leases and fencing, case by
// case; a lost lease wins over a held one, and the deadline itself is
// already too late.
func TestCheck(t *testing.T) {
	dl := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	before, at := dl.Add(-time.Nanosecond), dl
	cases := []struct {
		name string
		l    Lease
		now  time.Time
		want Verdict
	}{
		{"not held", Lease{}, before, Verdict{}},
		{"not held past deadline", Lease{}, at.Add(time.Hour), Verdict{}},
		{"held", Lease{Held: true, Epoch: 3}, before, Verdict{Fenced: true, Epoch: 3}},
		{"held at deadline", Lease{Held: true, Epoch: 3}, at, Verdict{Refused: true, Why: PastDeadline}},
		{"lost", Lease{Lost: true, Why: "taken over"}, before, Verdict{Refused: true, Why: "taken over"}},
		{"lost and held", Lease{Lost: true, Why: "taken over", Held: true, Epoch: 2}, before, Verdict{Refused: true, Why: "taken over"}},
	}
	for _, c := range cases {
		if got := Check(c.l, c.now, dl); got != c.want {
			t.Errorf("%s: Check = %+v, want %+v", c.name, got, c.want)
		}
	}
}
