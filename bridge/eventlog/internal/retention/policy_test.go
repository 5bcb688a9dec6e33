package retention

import (
	"testing"
	"time"
)

var t0 = time.Date(2025, 7, 11, 15, 0, 0, 0, time.UTC)

// fill appends seqs from..to, one per minute starting at start, size bytes each.
func fill(x *Index, from, to uint64, start time.Time, size int) {
	for s := from; s <= to; s++ {
		x.Append(s, start.Add(time.Duration(s-from)*time.Minute), size)
	}
}

func bare() Config { return Config{Adaptive: true, InactiveAfter: 7 * 24 * time.Hour} }

// TestWorkedExample is section 3.2's example: clients at 42, 37 and 45 with
// the repository at 50 give min_serial 37, and "delta files that update from
// serial numbers 1-36 can be safely deleted" (section 3.3). The draft's
// example applies no safety margin; with the default margin of 5 the
// boundary is 32.
func TestWorkedExample(t *testing.T) {
	now := time.Date(2025, 7, 11, 15, 0, 0, 0, time.UTC)
	r := NewRetainer(Config{Adaptive: true, InactiveAfter: 7 * 24 * time.Hour}, TrackerConfig{MaxClients: 10}, now, nil, nil)
	for s := uint64(1); s <= 50; s++ {
		r.Appended(s, now.Add(-time.Hour), 10)
	}
	at := func(p uint64) *uint64 { return &p }
	for _, c := range []struct {
		key  string
		pos  uint64
		last time.Time
	}{
		{"Client A", 42, time.Date(2025, 7, 10, 12, 0, 0, 0, time.UTC)},
		{"Client B", 37, time.Date(2025, 7, 11, 8, 30, 0, 0, time.UTC)},
		{"Client C", 45, time.Date(2025, 7, 11, 14, 15, 0, 0, time.UTC)},
	} {
		r.Release(r.Touch(c.key, at(c.pos), c.last), c.last)
	}
	p := r.Plan(now, 1<<30)
	if p.MinPosition != 37 || p.KeepFrom != 37 || p.Prune != 36 || p.Clients != 3 || p.Reason != ReasonMinPosition {
		t.Fatalf("margin 0: got %+v, want min_serial 37, keep from 37 (delete 1-36), 3 clients", p)
	}
	r.cfg.SafetyMargin = 5
	if p := r.Plan(now, 1<<30); p.MinPosition != 37 || p.KeepFrom != 32 || p.Prune != 31 {
		t.Fatalf("margin 5: got %+v, want min_serial 37, keep from 32", p)
	}
	// Seven days and a bit after B's last access (July 18, 10:00) A and B
	// are inactive; only C (45) counts.
	later := time.Date(2025, 7, 18, 10, 0, 0, 0, time.UTC)
	if p := r.Plan(later, 1<<30); p.MinPosition != 45 || p.Clients != 1 || p.KeepFrom != 40 {
		t.Fatalf("after inactivity: got %+v, want min_serial 45 (only C), keep from 40", p)
	}
	if n := r.Tracker().Len(); n != 1 {
		t.Fatalf("inactive clients must be deleted from tracking (draft section 5), %d left", n)
	}
	// No active client at all: min_serial starts at the current serial (50).
	if p := r.Plan(later.Add(8*24*time.Hour), 1<<30); p.MinPosition != 50 || p.Clients != 0 {
		t.Fatalf("no clients: got %+v, want min_serial 50", p)
	}
}

func TestComputeSafeguardsAndCaps(t *testing.T) {
	now := t0.Add(200 * time.Minute)
	var x Index
	fill(&x, 1, 100, t0, 100) // seq s at t0+(s-1)min, 100 bytes each: 10,000 bytes
	cases := []struct {
		name      string
		cfg       func(*Config)
		positions []uint64
		snapshot  uint64
		keep      uint64
		reason    string
	}{
		{"min position minus margin", func(c *Config) { c.SafetyMargin = 5 }, []uint64{60, 80}, 1 << 20, 55, ReasonMinPosition},
		{"no clients: current serial", nil, nil, 1 << 20, 100, ReasonMinPosition},
		{"newest N holds back", func(c *Config) { c.KeepNewest = 10 }, []uint64{95}, 1 << 20, 91, ReasonKeepNewest},
		// seq 71 was appended at t0+70min = now-130min.
		{"min age holds back", func(c *Config) { c.MinAge = 130 * time.Minute }, []uint64{95}, 1 << 20, 71, ReasonMinAge},
		{"snapshot cap beats clients", nil, []uint64{10}, 2000, 81, ReasonSnapshot},
		{"snapshot cap beats newest N", func(c *Config) { c.KeepNewest = 50 }, []uint64{10}, 2000, 81, ReasonSnapshot},
		{"max age hard cap", func(c *Config) { c.MaxAge = 150 * time.Minute }, []uint64{10}, 1 << 20, 51, ReasonMaxAge},
		{"max bytes hard cap", func(c *Config) { c.MaxBytes = 1000 }, []uint64{10}, 1 << 20, 91, ReasonMaxBytes},
		{"max events hard cap", func(c *Config) { c.MaxEvents = 7 }, []uint64{10}, 1 << 20, 94, ReasonMaxEvents},
		{"hard cap beats min age", func(c *Config) { c.MinAge = 24 * time.Hour; c.MaxEvents = 3 }, nil, 1 << 20, 98, ReasonMaxEvents},
		{"newest event always kept", func(c *Config) { c.MaxBytes = 1 }, nil, 1 << 20, 100, ReasonMaxBytes},
		{"size only keeps all under the cap", func(c *Config) { c.Adaptive = false }, nil, 1 << 20, 1, ReasonPositionNil},
		{"size only capped", func(c *Config) { c.Adaptive = false }, nil, 5000, 51, ReasonSnapshot},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := bare()
			cfg.SnapshotCap = true
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			p := Compute(cfg, &x, c.positions, now, c.snapshot)
			if p.KeepFrom != c.keep || p.Reason != c.reason {
				t.Fatalf("got keep %d (%s), want %d (%s)", p.KeepFrom, p.Reason, c.keep, c.reason)
			}
			if want := uint64(101-c.keep) * 100; p.RetainedBytes != want || p.Prune != int(c.keep-1) {
				t.Fatalf("retained %d bytes, prune %d; want %d bytes, prune %d", p.RetainedBytes, p.Prune, want, c.keep-1)
			}
			if cfg.SnapshotCap && p.RetainedBytes > max(c.snapshot, 100) {
				t.Fatalf("retained %d bytes over the snapshot size %d", p.RetainedBytes, c.snapshot)
			}
		})
	}
}

func TestRetainerIgnoresStaleAndPrunedPositions(t *testing.T) {
	now := t0.Add(10 * 24 * time.Hour)
	cfg := bare()
	cfg.PositionMaxAge = 7 * 24 * time.Hour
	r := NewRetainer(cfg, TrackerConfig{MaxClients: 10}, t0, nil, nil)
	// seqs 1..10 nine days ago, 11..20 one hour ago.
	for s := uint64(1); s <= 20; s++ {
		at := now.Add(-9 * 24 * time.Hour)
		if s > 10 {
			at = now.Add(-time.Hour)
		}
		r.Appended(s, at, 10)
	}
	old := uint64(3) // a client that keeps asking for an old cursor
	r.Touch("stuck", &old, now)
	fresh := uint64(15)
	r.Release(r.Touch("fresh", &fresh, now), now)
	p := r.Plan(now, 1<<20)
	if p.MinPosition != 15 || p.Clients != 1 {
		t.Fatalf("a position older than PositionMaxAge must not count: %+v", p)
	}
	r.Applied(p)
	// A cursor below the window is recorded at the oldest retained seq.
	zero := uint64(0)
	c := r.Touch("whole-window", &zero, now)
	if got, oldest := c.Position(), p.KeepFrom; got != oldest {
		t.Fatalf("cursor 0 recorded at %d, want the oldest retained %d", got, oldest)
	}
}

func TestIndex(t *testing.T) {
	var x Index
	if x.Oldest() != 0 || x.Latest() != 0 || x.Bytes() != 0 || x.SeqKeepingBytes(0) != 0 {
		t.Fatal("empty index")
	}
	// Gaps in seqs and a time going backwards (clamped).
	x.Append(5, t0, 10)
	x.Append(7, t0.Add(time.Minute), 20)
	x.Append(9, t0, 30)
	x.Append(9, t0, 30) // duplicate ignored
	if x.Len() != 3 || x.Bytes() != 60 || x.BytesFrom(6) != 50 || x.CountFrom(8) != 1 {
		t.Fatalf("len %d bytes %d", x.Len(), x.Bytes())
	}
	if s := x.FirstAtOrAfter(t0.Add(30 * time.Second)); s != 7 {
		t.Fatalf("FirstAtOrAfter = %d, want 7", s)
	}
	if s := x.SeqKeepingBytes(49); s != 9 {
		t.Fatalf("SeqKeepingBytes(49) = %d, want 9", s)
	}
	if s := x.SeqKeepingBytes(29); s != 10 {
		t.Fatalf("SeqKeepingBytes(29) = %d, want 10 (nothing fits)", s)
	}
	if n, b, first, last := x.PruneBefore(8); n != 2 || b != 30 || first != 5 || last != 7 || x.Oldest() != 9 || x.Bytes() != 30 {
		t.Fatalf("prune: %d %d %d %d", n, b, first, last)
	}
	// Many appends and prunes keep memory proportional to what is retained.
	for s := uint64(10); s < 100000; s++ {
		x.Append(s, t0, 1)
		if s%1000 == 0 {
			x.PruneBefore(s - 10)
		}
	}
	if cap(x.bs) > 4096 {
		t.Fatalf("index backing array %d entries for %d retained", cap(x.bs), x.Len())
	}
}
