package peer

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var quiet = slog.New(slog.DiscardHandler)

type fakeClock struct{ t atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.t.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.t.Add(int64(d)) }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.t.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func TestClaimStorePersistReplayExpiry(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s, err := OpenClaimStore(dir, quiet, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Issue(ClaimRecord{DocID: "d1", EntityID: 5, Processor: "fault", Metadata: map[string]string{MetaFault: "defer"}, Expiry: clk.now().Add(time.Minute)})
	if err != nil || a.ID == 0 {
		t.Fatalf("issue: %+v %v", a, err)
	}
	b, _ := s.Issue(ClaimRecord{EntityID: 6, Expiry: clk.now().Add(time.Second)})
	c, _ := s.Issue(ClaimRecord{EntityID: 7, Expiry: clk.now().Add(time.Minute)})
	if a.ID == b.ID || b.ID == c.ID {
		t.Fatal("duplicate claim ids")
	}
	if _, err := s.Redeem(a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Redeem(a.ID); !errors.Is(err, ErrClaimNotFound) {
		t.Fatalf("replay: %v", err)
	}
	if _, err := s.Redeem(12345); !errors.Is(err, ErrClaimNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	s.Close()
	if fi, _ := os.Stat(filepath.Join(dir, "claims.jsonl")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("claims file mode %v", fi.Mode())
	}

	// Restart: redeemed set and issued claims survive.
	clk.advance(2 * time.Second)
	s, err = OpenClaimStore(dir, quiet, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Redeem(a.ID); !errors.Is(err, ErrClaimNotFound) {
		t.Fatalf("replay after restart: %v", err)
	}
	if _, err := s.Redeem(b.ID); !errors.Is(err, ErrClaimExpired) {
		t.Fatalf("expired: %v", err)
	}
	got, err := s.Redeem(c.ID)
	if err != nil || got.EntityID != 7 {
		t.Fatalf("redeem after restart: %+v %v", got, err)
	}
	rec, _ := s.Get(a.ID)
	if rec.Processor != "fault" || rec.Metadata[MetaFault] != "defer" || rec.DocID != "d1" {
		t.Fatalf("record lost data: %+v", rec)
	}
	s.Close()

	// Past expiry + grace the records are pruned on open.
	clk.advance(time.Minute + claimRetentionGrace + time.Second)
	s, err = OpenClaimStore(dir, quiet, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.Get(a.ID); ok {
		t.Fatal("expired record not pruned")
	}
}

func TestClaimStoreTornLine(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s, _ := OpenClaimStore(dir, quiet, clk.now)
	a, _ := s.Issue(ClaimRecord{EntityID: 1, Expiry: clk.now().Add(time.Hour)})
	s.Close()
	f, _ := os.OpenFile(filepath.Join(dir, "claims.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"op":"redeem","id":`)
	f.Close()
	s, err := OpenClaimStore(dir, quiet, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Redeem(a.ID); err != nil {
		t.Fatalf("claim behind a torn line: %v", err)
	}
}

func TestClaimRedeemExactlyOnceConcurrent(t *testing.T) {
	s, _ := OpenClaimStore(t.TempDir(), quiet, nil)
	defer s.Close()
	c, _ := s.Issue(ClaimRecord{EntityID: 1, Expiry: time.Now().Add(time.Hour)})
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := s.Redeem(c.ID); err == nil {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d redemptions accepted, want 1", wins.Load())
	}
	if ok, _ := s.Settle(c.ID); ok {
		t.Fatal("settled a redeemed claim")
	}
}

func TestYieldTokens(t *testing.T) {
	b := newYieldBook(nil)
	tok := b.issue("sess-A", 9, 0, []byte("state"))
	if len(tok) != yieldTokenLen {
		t.Fatalf("len %d", len(tok))
	}
	if _, err := b.consume(tok, "sess-B", 9, 0); !errors.Is(err, ErrYieldTokenInvalid) {
		t.Fatalf("other session: %v", err)
	}
	if _, err := b.consume(tok, "sess-A", 10, 0); !errors.Is(err, ErrYieldTokenInvalid) {
		t.Fatalf("other entity: %v", err)
	}
	forged := append([]byte(nil), tok...)
	forged[30] ^= 1
	if _, err := b.consume(forged, "sess-A", 9, 0); !errors.Is(err, ErrYieldTokenInvalid) {
		t.Fatalf("forged: %v", err)
	}
	st, err := b.consume(tok, "sess-A", 9, 0)
	if err != nil || string(st) != "state" {
		t.Fatalf("consume: %q %v", st, err)
	}
	if _, err := b.consume(tok, "sess-A", 9, 0); !errors.Is(err, ErrYieldTokenConsumed) {
		t.Fatalf("replay: %v", err)
	}
	// state checksum: tamper with the held state
	tok = b.issue("sess-A", 9, 0, []byte("state"))
	for _, e := range b.outstanding {
		e.state[0] = 'X'
	}
	if _, err := b.consume(tok, "sess-A", 9, 0); !errors.Is(err, ErrYieldStateMismatch) {
		t.Fatalf("state mismatch: %v", err)
	}
}
