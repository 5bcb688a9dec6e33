package eventlog

import (
	"testing"
	"time"
)

// TestPassReusesRecentSnapshot: a retention pass reuses a snapshot scan
// younger than 15 s (20 times its cost for a scan slower than 0.75 s),
// never one older than snapshotMaxStale, and always re-measures an empty
// snapshot.
func TestPassReusesRecentSnapshot(t *testing.T) {
	for _, c := range []struct {
		bytes     int64
		age, cost time.Duration
		want      bool
	}{
		{1 << 20, 500 * time.Millisecond, time.Second, true},       // a 1 s scan half a second ago
		{1 << 20, 14 * time.Second, 100 * time.Millisecond, true},  // a 0.1 s scan within 15 s
		{1 << 20, 16 * time.Second, 100 * time.Millisecond, false}, // beyond 15 s
		{1 << 20, 19 * time.Second, time.Second, true},             // a slow scan: within 20x its cost
		{1 << 20, 21 * time.Second, time.Second, false},            // beyond it
		{1 << 20, 59 * time.Second, 10 * time.Second, true},        // within 20x and the minute
		{1 << 20, 61 * time.Second, 10 * time.Second, false},       // older than snapshotMaxStale
		{0, 100 * time.Millisecond, time.Second, false},            // an empty snapshot is redone
	} {
		if got := passReuses(c.bytes, c.age, c.cost); got != c.want {
			t.Errorf("passReuses(%d bytes, age %v, cost %v) = %t, want %t", c.bytes, c.age, c.cost, got, c.want)
		}
	}
}
