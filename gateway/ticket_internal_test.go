package gateway

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTicketExpiry: a ticket is accepted until ticketTTL has passed and
// never after (fake clock).
func TestTicketExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := newTicketStore(DefaultMaxTicketsPerTenant)
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
	ts := newTicketStore(DefaultMaxTicketsPerTenant)
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

// TestTicketCap: a tenant has at most its cap of tickets outstanding;
// one more is TOO_MANY_TICKETS with a RetryInfo until its oldest expires
// and a message naming the flag; another tenant is not affected (issue 22:
// no server-wide pool); expired tickets make room again.
func TestTicketCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 5
		ts := newTicketStore(limit)
		for i := 0; i < limit; i++ {
			if _, err := ts.issue("acme", "tok"); err != nil {
				t.Fatalf("ticket %d: %v", i, err)
			}
			time.Sleep(time.Second)
		}
		_, err := ts.issue("acme", "tok")
		if errorReason(err) != ReasonTooManyTickets || status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("ticket above the cap: %v; want ResourceExhausted %s", err, ReasonTooManyTickets)
		}
		if d, ok := retryDelay(err); !ok || d != ticketTTL-limit*time.Second {
			t.Errorf("retry delay %v (%v), want %v: when the oldest ticket expires", d, ok, ticketTTL-limit*time.Second)
		}
		if msg := status.Convert(err).Message(); !strings.Contains(msg, "--max-tickets-per-tenant") {
			t.Errorf("message %q does not name --max-tickets-per-tenant", msg)
		}
		for i := 0; i < limit; i++ {
			if _, err := ts.issue("globex", "tok2"); err != nil {
				t.Fatalf("another tenant's ticket %d: %v", i, err)
			}
		}
		time.Sleep(ticketTTL - limit*time.Second)
		if _, err := ts.issue("acme", "tok"); err != nil {
			t.Fatalf("after the oldest expired: %v", err)
		}
		time.Sleep(ticketTTL)
		ts.issue("acme", "tok")
		if n := ts.outstanding(); n != limit+1 {
			t.Errorf("%d outstanding, want %d: acme's expired ones pruned at its next ticket (1 left), globex's 5 kept until its own", n, limit+1)
		}
	})
}
