package pgstore_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/pgtest"
	"github.com/pipestream/gateway/quicpeer/peer"
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
	off := peer.DefaultOffer(false)
	p, err := peer.Start(peer.Options{ListenAddr: "127.0.0.1:0", DataDir: t.TempDir(), Logger: quiet(), Offer: &off, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
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
