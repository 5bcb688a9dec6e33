package bridge_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// newScriptedHold is newScriptedEnv with Options.CreateHold set.
func newScriptedHold(t *testing.T, hold time.Duration) (*scripted, *bridge.Bridge) {
	t.Helper()
	return newScriptedEnvOpts(t, false, func(o *bridge.Options) { o.CreateHold = hold })
}

// A hold over the bound is refused, saying what to use.
func TestCreateHoldBounded(t *testing.T) {
	_, err := bridge.New(context.Background(), bridge.Options{DataDir: t.TempDir(), PeerAddr: "127.0.0.1:9",
		PeerCAPEM: []byte("x"), CreateHold: time.Minute})
	if err == nil || !errors.Is(err, bridge.ErrInvalid) {
		t.Fatalf("CreateHold 1m: %v, want an invalid-argument refusal", err)
	}
}

// submitAsync runs Submit on its own goroutine; the channel yields its
// outcome once.
func submitAsync(ctx context.Context, b *bridge.Bridge, content []byte) <-chan submitted {
	out := make(chan submitted, 1)
	go func() {
		req := wholeReq()
		req.Content = content
		doc, err := b.Submit(ctx, "", req)
		out <- submitted{doc, err}
	}()
	return out
}

type submitted struct {
	doc *gatewayv1.Document
	err error
}

// A small document's creation rides with its result (ridecreate.go): with
// a hold longer than the document takes, Submit answers once, after the
// one commit that holds the finished document, so its answer is already
// SUCCEEDED with the result, and the event log has every revision from the
// creation on, in order (fails on the code that committed the creation
// first: Submit answered PENDING).
func TestCreateRidesWithResult(t *testing.T) {
	e := newEnv(t, withBridgeOpts(func(o *bridge.Options) { o.CreateHold = 5 * time.Second }))
	e.waitReady()
	content := bytes.Repeat([]byte("ride "), 800)
	doc := e.submit(content, nil)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("Submit answered %s (rev %d), want SUCCEEDED: the creation should commit with the result", doc.State, doc.Rev)
	}
	if n := e.metric("pipestream_bridge_riding_creates_total"); n != 1 {
		t.Fatalf("pipestream_bridge_riding_creates_total = %v, want 1", n)
	}
	if got := e.result(doc.Id); !bytes.Equal(got, content) {
		t.Fatalf("result is %d octets, want the %d submitted (passthrough)", len(got), len(content))
	}
	var revs []uint64
	var states []gatewayv1.State
	err := e.b.Events().Subscribe(ctxTimeout(t, 5*time.Second), "", "ride", new(uint64), bridge.EventFilter{DocumentID: doc.Id}, func(ev *gatewayv1.Event) error {
		revs = append(revs, ev.Rev)
		if ev.Kind == "#document" {
			states = append(states, ev.State)
		}
		if ev.Rev == doc.Rev {
			return io.EOF
		}
		return nil
	})
	if !errors.Is(err, io.EOF) {
		t.Fatalf("events of %s: %v (revs %v)", doc.Id, err, revs)
	}
	for i, r := range revs {
		if r != uint64(i+1) {
			t.Fatalf("event revs %v, want 1..%d contiguous", revs, doc.Rev)
		}
	}
	if len(states) < 2 || states[0] != gatewayv1.State_PENDING || states[len(states)-1] != gatewayv1.State_SUCCEEDED {
		t.Fatalf("#document states %v, want PENDING first and SUCCEEDED last", states)
	}
}

// With a peer that does not answer, the hold runs out: Submit answers the
// document as it is (not finished), and it is there to read. The peer had
// the document before Submit answered: dispatch does not wait for the
// creation's commit.
func TestCreateHoldRunsOut(t *testing.T) {
	p, b := newScriptedHold(t, 50*time.Millisecond)
	content := []byte("the peer stays silent")
	res := submitAsync(context.Background(), b, content)
	a := p.next(t)
	if a.h == nil {
		t.Fatal("no header")
	}
	r := <-res
	must(t, r.err)
	if terminal(r.doc.State) {
		t.Fatalf("Submit answered %s, want the unfinished document", r.doc.State)
	}
	got, err := b.GetDocument(context.Background(), "", r.doc.Id, false)
	must(t, err)
	if got.SizeBytes != uint64(len(content)) {
		t.Fatalf("stored document has size %d, want %d", got.SizeBytes, len(content))
	}
}

// A document dispatched before its creation commits is sent again from
// the content held in memory when its session ends during the hold: the
// store does not have the content yet (fails without that: the second
// send found no content row and never reached the peer).
func TestRidingDocumentResentFromHeldContent(t *testing.T) {
	p, b := newScriptedHold(t, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := submitAsync(ctx, b, []byte("resent while its creation waits"))
	first := p.next(t)
	must(t, first.s.CloseWithError(0, "test: the session ends during the hold"))
	second := p.next(t)
	if second.h.PayloadLength != first.h.PayloadLength || !bytes.Equal(second.h.Checksum, first.h.Checksum) {
		t.Fatalf("second send has length %d checksum %x, want the first's %d %x", second.h.PayloadLength, second.h.Checksum,
			first.h.PayloadLength, first.h.Checksum)
	}
	cancel()
	<-res
}

// A client that leaves during the hold gets no document: nothing was
// committed, and the gateway forgets it (no read finds it, nothing is left
// running).
func TestRidingDocumentDroppedWhenClientLeaves(t *testing.T) {
	p, b := newScriptedHold(t, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	res := submitAsync(ctx, b, []byte("the client leaves"))
	a := p.next(t)
	cancel()
	r := <-res
	if r.err == nil {
		t.Fatalf("Submit answered %s after its context ended, want an error", r.doc.State)
	}
	docs, err := b.ListDocuments(context.Background(), "", &gatewayv1.ListDocumentsRequest{})
	must(t, err)
	if len(docs.GetDocuments()) != 0 {
		t.Fatalf("documents listed: %v, want none (the creation never committed)", docs.GetDocuments())
	}
	_ = a
}
