package retention

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// ClientID is an anonymized client identifier: the first 16 bytes of
// HMAC-SHA256(salt, clientKey). The raw key is never stored (RRDP retention
// draft, Privacy Considerations: "hashing with a rotating salt").
type ClientID [16]byte

// Client is one tracked client (draft section "Client Tracking Mechanism":
// identifier, serial number, last access time). Position and last access are
// atomics so that a live subscription can advance its position without the
// tracker lock.
type Client struct {
	id    ClientID
	pos   atomic.Uint64 // last requested or delivered seq
	last  atomic.Int64  // unix nanoseconds of the last request or delivery end
	conns atomic.Int32  // open subscriptions; a connected client is active

	prev, next *Client  // LRU list, guarded by Tracker.mu
	away       absences // its last long absences, guarded by Tracker.mu
}

// Deliver records that seq was delivered to the client (its new position).
func (c *Client) Deliver(seq uint64) {
	if c != nil {
		c.pos.Store(seq)
	}
}

// Position is the client's current position.
func (c *Client) Position() uint64 {
	if c == nil {
		return 0
	}
	return c.pos.Load()
}

// TrackerConfig bounds the tracker.
type TrackerConfig struct {
	// SaltRotation is how often a fresh random salt is drawn.
	SaltRotation time.Duration
	// KeepSalts is how many salts (current included) are kept so that a
	// returning client is found and re-keyed under the current salt; set it
	// to cover the inactivity threshold (older entries expire anyway). At
	// least 2.
	KeepSalts int
	// MaxClients caps tracked clients; the least recently seen idle client
	// is evicted first.
	MaxClients int
	// NewClientsPerSecond and NewClientsBurst rate-limit the creation of new
	// entries; an untracked client is still served, it just does not hold
	// back pruning.
	NewClientsPerSecond float64
	NewClientsBurst     int
	// LongAbsence: absences (last disconnect to next request) at least
	// this long are recorded for the cost model (costmodel.go); shorter
	// ones are covered by the retention floor. 0: one minute.
	LongAbsence time.Duration
}

// Tracker records each client's position under an anonymized id. Safe for
// concurrent use. The clock is always passed in (simulation feeds its own).
type Tracker struct {
	cfg TrackerConfig

	mu         sync.Mutex
	salts      [][]byte // HMAC keys, newest first
	rotatedAt  time.Time
	clients    map[ClientID]*Client
	lru        Client // sentinel: lru.next is the most recently used
	limiter    *rate.Limiter
	evictions  uint64
	rateDrops  uint64
	rekeyCount uint64
	pool       pool // every client's long absences and expiries
}

// NewTracker returns an empty tracker whose first salt is drawn now.
func NewTracker(cfg TrackerConfig, now time.Time) *Tracker {
	t := &Tracker{
		cfg:     cfg,
		clients: make(map[ClientID]*Client),
		limiter: rate.NewLimiter(rate.Limit(cfg.NewClientsPerSecond), cfg.NewClientsBurst),
	}
	if cfg.NewClientsPerSecond <= 0 {
		t.limiter = rate.NewLimiter(rate.Inf, 0)
	}
	t.lru.next, t.lru.prev = &t.lru, &t.lru
	t.salts = [][]byte{newSalt()}
	t.rotatedAt = now
	return t
}

func newSalt() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return b
}

func hashKey(salt []byte, key string) ClientID {
	m := hmac.New(sha256.New, salt)
	m.Write([]byte(key))
	var id ClientID
	copy(id[:], m.Sum(nil))
	return id
}

// rotateLocked draws a new salt per elapsed period and forgets salts beyond
// KeepSalts: an entry keyed under a forgotten salt can no longer be linked
// to its client and only waits for expiry.
func (t *Tracker) rotateLocked(now time.Time) {
	if t.cfg.SaltRotation <= 0 {
		return
	}
	keep := max(t.cfg.KeepSalts, 2)
	n := int(now.Sub(t.rotatedAt) / t.cfg.SaltRotation)
	if n <= 0 {
		return
	}
	if n >= keep { // every kept salt has aged out
		clear(t.salts)
		t.salts = [][]byte{newSalt()}
		t.rotatedAt = now
		return
	}
	for range n {
		t.salts = append([][]byte{newSalt()}, t.salts...)
	}
	t.rotatedAt = t.rotatedAt.Add(time.Duration(n) * t.cfg.SaltRotation)
	if len(t.salts) > keep {
		clear(t.salts[keep:])
		t.salts = t.salts[:keep]
	}
}

func (t *Tracker) unlinkLocked(c *Client) {
	c.prev.next, c.next.prev = c.next, c.prev
	c.prev, c.next = nil, nil
}

func (t *Tracker) pushFrontLocked(c *Client) {
	c.prev, c.next = &t.lru, t.lru.next
	t.lru.next.prev = c
	t.lru.next = c
}

// Touch records a request from clientKey at position pos (the cursor it
// asked for, already clamped by the caller) and opens a connection on the
// entry. It returns nil when the client cannot be tracked (rate limit, or
// every tracked client is connected and the cap is reached). Pair with
// Release.
func (t *Tracker) Touch(clientKey string, pos uint64, now time.Time) *Client {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotateLocked(now)
	id := hashKey(t.salts[0], clientKey)
	c := t.clients[id]
	for _, salt := range t.salts[1:] {
		if c != nil {
			break
		}
		old := hashKey(salt, clientKey)
		if c = t.clients[old]; c != nil { // re-key under the current salt
			delete(t.clients, old)
			c.id = id
			t.clients[id] = c
			t.rekeyCount++
		}
	}
	if c == nil {
		if !t.limiter.AllowN(now, 1) {
			t.rateDrops++
			return nil
		}
		for len(t.clients) >= t.cfg.MaxClients {
			if !t.evictLocked() {
				return nil
			}
		}
		c = &Client{id: id}
		t.clients[id] = c
	} else {
		t.unlinkLocked(c)
		t.recordAbsenceLocked(c, now)
	}
	t.pushFrontLocked(c)
	c.pos.Store(pos)
	c.last.Store(now.UnixNano())
	c.conns.Add(1)
	return c
}

// evictLocked drops the least recently used client that has no open
// connection; false when there is none.
func (t *Tracker) evictLocked() bool {
	for c := t.lru.prev; c != &t.lru; c = c.prev {
		if c.conns.Load() == 0 {
			t.unlinkLocked(c)
			delete(t.clients, c.id)
			t.evictions++
			return true
		}
	}
	return false
}

// Release closes one connection of c at now: its last access becomes now
// and its position stays at the last delivered seq.
func (t *Tracker) Release(c *Client, now time.Time) {
	if c == nil {
		return
	}
	c.last.Store(now.UnixNano())
	c.conns.Add(-1)
}

// Active reports whether c counts at now: connected, or seen within
// inactiveAfter.
func (c *Client) Active(now time.Time, inactiveAfter time.Duration) bool {
	return c.conns.Load() > 0 || now.UnixNano()-c.last.Load() <= int64(inactiveAfter)
}

// Expire forgets clients inactive longer than inactiveAfter (draft: "delete
// tracking data for clients that have not been seen for a configurable
// period") and returns how many were removed. It also rotates the salt.
func (t *Tracker) Expire(now time.Time, inactiveAfter time.Duration) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotateLocked(now)
	n := 0
	for c := t.lru.prev; c != &t.lru; {
		p := c.prev
		if !c.Active(now, inactiveAfter) {
			t.unlinkLocked(c)
			delete(t.clients, c.id)
			t.pool.add(neverReturned) // censored: away longer than inactiveAfter
			n++
		}
		c = p // no early stop: a connected client's place in the LRU is stale
	}
	return n
}

// ClientView is what Each shows of one client.
type ClientView struct {
	Pos       uint64
	Last      time.Time
	Connected bool
	c         *Client
}

// Each calls f for every tracked client that is active at now, under the
// tracker lock (f must not call back into the tracker).
func (t *Tracker) Each(now time.Time, inactiveAfter time.Duration, f func(ClientView)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := t.lru.next; c != &t.lru; c = c.next {
		if c.Active(now, inactiveAfter) {
			f(ClientView{Pos: c.pos.Load(), Last: time.Unix(0, c.last.Load()), Connected: c.conns.Load() > 0, c: c})
		}
	}
}

// eachWithPool is Each with the pooled absences, sorted, under the same
// lock (the cost model reads both).
func (t *Tracker) eachWithPool(now time.Time, inactiveAfter time.Duration, f func(ClientView, *pool)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pool.prepare()
	t.pool.open = t.pool.open[:0]
	for c := t.lru.next; c != &t.lru; c = c.next {
		if c.conns.Load() == 0 && c.Active(now, inactiveAfter) {
			if a := now.Sub(time.Unix(0, c.last.Load())); a >= t.cfg.LongAbsence {
				t.pool.open = append(t.pool.open, seconds(a))
			}
		}
	}
	slices.Sort(t.pool.open)
	for c := t.lru.next; c != &t.lru; c = c.next {
		if c.Active(now, inactiveAfter) {
			f(ClientView{Pos: c.pos.Load(), Last: time.Unix(0, c.last.Load()), Connected: c.conns.Load() > 0, c: c}, &t.pool)
		}
	}
}

// Len is the number of tracked clients (active or not yet expired).
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.clients)
}

// TrackerStats are counters for metrics and tests.
type TrackerStats struct {
	Evictions, RateLimited, Rekeyed uint64
}

// Stats returns cumulative counters.
func (t *Tracker) Stats() TrackerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TrackerStats{Evictions: t.evictions, RateLimited: t.rateDrops, Rekeyed: t.rekeyCount}
}
