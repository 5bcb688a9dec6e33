package gateway

import (
	"sync"
	"time"

	"github.com/pipestream/gateway/bridge"
)

// clientIDs bounds the X-Client-Id values each tenant can have tracked by
// the event log's retention at once (issue 11): a tenant that sends new
// ids without end would otherwise fill the log's tracker and evict every
// other tenant's clients. Up to max ids per tenant are admitted; an id not
// used for idle is forgotten; beyond max a subscriber is keyed by its
// address instead (clientKey), which adds no entry per id.
type clientIDs struct {
	max  int // <= 0: no bound
	idle time.Duration

	mu  sync.Mutex
	ids map[bridge.Tenant]map[string]time.Time // last use
}

func newClientIDs(max int, idle time.Duration) *clientIDs {
	return &clientIDs{max: max, idle: idle, ids: map[bridge.Tenant]map[string]time.Time{}}
}

// admit reports whether tenant's id may be its client key, recording its use.
func (c *clientIDs) admit(tenant bridge.Tenant, id string, now time.Time) bool {
	if c.max <= 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.ids[tenant]
	if m == nil {
		m = map[string]time.Time{}
		c.ids[tenant] = m
	}
	if _, ok := m[id]; ok {
		m[id] = now
		return true
	}
	if len(m) >= c.max {
		for k, last := range m { // full: forget the idle ones
			if now.Sub(last) > c.idle {
				delete(m, k)
			}
		}
		if len(m) >= c.max {
			return false
		}
	}
	m[id] = now
	return true
}

// tracked returns how many ids tenant has admitted.
func (c *clientIDs) tracked(tenant bridge.Tenant) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids[tenant])
}
