package pgstore_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// Short lease timings for tests: lease 2 s, renew every 300 ms, local
// deadline 2 - 0.6 = 1.4 s after the last good renewal.
var testLease = pgstore.Options{LeaseDuration: 2 * time.Second, RenewInterval: 300 * time.Millisecond, LeaseMargin: 600 * time.Millisecond}

func openLease(t *testing.T, dsn, id string) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := testLease
	o.ReplicaID = id
	s, err := pgstore.Open(ctx, dsn, o)
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// lostHook records what SetLeaseLostHook reports.
type lostHook struct {
	mu  sync.Mutex
	ids []string
	at  time.Time
	ch  chan struct{}
}

func newLostHook(s *pgstore.Store) *lostHook {
	h := &lostHook{ch: make(chan struct{}, 1)}
	s.SetLeaseLostHook(func(ids []string) {
		h.mu.Lock()
		h.ids = append(h.ids, ids...)
		h.at = time.Now()
		h.mu.Unlock()
		select {
		case h.ch <- struct{}{}:
		default:
		}
	})
	return h
}

func (h *lostHook) wait(t *testing.T, within time.Duration) ([]string, time.Time) {
	t.Helper()
	select {
	case <-h.ch:
	case <-time.After(within):
		t.Fatalf("lease-lost hook not called within %v", within)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ids...), h.at
}

func create(t *testing.T, s *pgstore.Store, id string) *store.DocumentRecord {
	t.Helper()
	rec := doc(id, "")
	if _, err := s.Commit(context.Background(), &store.Batch{Create: rec}); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return rec
}

func update(s *pgstore.Store, rec *store.DocumentRecord, prev uint64, st gatewayv1.State) error {
	up := &store.DocumentRecord{Tenant: rec.Tenant, Doc: proto.Clone(rec.Doc).(*gatewayv1.Document)}
	up.Doc.Rev, up.Doc.State = prev+1, st
	_, err := s.Commit(context.Background(), &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: prev}}})
	return err
}

// A document created by A is not taken by B while A renews; once A stops
// renewing (killed), B takes it over within lease + one scan, and B's
// writes succeed.
func TestLeaseTakeoverAfterOwnerStops(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	ctx := context.Background()
	rec := create(t, a, "d1")
	// Watch over three lease lengths: A's renewals keep it.
	for end := time.Now().Add(3 * testLease.LeaseDuration); time.Now().Before(end); {
		got, err := b.AcquireLeases(ctx, 10)
		if err != nil || len(got) != 0 {
			t.Fatalf("B acquired %d documents (err %v) while A renews", len(got), err)
		}
		if err := update(a, rec, rec.Doc.Rev, gatewayv1.State_RUNNING); err != nil {
			t.Fatalf("A's update while it holds the lease: %v", err)
		}
		rec.Doc.Rev++
	}
	a.StopRenewing() // as kill -9: no Close, no release
	stopped := time.Now()
	var got []*store.DocumentRecord
	for len(got) == 0 {
		if time.Since(stopped) > testLease.LeaseDuration+2*time.Second {
			t.Fatalf("B did not take d1 over within lease + 2 s of A stopping")
		}
		var err error
		if got, err = b.AcquireLeases(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(stopped); took < testLease.LeaseDuration-testLease.RenewInterval {
		t.Fatalf("B took over %v after A stopped renewing, before the lease could have expired", took)
	}
	if len(got) != 1 || got[0].Doc.Id != "d1" || got[0].Doc.Rev != rec.Doc.Rev {
		t.Fatalf("acquired %v, want d1 at rev %d", got, rec.Doc.Rev)
	}
	if err := update(b, rec, rec.Doc.Rev, gatewayv1.State_SUCCEEDED); err != nil {
		t.Fatalf("B completing the document it took over: %v", err)
	}
	if h := b.HeldLeases(); len(h) != 0 {
		t.Fatalf("B still holds %v after the terminal update", h)
	}
}

// Fencing: A still believes it holds d1 (its local deadline has not
// passed) but B took it over; A's late write is refused with ErrLeaseLost
// by the database and changes nothing, and A's hook reports d1.
func TestLeaseFencedWriteRefused(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := openSlowRenew(t, dsn, "A"), openLease(t, dsn, "B")
	hook := newLostHook(a)
	ctx := context.Background()
	rec := create(t, a, "d1")
	// The lease runs out in the database while A is paused (a GC pause, a
	// stopped VM): expire it directly, and B takes it over.
	takeOver(t, dsn, b, "d1")
	err := update(a, rec, rec.Doc.Rev, gatewayv1.State_SUCCEEDED)
	var le *store.LeaseLostError
	if !errors.Is(err, store.ErrLeaseLost) || !errors.As(err, &le) || len(le.DocIDs) != 1 || le.DocIDs[0] != "d1" {
		t.Fatalf("A's late write: %v, want a LeaseLostError for d1", err)
	}
	if ids, _ := hook.wait(t, 5*time.Second); len(ids) != 1 || ids[0] != "d1" {
		t.Fatalf("hook reported %v, want [d1]", ids)
	}
	cur, err := b.GetDocument(ctx, "acme", "d1", false)
	if err != nil || cur.Doc.State != gatewayv1.State_PENDING || cur.Doc.Rev != rec.Doc.Rev {
		t.Fatalf("after the refused write: %v %v, want PENDING at rev %d", cur, err, rec.Doc.Rev)
	}
	// Refused from then on without a round trip, and never retried.
	if err := update(a, rec, rec.Doc.Rev, gatewayv1.State_SUCCEEDED); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second late write: %v, want ErrLeaseLost", err)
	}
	if err := update(b, rec, rec.Doc.Rev, gatewayv1.State_SUCCEEDED); err != nil {
		t.Fatalf("the new owner's write: %v", err)
	}
}

// A replica cut off from the database (its connections go through a proxy
// that is cut) stops driving its documents before their lease can expire in
// the database: the hook fires while the lease row is still valid.
func TestLeaseCutOffReplicaStopsBeforeExpiry(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	px := newProxy(t, dsn)
	a := openLease(t, px.dsn, "A")
	hook := newLostHook(a)
	rec := create(t, a, "d1")
	px.cut()
	cutAt := time.Now()
	ids, at := hook.wait(t, 2*testLease.LeaseDuration)
	if len(ids) != 1 || ids[0] != "d1" {
		t.Fatalf("hook reported %v, want [d1]", ids)
	}
	if after := at.Sub(cutAt); after > testLease.LeaseDuration-testLease.LeaseMargin {
		t.Fatalf("stopped driving %v after the cut, later than lease - margin", after)
	}
	var valid bool
	if err := queryRow(dsn, "SELECT lease_expires > clock_timestamp() FROM documents WHERE id = 'd1'", &valid); err != nil {
		t.Fatal(err)
	}
	if !valid {
		t.Fatalf("the lease had already expired in the database when A stopped driving")
	}
	if err := update(a, rec, rec.Doc.Rev, gatewayv1.State_SUCCEEDED); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("write after the local deadline: %v, want ErrLeaseLost", err)
	}
}

// proxy forwards TCP to the database until cut, then refuses.
type proxy struct {
	ln    net.Listener
	dsn   string
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func newProxy(t *testing.T, dsn string) *proxy {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	p := &proxy{ln: ln, dsn: u.String()}
	t.Cleanup(p.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.dead {
				p.mu.Unlock()
				c.Close()
				up.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

func execSQL(dsn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

func queryRow(dsn, sql string, dst ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, sql).Scan(dst...)
}
