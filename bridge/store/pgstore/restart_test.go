package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/pgtest"
	"github.com/pipestream/gateway/quicpeer/peer"
)

// restartDowntime is how long the database stays down in
// TestDatabaseRestart: shorter than the local lease deadline (7 s), as an
// operator's restart is.
const restartDowntime = 2 * time.Second

// TestDatabaseRestart: a bridge on its own PostgreSQL cluster runs
// documents (inline and streamed results) against a real peer while the
// cluster is restarted (fast shutdown, down for restartDowntime, up on the
// same port). Submissions and reads during the outage fail with
// store.ErrUnavailable (the client sees UNAVAILABLE, nothing is accepted)
// and stop failing once the database is up;
// the pool and the LISTEN connections reconnect by themselves, every
// accepted document finishes with its result byte-identical, and a second
// store's event hook (a subscriber of another replica) sees every seq
// exactly once, in order.
func TestDatabaseRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	dsn, err := c.CreateDatabase(ctx, "restart")
	if err != nil {
		t.Fatal(err)
	}
	st, other := openPlain(t, dsn), openPlain(t, dsn)
	rec := newRecorder()
	other.SetEventHook(rec.hook)
	p := startPeer(t)
	logs := &syncBuffer{}
	b, err := bridge.New(ctx, bridge.Options{DataDir: t.TempDir(), PeerAddr: p.Addr().String(), PeerCAPEM: p.CertPEM(),
		Store: st, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
		if t.Failed() {
			t.Logf("bridge log:\n%s", logs.String())
		}
	})

	sub := startSubmitters(b, 4)
	sub.waitAccepted(t, 20)
	down := time.Now()
	if err := c.Down(ctx); err != nil {
		t.Fatal(err)
	}
	// A read meanwhile fails with store.ErrUnavailable (gRPC UNAVAILABLE).
	if _, err := b.GetDocument(ctx, "", sub.anyAccepted(), false); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("GetDocument while the database is down: %v, want store.ErrUnavailable", err)
	}
	time.Sleep(restartDowntime) // the outage itself, not a synchronisation
	before := sub.count()
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	sub.waitAccepted(t, before+20)
	sub.stop()

	lastFail := sub.lastFailure()
	t.Logf("accepted %d documents; %d submissions failed, the last %v after the shutdown began; database down (stop + %v + start) for %v",
		sub.count(), len(sub.failed), lastFail.Sub(down).Round(10*time.Millisecond), restartDowntime, up.Sub(down).Round(10*time.Millisecond))
	if len(sub.failed) == 0 {
		t.Fatalf("no submission failed while the database was down")
	}
	if len(sub.other) > 0 {
		t.Fatalf("%d failed submissions are not store.ErrUnavailable (gRPC UNAVAILABLE), e.g. %v", len(sub.other), sub.other[0])
	}
	if lastFail.Sub(up) > 5*time.Second {
		t.Fatalf("submissions still failed %v after the database was up", lastFail.Sub(up))
	}
	for id, content := range sub.accepted {
		waitResult(t, b, id, content, 60*time.Second)
	}
	var last uint64
	if err := queryRow(dsn, "SELECT last_seq FROM meta", &last); err != nil {
		t.Fatal(err)
	}
	gapless(t, rec.waitFor(t, int(last)), 1)
}

// openPlain opens a Store with the default lease timings on dsn.
func openPlain(t *testing.T, dsn string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), dsn, pgstore.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startPeer starts a real PipeStream peer on loopback QUIC.
func startPeer(t *testing.T) *peer.Server {
	t.Helper()
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
	return p
}

// submitters submit documents through a bridge until stopped: every third
// one has a streamed (300 KiB) result, the others an inline one.
type submitters struct {
	mu       sync.Mutex
	accepted map[string][]byte
	failed   []time.Time
	other    []error // failures that are not store.ErrUnavailable
	done     chan struct{}
	wg       sync.WaitGroup
}

func startSubmitters(b *bridge.Bridge, n int) *submitters {
	s := &submitters{accepted: map[string][]byte{}, done: make(chan struct{})}
	for w := range n {
		s.wg.Add(1)
		go s.run(b, w)
	}
	return s
}

func (s *submitters) run(b *bridge.Bridge, w int) {
	defer s.wg.Done()
	for i := 0; ; i++ {
		select {
		case <-s.done:
			return
		default:
		}
		size := 2 << 10
		if i%3 == 0 {
			size = 300 << 10
		}
		content := bytes.Repeat([]byte(fmt.Sprintf("w%d doc %04d ", w, i)), size/12)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := b.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: content})
		cancel()
		s.mu.Lock()
		if err == nil {
			s.accepted[d.Id] = content
		} else {
			s.failed = append(s.failed, time.Now())
			if !errors.Is(err, store.ErrUnavailable) {
				s.other = append(s.other, err)
			}
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond) // pacing, not synchronisation
	}
}

func (s *submitters) stop() { close(s.done); s.wg.Wait() }

func (s *submitters) anyAccepted() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.accepted {
		return id
	}
	return ""
}

func (s *submitters) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.accepted)
}

func (s *submitters) lastFailure() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last time.Time
	for _, f := range s.failed {
		if f.After(last) {
			last = f
		}
	}
	return last
}

// waitAccepted polls until n documents were accepted (30 s at most).
func (s *submitters) waitAccepted(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d documents accepted within 30 s, want %d", s.count(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitResult polls until document id SUCCEEDED (a FAILED state fails the
// test) and checks its result.
func waitResult(t *testing.T, b *bridge.Bridge, id string, content []byte, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		d, err := b.GetDocument(ctx, "", id, false)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if d.State == gatewayv1.State_SUCCEEDED {
			break
		}
		if d.State == gatewayv1.State_FAILED || time.Now().After(deadline) {
			t.Fatalf("document %s: %s %q, want SUCCEEDED", id, d.State, d.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, _, rc, err := b.Result(ctx, "", id)
	if err != nil {
		t.Fatalf("result of %s: %v", id, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("result of %s: %d bytes (err %v), want the %d submitted", id, len(got), err, len(content))
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
