package bridge_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
)

// A document that names a processor is sent to the peer as entity
// metadata, which a draft-04 header cannot carry (docs/profile.md 9.3).
// Placement never gives it to a draft-04 peer: it waits, saying why,
// for a peer that receives metadata, while a document that needs none
// runs on the draft-04 peer meanwhile; once a draft-02 peer is up it
// runs there with the result its processor makes. Sent to the draft-04
// peer it would succeed with the passthrough result instead.
func TestMetadataDocumentNeverOnDraft04Peer(t *testing.T) {
	a, b := newTestPeer(t), newTestPeer(t)
	b.stop(0) // the only peer that receives metadata is down at first
	e := &env{t: t, dir: t.TempDir()}
	e.opts = bridge.Options{DataDir: e.dir, Logger: quietLogger(), Peers: []bridge.PeerEndpoint{
		{Addr: a.addr, CAPEM: a.cert, Framing: quicpeer.FramingDraft04}, {Addr: b.addr, CAPEM: b.cert, Framing: quicpeer.FramingDraft02}}}
	e.startBridge()
	t.Cleanup(func() { e.closeBridge() })

	text := []byte("One sentence here. And another one.\nA third line.\n")
	stats := e.submit(text, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Processor: "textstats"}}).Id
	tagged := e.submit([]byte("tagged"), &gatewayv1.SubmitDocumentRequest{Metadata: map[string]string{"team": "x"}}).Id
	plain := []byte("a document that needs no metadata")
	pid := e.submit(plain, nil).Id
	if got := e.wait(pid, 30*time.Second); got.State != gatewayv1.State_SUCCEEDED || !bytes.Equal(e.result(pid), plain) {
		t.Fatalf("the plain document queued behind a waiting one: %s %q", got.State, got.Error)
	}
	for _, id := range []string{stats, tagged} {
		got := e.waitFor(id, 10*time.Second, "a wait reason naming entity metadata", func(d *gatewayv1.Document) bool {
			return strings.Contains(d.WaitReason, "entity metadata")
		})
		if terminal(got.State) {
			t.Fatalf("document %s ran without a peer that receives metadata: %s", id, got.State)
		}
		t.Logf("%s waits: %s", id, got.WaitReason)
	}

	b.start()
	got := e.wait(stats, 30*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("textstats document: %s %q", got.State, got.Error)
	}
	var st struct{ Bytes, Words uint64 }
	if err := json.Unmarshal(e.result(stats), &st); err != nil || st.Bytes != uint64(len(text)) || st.Words != 9 {
		t.Fatalf("textstats result %q (%v): want the stats of %d octets, 9 words", e.result(stats), err, len(text))
	}
	if got := e.wait(tagged, 30*time.Second); got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document with metadata: %s %q", got.State, got.Error)
	}
	if d, _ := e.b.GetDocument(t.Context(), "", stats, false); d.GetWaitReason() != "" {
		t.Errorf("wait reason left after the run: %q", d.GetWaitReason())
	}
}

// With every configured peer draft-04, a document that needs entity
// metadata could never run as asked: Submit refuses it at once and says
// what to change; one that needs none is accepted and runs.
func TestDraft04OnlyRefusesMetadataDocuments(t *testing.T) {
	a := newTestPeer(t)
	e := &env{t: t, dir: t.TempDir()}
	e.opts = bridge.Options{DataDir: e.dir, Logger: quietLogger(), Peers: []bridge.PeerEndpoint{
		{Addr: a.addr, CAPEM: a.cert, Framing: quicpeer.FramingDraft04}}}
	e.startBridge()
	t.Cleanup(func() { e.closeBridge() })
	for _, c := range []struct {
		name string
		req  *gatewayv1.SubmitDocumentRequest
		want string
	}{
		{"processor", &gatewayv1.SubmitDocumentRequest{Split: &gatewayv1.SplitOptions{Processor: "textstats"}}, "split.processor textstats"},
		{"metadata", &gatewayv1.SubmitDocumentRequest{Metadata: map[string]string{"pipestream.fault": "fail"}}, "request metadata"},
		{"depth", &gatewayv1.SubmitDocumentRequest{Split: &gatewayv1.SplitOptions{MaxDepth: 2}}, "split.maxDepth"},
	} {
		c.req.Content = []byte("x")
		_, err := e.b.Submit(t.Context(), "", c.req)
		if !errors.Is(err, bridge.ErrFailedPrecondition) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "draft-04") {
			t.Errorf("%s: Submit error %v, want FailedPrecondition naming %q and draft-04", c.name, err, c.want)
		}
	}
	in := []byte("whole, no metadata")
	id := e.submit(in, &gatewayv1.SubmitDocumentRequest{Split: &gatewayv1.SplitOptions{Processor: "passthrough"}}).Id
	if got := e.wait(id, 30*time.Second); got.State != gatewayv1.State_SUCCEEDED || !bytes.Equal(e.result(id), in) {
		t.Fatalf("passthrough document on the draft-04 peer: %s %q", got.State, got.Error)
	}
}
