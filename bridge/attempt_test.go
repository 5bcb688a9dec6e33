package bridge_test

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// A claim issued to an earlier dispatch attempt stays redeemable (profile
// 6): the gateway restarts while a document waits on a claim, the new
// attempt is deferred again with a new claim, and redeeming the OLD claim
// resumes the document. The entity tree and counts show the current
// attempt only: no FAILED leftovers of the first one.
func TestEarlierAttemptClaimRedeemable(t *testing.T) {
	forFormats(t, func(t *testing.T, opts ...envOpt) {
		e := newEnv(t, opts...)
		e.waitReady()
		ctx := context.Background()
		content := []byte("deferred across a gateway restart")
		req := &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
			Split:    &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE, Processor: "fault"},
			Metadata: map[string]string{"pipestream.fault": "defer"}}
		doc := e.submit(content, req)
		old := e.waitFor(doc.Id, 20*time.Second, "a claim", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 1 }).ClaimChecks[0].ClaimId

		e.closeBridge()
		e.startBridge()
		e.waitReady()
		e.waitFor(doc.Id, 20*time.Second, "the second attempt's claim", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 2 })
		c, err := e.b.Redeem(ctx, "", old)
		if err != nil {
			t.Fatalf("Redeem of the first attempt's claim: %v", err)
		}
		if c.State != gatewayv1.ClaimCheck_REDEEMED {
			t.Fatalf("claim %v", c)
		}
		got := e.wait(doc.Id, 20*time.Second)
		if got.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("state %s error %q counts %v", got.State, got.Error, got.EntityCounts)
		}
		if res := e.result(doc.Id); !bytes.Equal(res, content) {
			t.Fatalf("result %q", res)
		}
		if len(got.Entities) != 1 || got.Entities[0].Status != gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE {
			t.Fatalf("entities %v: want the current attempt's root only, COMPLETE", got.Entities)
		}
		if n := got.EntityCounts; n.Total != 1 || n.Complete != 1 || n.Failed != 0 {
			t.Fatalf("counts %v", n)
		}
		for _, cc := range got.ClaimChecks {
			if cc.State != gatewayv1.ClaimCheck_REDEEMED {
				t.Fatalf("claim %v: want both claims REDEEMED", cc)
			}
		}
	})
}

// Every claim of every earlier attempt stays redeemable across several
// restarts (profile 6), not only the previous attempt's: entity ids restart
// with each session, so after two restarts the first claim's entity id
// names nothing (or another entity) in the newest attempt; the chunk is
// stored with the claim. Other documents first make the first attempt's
// root entity id differ from the later attempts'.
func TestClaimOfFirstAttemptRedeemableAfterTwoRestarts(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx := context.Background()
	for i := range 3 {
		e.wait(e.submit([]byte{'a' + byte(i)}, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain"}).Id, 20*time.Second)
	}
	content := []byte("deferred across two gateway restarts")
	req := &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split:    &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE, Processor: "fault"},
		Metadata: map[string]string{"pipestream.fault": "defer"}}
	doc := e.submit(content, req)
	first := e.waitFor(doc.Id, 20*time.Second, "a claim", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 1 }).ClaimChecks[0]
	for n := 2; n <= 3; n++ {
		e.closeBridge()
		e.startBridge()
		e.waitReady()
		e.waitFor(doc.Id, 20*time.Second, "the next attempt's claim", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == n })
	}
	c, err := e.b.Redeem(ctx, "", first.ClaimId)
	if err != nil {
		t.Fatalf("Redeem of the first attempt's claim (entity %d) after two restarts: %v", first.EntityId, err)
	}
	if c.State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("claim %v", c)
	}
	if _, err := e.b.Redeem(ctx, "", first.ClaimId); err == nil {
		t.Fatal("a second redemption of the same claim succeeded")
	}
	got := e.wait(doc.Id, 20*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q counts %v", got.State, got.Error, got.EntityCounts)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, content) {
		t.Fatalf("result %q", res)
	}
}

// Pipelined upload (profile 4.2): statuses made before the Create commit
// follow the creation event (rev 1) as events of their own; every event
// has since = the previous rev, so a watcher replaying from the start sees
// contiguous revisions (TestPreCommitChangesAreEvents forces the race).
func TestPipelinedUploadRevsContiguous(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	go func() {
		for i := range 20 {
			_, _ = pw.Write(bytes.Repeat([]byte{'a' + byte(i%26)}, 4095))
			_, _ = pw.Write([]byte("\n"))
		}
		pw.Close()
	}()
	// The Create commit waits until the peer reported on some of the
	// pipelined chunks: their statuses are changes made before it.
	restore, held := bridge.HoldCreateCommit(func(_ int, ents []*gatewayv1.Entity) bool { return len(ents) >= 3 }, 15*time.Second)
	doc, err := e.b.Upload(ctx, "", &gatewayv1.SubmitOptions{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 4096}}, pr)
	restore()
	if err != nil {
		t.Fatal(err)
	}
	if !held() {
		t.Fatal("the peer reported on no pipelined chunk before the Create commit; the case was not forced")
	}
	e.wait(doc.Id, 20*time.Second)
	var evs []*gatewayv1.Event
	err = e.b.Watch(ctx, "", doc.Id, 1, func(u *gatewayv1.WatchDocumentResponse) error {
		if u.Event != nil {
			evs = append(evs, u.Event)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 3 || evs[0].Kind != "#document" || evs[0].Since != 0 {
		t.Fatalf("first events %v: want the #document creation with since 0", evs[:min(len(evs), 3)])
	}
	for i, p := range chained(t, evs) {
		if i > 0 && (p[1].Since != p[0].Rev || p[1].Rev != p[1].Since+1) {
			t.Fatalf("%s rev %d since %d after rev %d: revisions not contiguous", p[1].Kind, p[1].Rev, p[1].Since, p[0].Rev)
		}
	}
}

// Close (graceful shutdown: GOAWAY drain) does not wait for a document that
// waits only on a claim check (profile 6: the claim outlives the session;
// a redemption may come days later): once its claim is durable, the
// DEFERRED entity is detached from the drain, so Close returns long before
// its deadline. The claim is still ISSUED after the restart.
func TestCloseDoesNotWaitForDeferred(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	detached := make(chan struct{}, 1)
	defer bridge.OnDetached(func() {
		select {
		case detached <- struct{}{}:
		default:
		}
	})()
	req := &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split:    &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE, Processor: "fault"},
		Metadata: map[string]string{"pipestream.fault": "defer"}}
	doc := e.submit([]byte("waits on a claim"), req)
	claim := e.waitFor(doc.Id, 20*time.Second, "a claim", func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 1 }).ClaimChecks[0]
	// The claim is durable once GetClaim (a store read) finds it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := e.b.GetClaim(context.Background(), "", claim.ClaimId); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("claim %s not in the store: %v", claim.ClaimId, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The flush that stored it detaches the entity right after its commit.
	select {
	case <-detached:
	case <-time.After(10 * time.Second):
		t.Fatal("the durable claim's DEFERRED entity was not detached from the GOAWAY drain")
	}
	const drain = 8 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	start := time.Now()
	if err := e.b.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	e.b = nil
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %v of its %v: the DEFERRED entity held the GOAWAY drain", took.Round(time.Millisecond), drain)
	}
	e.startBridge()
	e.waitReady()
	if c, err := e.b.GetClaim(context.Background(), "", claim.ClaimId); err != nil || c.State != gatewayv1.ClaimCheck_ISSUED {
		t.Fatalf("claim after the restart: %v %v, want ISSUED", c, err)
	}
}
