package gateway

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestTicketExpiry: a ticket is accepted until ticketTTL has passed and
// never after (fake clock).
func TestTicketExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := newTicketStore()
		early, err := ts.issue("acme", "tok")
		if err != nil {
			t.Fatal(err)
		}
		late, _ := ts.issue("acme", "tok")
		time.Sleep(ticketTTL - time.Millisecond)
		if got, ok := ts.redeem(early); !ok || got.tenant != "acme" || got.token != "tok" {
			t.Fatalf("redeem just before expiry: %+v, %v; want acme's ticket", got, ok)
		}
		time.Sleep(time.Millisecond)
		if _, ok := ts.redeem(late); ok {
			t.Fatal("a ticket was accepted at its expiry time")
		}
		if n := ts.outstanding(); n != 0 {
			t.Errorf("%d tickets outstanding after use and expiry, want 0", n)
		}
	})
}

// TestTicketSingleUse: the second redemption of a ticket fails, and so
// does one of an unknown ticket.
func TestTicketSingleUse(t *testing.T) {
	ts := newTicketStore()
	id, err := ts.issue("", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != 43 {
		t.Errorf("ticket %q is %d characters, want 43 (256 bits, base64url)", id, len(id))
	}
	if _, ok := ts.redeem(id); !ok {
		t.Fatal("first redemption failed")
	}
	if _, ok := ts.redeem(id); ok {
		t.Fatal("a ticket was accepted twice")
	}
	if _, ok := ts.redeem("not-a-ticket"); ok {
		t.Fatal("an unknown ticket was accepted")
	}
}

// TestTicketCap: at most maxTickets are outstanding; expired ones make
// room again.
func TestTicketCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := newTicketStore()
		for i := 0; i < maxTickets; i++ {
			if _, err := ts.issue("acme", "tok"); err != nil {
				t.Fatalf("ticket %d: %v", i, err)
			}
		}
		if _, err := ts.issue("acme", "tok"); err == nil {
			t.Fatal("ticket above the cap was issued")
		}
		time.Sleep(ticketTTL)
		if _, err := ts.issue("acme", "tok"); err != nil {
			t.Fatalf("after expiry: %v", err)
		}
		if n := ts.outstanding(); n != 1 {
			t.Errorf("%d outstanding after the prune, want 1", n)
		}
	})
}
