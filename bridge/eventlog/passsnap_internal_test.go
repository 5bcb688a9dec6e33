package eventlog

import (
	"testing"
	"time"
)

// TestPassReusesCostlySnapshotOnly: a retention pass re-measures the
// snapshot unless the last scan was expensive and recent: the reuse window
// is snapshotCostFactor times the scan's cost, capped by snapshotMaxStale,
// and an empty snapshot is always re-measured.
func TestPassReusesCostlySnapshotOnly(t *testing.T) {
	for _, c := range []struct {
		bytes     int64
		age, cost time.Duration
		want      bool
	}{
		{1 << 20, 500 * time.Millisecond, time.Second, true},           // a 1 s scan half a second ago
		{1 << 20, 19 * time.Second, time.Second, true},                 // within 20x its cost
		{1 << 20, 21 * time.Second, time.Second, false},                // beyond it
		{1 << 20, 59 * time.Second, 10 * time.Second, true},            // within 20x and the minute
		{1 << 20, 61 * time.Second, 10 * time.Second, false},           // older than snapshotMaxStale
		{1 << 20, 3 * time.Millisecond, 100 * time.Microsecond, false}, // a cheap scan is redone
		{0, 100 * time.Millisecond, time.Second, false},                // an empty snapshot is redone
	} {
		if got := passReuses(c.bytes, c.age, c.cost); got != c.want {
			t.Errorf("passReuses(%d bytes, age %v, cost %v) = %t, want %t", c.bytes, c.age, c.cost, got, c.want)
		}
	}
}
