package pgstore_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/pgtest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// deadUDPAddr is a loopback UDP address nobody answers on.
func deadUDPAddr(t *testing.T) string {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := c.LocalAddr().String()
	c.Close()
	return addr
}

func newBridge(t *testing.T, st bridge.Store, peerAddr string, ca []byte) *bridge.Bridge {
	t.Helper()
	b, err := bridge.New(context.Background(), bridge.Options{DataDir: t.TempDir(), PeerAddr: peerAddr, PeerCAPEM: ca,
		Store: st, Logger: quiet()})
	if err != nil {
		t.Fatalf("bridge.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

// Two bridges on one database. A accepts a document but cannot reach a
// peer; B, connected to one, does not touch the document while A renews its
// lease. When A is killed (its renewer stops, A is abandoned without
// Close), B takes the document over within lease + one takeover scan and
// finishes it with the right result.
func TestBridgesTakeOverAKilledReplicasDocument(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, deadUDPAddr(t), p.CertPEM())
	content := bytes.Repeat([]byte("pipestream lease "), 4096)
	doc, err := a.Submit(context.Background(), "", &gatewayv1.SubmitDocumentRequest{Content: content})
	if err != nil {
		t.Fatalf("submit through A: %v", err)
	}
	// B starts after the document exists: its start-up recovery must not
	// take it either.
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())
	deadline := time.Now().Add(10 * time.Second)
	for b.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("B not ready: %v", b.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// While A renews (three lease lengths, more than one takeover scan), B
	// does not take the document.
	for end := time.Now().Add(3 * testLease.LeaseDuration); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		d, err := b.GetDocument(context.Background(), "", doc.Id, false)
		if err != nil {
			t.Fatal(err)
		}
		if d.State != gatewayv1.State_PENDING || len(stB.HeldLeases()) != 0 {
			t.Fatalf("B drives A's document: state %s, B holds %v", d.State, stB.HeldLeases())
		}
	}
	stA.StopRenewing() // kill -9 of A, as far as the database can tell
	killed := time.Now()
	bound := testLease.LeaseDuration + 2*time.Second /* one scan */ + 3*time.Second /* processing, slack */
	for {
		d, err := b.GetDocument(context.Background(), "", doc.Id, false)
		if err != nil {
			t.Fatal(err)
		}
		if d.State == gatewayv1.State_SUCCEEDED {
			break
		}
		if time.Since(killed) > bound {
			t.Fatalf("document not finished by B within %v of A's kill: state %s error %q", bound, d.State, d.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, _, rc, err := b.Result(context.Background(), "", doc.Id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("result through B: %d bytes, err %v; want the %d bytes submitted", len(got), err, len(content))
	}
	if h := stA.HeldLeases(); len(h) != 0 {
		t.Fatalf("A still believes it holds %v after its local deadline", h)
	}
}

// A bridge whose lease was taken over while it did not know (its renewer
// stopped: a pause) finds out at its next write: the flush is refused by
// the fenced UPDATE (the store's hook and the refused flush both drop the
// document; whichever comes first), the bridge no longer drives it (not
// active), does not retry the write, and the database keeps the state the
// new owner found.
func TestBridgeDropsDocumentOnFencedFlush(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	ctx := context.Background()
	stA, err := pgstore.Open(ctx, dsn, pgstore.Options{ReplicaID: "A", LeaseDuration: time.Minute, RenewInterval: time.Second, LeaseMargin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stB := openLease(t, dsn, "B")
	reg := prometheus.NewPedanticRegistry()
	logs := &msgLog{}
	a, err := bridge.New(ctx, bridge.Options{DataDir: t.TempDir(), PeerAddr: p.Addr().String(), PeerCAPEM: p.CertPEM(),
		Store: stA, Logger: slog.New(logs), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Close(c)
	})
	docID, claim := submitDeferred(t, a, []byte("deferred until redeemed"))
	if active(t, reg) != 1 {
		t.Fatalf("A drives %v documents, want 1", active(t, reg))
	}
	// A pauses (no renewals); its lease runs out and B takes over.
	stA.StopRenewing()
	if err := execSQL(dsn, "UPDATE documents SET lease_expires = clock_timestamp() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if got, err := stB.AcquireLeases(ctx, 10); err != nil || len(got) != 1 {
		t.Fatalf("B acquire: %d, %v", len(got), err)
	}
	before, err := stB.GetDocument(ctx, "acme", docID, false)
	if err != nil {
		before, err = stB.GetDocument(ctx, "", docID, false)
	}
	if err != nil {
		t.Fatal(err)
	}
	// A's next write: the redemption makes the document progress on A.
	_, _ = a.Redeem(ctx, "", claim)
	for deadline := time.Now().Add(10 * time.Second); logs.count("bridge: stopped driving a document; another replica takes it over") != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A did not stop driving the document within 10 s of its fenced write")
		}
	}
	if active(t, reg) != 0 {
		t.Fatalf("A still counts %v active documents", active(t, reg))
	}
	// No retry: a failed flush is retried every 100 ms; over a second none
	// is logged.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := logs.count("bridge: committing document state failed; will retry"); n != 0 {
			t.Fatalf("A retried its refused write (%d times)", n)
		}
	}
	after, err := stB.GetDocument(ctx, before.Tenant, docID, false)
	if err != nil || after.Doc.Rev != before.Doc.Rev || after.Doc.State != before.Doc.State {
		t.Fatalf("the document changed after B took over: rev %d -> %d, state %s -> %s (%v)", before.Doc.Rev, after.Doc.Rev, before.Doc.State, after.Doc.State, err)
	}
}

func active(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "pipestream_bridge_documents_active" {
			return mf.Metric[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no pipestream_bridge_documents_active metric")
	return 0
}

// msgLog is a slog.Handler counting messages.
type msgLog struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (l *msgLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *msgLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.msgs == nil {
		l.msgs = map[string]int{}
	}
	l.msgs[r.Message]++
	return nil
}
func (l *msgLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *msgLog) WithGroup(string) slog.Handler      { return l }

func (l *msgLog) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msgs[msg]
}
