package retention

import (
	"testing"
	"time"
)

// TestIndexBoundedByBuckets: 100,000 events in 64 buckets; counts and bytes
// stay exact, boundaries round down to bucket starts (keeping more, never
// less), and a prune at such a boundary leaves index and store agreeing.
func TestIndexBoundedByBuckets(t *testing.T) {
	x := Index{MaxBuckets: 64}
	const n = 100000
	fill(&x, 1, n, t0, 10)
	if x.Buckets() > 64 || x.Len() != n || x.Bytes() != 10*n || x.Oldest() != 1 || x.Latest() != n {
		t.Fatalf("buckets %d len %d bytes %d oldest %d latest %d", x.Buckets(), x.Len(), x.Bytes(), x.Oldest(), x.Latest())
	}
	for _, s := range []uint64{2, 777, 50000, 99999} {
		f := x.Floor(s)
		if f > s || x.BytesFrom(s) != 10*(n-f+1) || x.CountFrom(s) != int(n-f+1) {
			t.Fatalf("Floor(%d) = %d, BytesFrom %d, CountFrom %d", s, f, x.BytesFrom(s), x.CountFrom(s))
		}
		if at := x.FirstAtOrAfter(t0.Add(time.Duration(s-1) * time.Minute)); at > s {
			t.Fatalf("FirstAtOrAfter(time of %d) = %d: would prune it", s, at)
		}
		if k := x.SeqKeepingBytes(10 * (n - s + 1)); x.BytesFrom(k) > 10*(n-s+1) {
			t.Fatalf("SeqKeepingBytes keeps %d bytes, more than asked", x.BytesFrom(k))
		}
	}
	f := x.Floor(50000)
	dropped, _, _, _ := x.PruneBefore(f)
	if x.Oldest() != f || dropped != int(f-1) || x.Len() != int(n-f+1) {
		t.Fatalf("prune at %d: oldest %d dropped %d len %d", f, x.Oldest(), dropped, x.Len())
	}
	fill(&x, n+1, 2*n, t0, 10)
	if x.Buckets() > 64 || x.Latest() != 2*n {
		t.Fatalf("after more appends: %d buckets, latest %d", x.Buckets(), x.Latest())
	}
}

// TestIndexAppendRange: a log loaded by ranges (the start of a large log)
// answers like one appended event by event, to bucket granularity.
func TestIndexAppendRange(t *testing.T) {
	x := Index{MaxBuckets: 64}
	for lo := uint64(1); lo <= 10000; lo += 500 {
		x.AppendRange(lo, lo+499, 500, t0.Add(time.Duration(lo-1)*time.Minute), t0.Add(time.Duration(lo+498)*time.Minute), 5000)
	}
	x.Append(10001, t0.Add(10000*time.Minute), 10)
	if x.Len() != 10001 || x.Bytes() != 100010 || x.Oldest() != 1 || x.Latest() != 10001 || x.Buckets() > 64 {
		t.Fatalf("len %d bytes %d oldest %d latest %d buckets %d", x.Len(), x.Bytes(), x.Oldest(), x.Latest(), x.Buckets())
	}
	if f := x.FirstAtOrAfter(t0.Add(1234 * time.Minute)); f != 1001 { // seq 1235's range starts at 1001
		t.Fatalf("FirstAtOrAfter = %d, want 1001", f)
	}
	if n, b, _, _ := x.PruneBefore(x.Floor(2600)); n != 2500 || b != 25000 || x.Oldest() != 2501 {
		t.Fatalf("prune: %d events %d bytes, oldest %d", n, b, x.Oldest())
	}
}

// costRetainer is a log of 1 KB a minute for ten days, a 2 MB snapshot
// (about 33 hours of events) and the cost model on, floor 1 h.
func costRetainer(t *testing.T, now time.Time) *Retainer {
	t.Helper()
	r := NewRetainer(Config{Adaptive: true, CostModel: true, InactiveAfter: 7 * 24 * time.Hour, MinAge: time.Hour, SnapshotCap: true},
		TrackerConfig{MaxClients: 100, LongAbsence: time.Hour}, now.Add(-10*24*time.Hour), nil, nil)
	for m := 0; m < 10*24*60; m++ {
		r.Appended(uint64(m+1), now.Add(-10*24*time.Hour+time.Duration(m)*time.Minute), 1000)
	}
	return r
}

// visit is a client reading to the head at t and leaving.
func visit(r *Retainer, key string, pos uint64, t time.Time) {
	r.Release(r.Touch(key, &pos, t), t)
}

// TestCostModel: a client that always came back within hours holds the
// log back while it is away; a client whose absences were all days long
// (longer than the snapshot lasts) does not, and neither counts against
// the floor.
func TestCostModel(t *testing.T) {
	now := t0.Add(30 * 24 * time.Hour)
	r := costRetainer(t, now)
	start := now.Add(-10 * 24 * time.Hour)
	seqAt := func(tm time.Time) uint64 { return uint64(tm.Sub(start)/time.Minute) + 1 }
	// "regular": back every 4 h for nine days, last seen 24 h ago.
	for tm := start; tm.Before(now.Add(-20 * time.Hour)); tm = tm.Add(4 * time.Hour) {
		visit(r, "regular", seqAt(tm), tm)
	}
	// "rare": back every 4 days, last seen 20 h ago as well.
	for _, d := range []time.Duration{236 * time.Hour, 140 * time.Hour, 44 * time.Hour, 20 * time.Hour} {
		visit(r, "rare", seqAt(now.Add(-d)), now.Add(-d))
	}
	snapshot := uint64(2 << 20)
	p := r.Plan(now, snapshot)
	want := seqAt(now.Add(-24 * time.Hour))
	if p.Clients != 1 || p.LetGo != 1 || p.KeepFrom != want {
		t.Fatalf("plan %+v: want one client counted (regular, keep from ~%d) and one let go (rare)", p, want)
	}
	// Without the cost model both count (the draft's rule).
	r.cfg.CostModel = false
	if p := r.Plan(now, snapshot); p.Clients != 2 || p.LetGo != 0 {
		t.Fatalf("draft rule: %+v, want both clients counted", p)
	}
}

// TestFloorBeatsSnapshotCap: events younger than MinAge stay even when
// they are larger than the snapshot, up to MinBytes; the hard caps still
// go below the floor.
func TestFloorBeatsSnapshotCap(t *testing.T) {
	now := t0.Add(200 * time.Minute)
	var x Index
	fill(&x, 1, 200, t0, 100) // seq s at t0+(s-1) min
	cfg := Config{Adaptive: true, InactiveAfter: time.Hour, MinAge: time.Hour, SnapshotCap: true}
	// Floor: seq 141 (t0+140 min = now-60 min) on; snapshot 1000 bytes = 10 events.
	if p := Compute(cfg, &x, nil, now, 1000); p.KeepFrom != 141 || p.Reason != ReasonMinAge {
		t.Fatalf("floor vs snapshot cap: %+v, want keep from 141 (min_age)", p)
	}
	cfg.MinBytes = 3000 // the floor holds at most 30 events
	if p := Compute(cfg, &x, nil, now, 1000); p.KeepFrom != 171 {
		t.Fatalf("floor bounded by bytes: %+v, want keep from 171", p)
	}
	cfg.MinBytes, cfg.MaxBytes = 0, 500
	if p := Compute(cfg, &x, nil, now, 1000); p.KeepFrom != 196 || p.Reason != ReasonMaxBytes {
		t.Fatalf("hard cap below the floor: %+v, want keep from 196 (max_bytes)", p)
	}
}
