package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

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
// same port). Submissions during the outage fail (the client sees an
// error, nothing is accepted); afterwards the pool and the LISTEN
// connections reconnect by themselves, every accepted document finishes
// with its result byte-identical, and a second store's event hook (a
// subscriber of another replica) sees every seq exactly once, in order.
func TestDatabaseRestart(t *testing.T) {
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := pgtest.Start(cctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	dsn, err := c.CreateDatabase(cctx, "restart")
	if err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.Open(cctx, dsn, pgstore.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	other, err := pgstore.Open(cctx, dsn, pgstore.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	rec := newRecorder()
	other.SetEventHook(rec.hook)

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
	b := newBridge(t, st, p.Addr().String(), p.CertPEM())

	// Submitters run before, during and after the outage.
	var (
		mu       sync.Mutex
		accepted = map[string][]byte{}
		failed   []time.Time
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				size := 2 << 10
				if i%3 == 0 {
					size = 300 << 10 // a streamed result
				}
				content := bytes.Repeat([]byte(fmt.Sprintf("w%d doc %d ", w, i)), size/12)
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				d, err := b.Submit(sctx, "", &gatewayv1.SubmitDocumentRequest{Content: content})
				cancel()
				mu.Lock()
				if err == nil {
					accepted[d.Id] = content
				} else {
					failed = append(failed, time.Now())
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // pacing, not synchronisation
			}
		}()
	}
	waitAccepted := func(n int) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			got := len(accepted)
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d documents accepted within 30 s, want %d", got, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAccepted(20)
	down := time.Now()
	if err := c.Down(cctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(restartDowntime) // the outage itself
	mu.Lock()
	before := len(accepted)
	mu.Unlock()
	if err := c.Up(cctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	waitAccepted(before + 20)
	close(stop)
	wg.Wait()

	mu.Lock()
	var lastFail time.Time
	for _, f := range failed {
		if f.After(lastFail) {
			lastFail = f
		}
	}
	t.Logf("accepted %d documents; %d submissions failed, the last %v after the restart began (database down %v)",
		len(accepted), len(failed), lastFail.Sub(down).Round(10*time.Millisecond), up.Sub(down).Round(10*time.Millisecond))
	if len(failed) == 0 {
		t.Fatalf("no submission failed while the database was down")
	}
	if lastFail.Sub(up) > 5*time.Second {
		t.Fatalf("submissions still failed %v after the database was up", lastFail.Sub(up))
	}
	mu.Unlock()

	// Every accepted document finishes with its result.
	deadline := time.Now().Add(60 * time.Second)
	for id, content := range accepted {
		for {
			d, err := b.GetDocument(ctx, "", id, false)
			if err != nil {
				t.Fatalf("get %s: %v", id, err)
			}
			if d.State == gatewayv1.State_SUCCEEDED {
				break
			}
			if d.State == gatewayv1.State_FAILED || time.Now().After(deadline) {
				t.Fatalf("document %s: %s %q after the restart, want SUCCEEDED", id, d.State, d.Error)
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
	// Every seq exactly once, in order, at the other store's hook.
	var last uint64
	if err := queryRow(dsn, "SELECT last_seq FROM meta", &last); err != nil {
		t.Fatal(err)
	}
	gapless(t, rec.waitFor(t, int(last)), 1)
}
