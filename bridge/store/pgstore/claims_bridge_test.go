package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/pgtest"
)

// submitDeferred submits content through b with the fault processor
// deferring it, and returns the document id and its claim once issued.
func submitDeferred(t *testing.T, b *bridge.Bridge, content []byte) (docID, claim string) {
	t.Helper()
	ctx := context.Background()
	doc, err := b.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: content,
		Split:    &gatewayv1.SplitOptions{Processor: "fault"},
		Metadata: map[string]string{"pipestream.fault": "defer", "pipestream.claim-ttl-ms": "300000"}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); claim == ""; time.Sleep(20 * time.Millisecond) {
		d, err := b.GetDocument(ctx, "", doc.Id, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range d.ClaimChecks {
			if c.State == gatewayv1.ClaimCheck_ISSUED {
				claim = c.ClaimId
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no claim issued: state %s error %q", d.State, d.Error)
		}
	}
	return doc.Id, claim
}

// waitSucceeded waits until docID is SUCCEEDED through b and its result
// equals want.
func waitSucceeded(t *testing.T, b *bridge.Bridge, docID string, want []byte, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		d, err := b.GetDocument(ctx, "", docID, false)
		if err != nil {
			t.Fatal(err)
		}
		if d.State == gatewayv1.State_SUCCEEDED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("document %s not SUCCEEDED within %v: state %s error %q", docID, within, d.State, d.Error)
		}
	}
	_, _, rc, err := b.Result(ctx, "", docID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("result: %d bytes, err %v; want the %d bytes submitted", len(got), err, len(want))
	}
}

// A claim of a document replica A drives is redeemed 30 times at once,
// through A and B alike (round 0), then only through B (round 1): exactly
// one redemption succeeds, whichever replica it went through, and A
// resumes the entity at its peer (told by the store when B's redemption
// won), so the document completes with its content as the result.
func TestClaimRedeemedOnceThroughAnyReplica(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, p.Addr().String(), p.CertPEM())
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())
	for round := range 2 {
		content := bytes.Repeat([]byte("redeemed through any replica "), 100*(round+1))
		docID, claim := submitDeferred(t, a, content)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var wins []string
		var other []error
		for i := range 30 {
			via, name := a, "A"
			if i%2 == 1 || round == 1 { // round 1: only through B
				via, name = b, "B"
			}
			wg.Go(func() {
				_, err := via.Redeem(context.Background(), "", claim)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins = append(wins, name)
				case !errors.Is(err, bridge.ErrClaimRedeemed):
					other = append(other, err)
				}
			})
		}
		wg.Wait()
		if len(wins) != 1 || len(other) != 0 {
			t.Fatalf("round %d: 30 redemptions across A and B: %d succeeded (%v), unexpected errors %v; want exactly one success and 29 ErrClaimRedeemed", round, len(wins), wins, other)
		}
		t.Logf("round %d: the redemption through %s won", round, wins[0])
		waitSucceeded(t, b, docID, content, 15*time.Second)
	}
}

// A claim redeemed through B while nobody drives its document (A was
// killed; its lease has not expired yet) is not lost: B answers at once,
// and when B takes the document over, its new dispatch resumes the entity
// the peer defers again without another redemption.
func TestClaimRedeemedBeforeTakeoverResumes(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, p.Addr().String(), p.CertPEM())
	content := []byte("redeemed while its owner was dead")
	docID, claim := submitDeferred(t, a, content)
	// A dies: it drives nothing any more and renews nothing; the database
	// still shows its lease until it expires.
	stA.StopRenewing()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())
	c, err := b.Redeem(context.Background(), "", claim)
	if err != nil || c.State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("redeem through B while A is dead: %v %v, want REDEEMED", c, err)
	}
	if _, err := b.Redeem(context.Background(), "", claim); !errors.Is(err, bridge.ErrClaimRedeemed) {
		t.Fatalf("second redemption: %v, want ErrClaimRedeemed", err)
	}
	waitSucceeded(t, b, docID, content, testLease.LeaseDuration+2*time.Second+10*time.Second)
	// B's dispatch was deferred again and resumed through the new claim,
	// which the gateway redeemed itself: two claims, both REDEEMED.
	d, err := b.GetDocument(context.Background(), "", docID, false)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.ClaimChecks); n != 2 || d.ClaimChecks[0].State != gatewayv1.ClaimCheck_REDEEMED || d.ClaimChecks[1].State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("claims after the takeover: %v, want the first and B's new one, both REDEEMED", d.ClaimChecks)
	}
}

// redeemedEvents counts the #claim redeemed events of claim in the store.
func redeemedEvents(t *testing.T, st *pgstore.Store, docID, claim string) int {
	t.Helper()
	recs, err := st.ReadEvents(context.Background(), store.EventQuery{Tenant: "", DocID: docID, Kinds: []string{"#claim"}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range recs {
		ev, err := recs[i].Decode()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetClaimId() == claim && ev.GetClaimAction() == "redeemed" {
			n++
		}
	}
	return n
}

// A redemption writes its #claim redeemed event in the same transaction,
// exactly once: through the replica that drives the document, and through
// another one with the driving replica alive (it resumes the entity and
// does not write the event again) and stopped (nobody else would write
// it).
func TestClaimRedeemedThroughNonOwnerHasItsEvent(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startPeer(t)
	stA, stB := openLease(t, dsn, "A"), openLease(t, dsn, "B")
	a := newBridge(t, stA, p.Addr().String(), p.CertPEM())
	b := newBridge(t, stB, p.Addr().String(), p.CertPEM())

	// Through the owner: the event is committed with the redemption, not
	// with a later flush of the document.
	content := []byte("redeemed through A, which drives it")
	docID, claim := submitDeferred(t, a, content)
	if _, err := a.Redeem(context.Background(), "", claim); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, a, docID, content, 15*time.Second)
	if n := redeemedEvents(t, stB, docID, claim); n != 1 {
		t.Fatalf("through the owner: %d #claim redeemed events, want exactly 1", n)
	}

	content = []byte("redeemed through B while A drives it")
	docID, claim = submitDeferred(t, a, content)
	if _, err := b.Redeem(context.Background(), "", claim); err != nil {
		t.Fatal(err)
	}
	if n := redeemedEvents(t, stB, docID, claim); n != 1 {
		t.Fatalf("owner alive: %d #claim redeemed events right after B's redemption answered, want 1 (committed with it)", n)
	}
	waitSucceeded(t, a, docID, content, 15*time.Second)
	if n := redeemedEvents(t, stB, docID, claim); n != 1 {
		t.Fatalf("owner alive: %d #claim redeemed events after A resumed the entity, want exactly 1", n)
	}

	content = []byte("redeemed through B while A is stopped")
	docID, claim = submitDeferred(t, a, content)
	stA.StopRenewing()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Redeem(context.Background(), "", claim); err != nil {
		t.Fatal(err)
	}
	if n := redeemedEvents(t, stB, docID, claim); n != 1 {
		t.Fatalf("owner stopped: %d #claim redeemed events, want 1 (the database says REDEEMED)", n)
	}
	waitSucceeded(t, b, docID, content, testLease.LeaseDuration+2*time.Second+10*time.Second)
	if n := redeemedEvents(t, stB, docID, claim); n != 1 {
		t.Fatalf("owner stopped: %d #claim redeemed events after B took the document over, want exactly 1", n)
	}
}
