package gateway

import (
	"testing"
	"time"
)

// TestClientIDsBoundedPerTenant: a tenant gets at most max tracked client
// ids; more fall back (admit false) without touching other tenants; ids
// idle longer than the idle period make room again.
func TestClientIDsBoundedPerTenant(t *testing.T) {
	c := newClientIDs(3, time.Hour)
	now := time.Now()
	for i := range 3 {
		if !c.admit("acme", string(rune('a'+i)), now) {
			t.Fatalf("id %d refused below the bound", i)
		}
	}
	if c.admit("acme", "d", now) {
		t.Error("a 4th id admitted above the bound of 3")
	}
	if !c.admit("acme", "a", now) {
		t.Error("a known id refused")
	}
	if !c.admit("globex", "x", now) {
		t.Error("another tenant refused because of acme's ids")
	}
	for i := range 10000 {
		c.admit("acme", string(rune(0x1000+i)), now)
	}
	if n := c.tracked("acme"); n != 3 {
		t.Errorf("acme tracks %d ids after 10,000 new ones, want 3", n)
	}
	if !c.admit("acme", "e", now.Add(2*time.Hour)) {
		t.Error("no room after the ids went idle")
	}
}
