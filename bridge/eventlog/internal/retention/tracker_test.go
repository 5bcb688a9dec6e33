package retention

import (
	"testing"
	"time"
)

func TestTrackerSaltRotationRekeys(t *testing.T) {
	tr := NewTracker(TrackerConfig{SaltRotation: 24 * time.Hour, KeepSalts: 3, MaxClients: 10}, t0)
	c := tr.Touch("203.0.113.7", 10, t0)
	tr.Release(c, t0)
	id0 := c.id
	// Next period: the previous salt is still known, the entry is re-keyed.
	c2 := tr.Touch("203.0.113.7", 11, t0.Add(25*time.Hour))
	tr.Release(c2, t0.Add(25*time.Hour))
	if c2 != c || c.id == id0 || tr.Len() != 1 || tr.Stats().Rekeyed != 1 {
		t.Fatalf("returning client must keep its entry under a new id: same=%v len=%d stats=%+v", c2 == c, tr.Len(), tr.Stats())
	}
	// Two periods later (salts kept: 3) it is still found.
	c3 := tr.Touch("203.0.113.7", 12, t0.Add(73*time.Hour))
	tr.Release(c3, t0.Add(73*time.Hour))
	if c3 != c || tr.Len() != 1 {
		t.Fatalf("within KeepSalts periods the client must be re-keyed: same=%v len=%d", c3 == c, tr.Len())
	}
	// Absent longer than KeepSalts periods: it cannot be linked any more; a
	// new entry, the old one keeps its position until it expires.
	c4 := tr.Touch("203.0.113.7", 13, t0.Add(73*time.Hour+4*24*time.Hour))
	if c4 == c || tr.Len() != 2 {
		t.Fatalf("beyond the kept salts the client cannot be matched: same=%v len=%d", c4 == c, tr.Len())
	}
	// The raw key is never stored: the id is an HMAC under a random salt.
	if hashKey(tr.salts[0], "203.0.113.7") != c4.id || hashKey([]byte("other"), "203.0.113.7") == c4.id {
		t.Fatal("id must be HMAC-SHA256(salt, key)")
	}
}

func TestTrackerLRUCapAndRateLimit(t *testing.T) {
	tr := NewTracker(TrackerConfig{MaxClients: 3, NewClientsPerSecond: 1, NewClientsBurst: 4}, t0)
	var cs []*Client
	for i, k := range []string{"a", "b", "c"} {
		c := tr.Touch(k, uint64(i), t0)
		cs = append(cs, c)
	}
	tr.Release(cs[0], t0) // a and b idle, c connected
	tr.Release(cs[1], t0)
	tr.Touch("a", 5, t0) // a becomes most recent (connected again)
	tr.Release(cs[0], t0)
	d := tr.Touch("d", 7, t0) // evicts b: least recently used idle client
	if d == nil || tr.Len() != 3 || tr.Stats().Evictions != 1 {
		t.Fatalf("cap: len %d stats %+v", tr.Len(), tr.Stats())
	}
	tr.mu.Lock()
	_, hasB := tr.clients[hashKey(tr.salts[0], "b")]
	tr.mu.Unlock()
	if hasB {
		t.Fatal("b should have been evicted (LRU)")
	}
	// Burst of 4 is spent (a, b, c, d): a new client is served untracked.
	if e := tr.Touch("e", 1, t0); e != nil || tr.Stats().RateLimited != 1 {
		t.Fatalf("rate limit: got %v, stats %+v", e, tr.Stats())
	}
	// A second later one token is back.
	if e := tr.Touch("e", 1, t0.Add(time.Second)); e == nil {
		t.Fatal("rate limit must refill")
	}
	// Every tracked client connected and the cap reached: untracked.
	tr2 := NewTracker(TrackerConfig{MaxClients: 1}, t0)
	tr2.Touch("x", 1, t0)
	if tr2.Touch("y", 1, t0) != nil {
		t.Fatal("connected clients must never be evicted")
	}
}
