package bridge_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestValidation(t *testing.T) {
	e := newEnv(t, withBridgeOpts(func(o *bridge.Options) { o.MaxDocumentBytes = 1000 }))
	ctx := context.Background()
	bad := map[string]*gatewayv1.SubmitDocumentRequest{
		"empty":           {},
		"chunk too large": {Split: &gatewayv1.SplitOptions{ChunkBytes: 17 << 20}},
		"depth":           {Split: &gatewayv1.SplitOptions{MaxDepth: 8}},
		"processor":       {Split: &gatewayv1.SplitOptions{Processor: "nope"}},
		"strategy":        {Split: &gatewayv1.SplitOptions{Strategy: 99}},
		"ratio":           {CompletionPolicy: &gatewayv1.CompletionPolicy{Mode: gatewayv1.CompletionPolicy_QUORUM, MinSuccessRatio: 1.5}},
		"quorum no ratio": {CompletionPolicy: &gatewayv1.CompletionPolicy{Mode: gatewayv1.CompletionPolicy_QUORUM}},
		"reserved key":    {Metadata: map[string]string{"pipestream.processor": "x"}},
		"fault action":    {Metadata: map[string]string{"pipestream.fault": "explode"}},
		"content type":    {ContentType: "not a type"},
	}
	for name, req := range bad {
		t.Run(name, func(t *testing.T) {
			if name != "empty" {
				req.Content = []byte("x")
			}
			_, err := e.b.Submit(ctx, "", req)
			wantErr(t, err, bridge.ErrInvalid)
		})
	}
	// Allowed reserved keys.
	if _, err := e.b.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: []byte("x"),
		Metadata: map[string]string{"pipestream.fault-chunks": "1", "pipestream.claim-ttl-ms": "10", "x-user": "y"}}); err != nil {
		t.Fatalf("allowed keys rejected: %v", err)
	}
	_, err := e.b.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: make([]byte, 1001)})
	wantErr(t, err, bridge.ErrTooLarge)
	if !strings.Contains(err.Error(), "1000") {
		t.Fatalf("error does not say the limit: %v", err)
	}
	_, err = e.b.Upload(ctx, "", &gatewayv1.SubmitOptions{Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 100}},
		strings.NewReader(strings.Repeat("x", 5000)))
	wantErr(t, err, bridge.ErrTooLarge)
	_, err = e.b.GetDocument(ctx, "", "nope", false)
	wantErr(t, err, bridge.ErrNotFound)
}

func TestIdempotency(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx := context.Background()
	req := func(body string) *gatewayv1.SubmitDocumentRequest {
		return &gatewayv1.SubmitDocumentRequest{Content: []byte(body), RequestId: "req-1", ContentType: "text/plain"}
	}
	a, err := e.b.Submit(ctx, "", req("same body"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.b.Submit(ctx, "", req("same body"))
	if err != nil || b.Id != a.Id {
		t.Fatalf("repeat: %v, id %s vs %s", err, b.GetId(), a.Id)
	}
	_, err = e.b.Submit(ctx, "", req("other body"))
	wantErr(t, err, bridge.ErrConflict)
	// Same request id in another tenant is independent.
	c, err := e.b.Submit(ctx, "t2", req("other body"))
	if err != nil || c.Id == a.Id {
		t.Fatalf("other tenant: %v", err)
	}
	e.wait(a.Id, 10*time.Second)
	list, err := e.b.ListDocuments(ctx, "", &gatewayv1.ListDocumentsRequest{})
	if err != nil || len(list.Documents) != 1 {
		t.Fatalf("list: %v %d", err, len(list.GetDocuments()))
	}
}

func TestCancel(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx := context.Background()
	req := faultReq(gatewayv1.CompletionPolicy_STRICT, "timeout", "0")
	doc := e.submit(chunks4, req)
	e.waitFor(doc.Id, 10*time.Second, "running", func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_RUNNING })
	got, err := e.b.Cancel(ctx, "", doc.Id)
	if err != nil || got.State != gatewayv1.State_CANCELLED {
		t.Fatalf("Cancel: %v %v", got.GetState(), err)
	}
	got = e.wait(doc.Id, 10*time.Second)
	if got.State != gatewayv1.State_CANCELLED {
		t.Fatalf("state %s", got.State)
	}
	_, err = e.b.Cancel(ctx, "", doc.Id)
	wantErr(t, err, bridge.ErrFailedPrecondition)
	_, err = e.b.Cancel(ctx, "other", doc.Id)
	wantErr(t, err, bridge.ErrNotFound)
	// The session survives a cancel: a new document still succeeds.
	d2 := e.submit([]byte("after cancel"), nil)
	if s := e.wait(d2.Id, 10*time.Second).State; s != gatewayv1.State_SUCCEEDED {
		t.Fatalf("next document %s", s)
	}
}

func TestWatch(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	doc := e.submit(chunks4, &gatewayv1.SubmitDocumentRequest{Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 10}})
	var ups []*gatewayv1.WatchDocumentResponse
	err := e.b.Watch(ctx, "", doc.Id, 0, func(u *gatewayv1.WatchDocumentResponse) error { ups = append(ups, u); return nil })
	if err != nil {
		t.Fatal(err)
	}
	last := ups[len(ups)-1]
	if last.Document.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("last update state %s", last.Document.State)
	}
	if ups[0].Document == nil {
		t.Fatal("first update has no document")
	}
	// Revisions of the events are contiguous after the first update.
	prev := ups[0].Document.Rev
	var firstSeq uint64
	for _, u := range ups[1:] {
		if u.Event.Since != prev && u.Event.Since > prev {
			t.Fatalf("rev gap: since %d after rev %d", u.Event.Since, prev)
		}
		prev = u.Event.Rev
		if firstSeq == 0 {
			firstSeq = u.Event.Seq
		}
	}
	// Resume from a cursor: a terminal document replays from there and ends.
	if firstSeq > 0 {
		var n int
		err = e.b.Watch(ctx, "", doc.Id, firstSeq, func(u *gatewayv1.WatchDocumentResponse) error { n++; return nil })
		if err != nil || n == 0 {
			t.Fatalf("resume: %v, %d updates", err, n)
		}
	}
	_, err = e.b.GetDocument(ctx, "x", doc.Id, false)
	wantErr(t, err, bridge.ErrNotFound)
}
