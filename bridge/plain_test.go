package bridge_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Plain documents (docs/profile.md 9): toward a peer that does not answer
// the profile's discovery member the bridge sends plain entities and takes
// whatever results the peer returns.

// newPlainEnv starts a scripted peer without the profile and a bridge on it.
func newPlainEnv(t *testing.T, o func(*bridge.Options)) (*scripted, *bridge.Bridge) {
	t.Helper()
	p := startScriptedOffer(t, false, wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}, false)
	opts := bridge.Options{DataDir: t.TempDir(), PeerAddr: p.ln.Addr().String(), PeerCAPEM: p.certPEM,
		PeerServerName: "localhost", Logger: quietLogger()}
	if o != nil {
		o(&opts)
	}
	b, err := bridge.New(context.Background(), opts)
	must(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
		p.stop()
	})
	return p, b
}

// sendNewResult sends data as a new entity of the peer's own numbering whose
// parent-id is parent (the form an independent draft-02 peer uses).
func sendNewResult(t *testing.T, s *quicpeer.Session, id, parent uint32, data []byte) {
	t.Helper()
	sum := sha256.Sum256(data)
	must(t, s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: id, ParentID: &parent, ContentType: "text/plain",
		PayloadLength: uint64(len(data)), Checksum: sum[:]}, bytesReader(data)))
}

// A whole document reaches a plain peer as one plain root entity (no
// profile marker, the content as payload); its result comes back as a new
// entity after COMPLETE, and is the document's result.
func TestPlainWholeResultAsNewEntity(t *testing.T) {
	p, b := newPlainEnv(t, nil)
	req := wholeReq()
	req.Content = []byte("hello plain peer")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	if _, marked := a.h.Metadata["pipestream.profile"]; marked || a.h.PayloadLength != uint64(len(req.Content)) {
		t.Fatalf("root header %+v: want a plain entity carrying the content", a.h)
	}
	if sum := sha256.Sum256(req.Content); !bytes.Equal(a.h.Checksum, sum[:]) {
		t.Fatal("the plain root's checksum is not the content's SHA-256")
	}
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	sendNewResult(t, a.s, 0x7000_0001, a.h.EntityID, []byte("HELLO PLAIN PEER"))
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED || doc.ResultAbsent {
		t.Fatalf("state %s absent %v error %q", doc.State, doc.ResultAbsent, doc.Error)
	}
	if got := readResult(t, b, d.Id); string(got) != "HELLO PLAIN PEER" {
		t.Fatalf("result %q", got)
	}
}

// A peer that returns nothing: SUCCEEDED, result absent, and the result
// call says so (ErrResultAbsent).
func TestPlainResultAbsent(t *testing.T) {
	p, b := newPlainEnv(t, nil)
	req := wholeReq()
	req.Content = []byte("no result")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED || !doc.ResultAbsent {
		t.Fatalf("state %s absent %v", doc.State, doc.ResultAbsent)
	}
	_, _, _, err = b.Result(context.Background(), "", d.Id)
	if err == nil || !strings.Contains(err.Error(), bridge.ErrResultAbsent.Error()) {
		t.Fatalf("Result: %v, want ErrResultAbsent", err)
	}
}

// A dehydrated document: DEHYDRATING(R) and plain chunks, the last with
// total-chunks; the peer answers each chunk with a new entity naming it as
// parent, in reverse order, and never reports R: the gateway rehydrates the
// chunk results in chunk order and ends R itself.
func TestPlainChunksRehydratedByGateway(t *testing.T) {
	p, b := newPlainEnv(t, nil)
	content := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	req := &gatewayv1.SubmitDocumentRequest{Content: content, ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 16 << 10}}
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	var chunks []arrival
	for range 4 {
		chunks = append(chunks, p.next(t))
	}
	// Streams arrive in any order; put them in chunk order.
	slices.SortFunc(chunks, func(a, b arrival) int {
		if a.h.ChunkInfo == nil || b.h.ChunkInfo == nil {
			return 0
		}
		return cmp.Compare(a.h.ChunkInfo.ChunkIndex, b.h.ChunkInfo.ChunkIndex)
	})
	for i, a := range chunks {
		ci := a.h.ChunkInfo
		if ci == nil || ci.ChunkIndex != uint64(i) || a.h.ParentID == nil {
			t.Fatalf("chunk %d header %+v", i, a.h)
		}
		if _, marked := a.h.Metadata["pipestream.profile"]; marked {
			t.Fatal("a plain chunk carries the profile marker")
		}
		if want := uint64(0); i == 3 {
			want = 4
			if ci.TotalChunks != want {
				t.Fatalf("last chunk total-chunks %d, want 4", ci.TotalChunks)
			}
		}
	}
	for i := len(chunks) - 1; i >= 0; i-- {
		a := chunks[i]
		status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
		status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
		sendNewResult(t, a.s, 0x7100_0000+uint32(i), a.h.EntityID, []byte(fmt.Sprintf("<%d>", i)))
	}
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); string(got) != "<0><1><2><3>" {
		t.Fatalf("result %q, want the chunk results in chunk order", got)
	}
}

// A peer that says PROCESSING and never finishes: the completion policy's
// timeout-ms ends the document, and the error names the entity, the peer
// and what the peer last reported.
func TestPlainStallTimesOut(t *testing.T) {
	p, b := newPlainEnv(t, nil)
	req := wholeReq()
	req.Content = []byte("stall")
	req.CompletionPolicy = &gatewayv1.CompletionPolicy{TimeoutMs: 200}
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	for _, want := range []string{fmt.Sprintf("entity %d", a.h.EntityID), p.ln.Addr().String(), "PROCESSING", "timeout-ms 200"} {
		if doc.State != gatewayv1.State_FAILED || !strings.Contains(doc.Error, want) {
			t.Fatalf("state %s error %q, want FAILED naming %q", doc.State, doc.Error, want)
		}
	}
}

// With no peer to dial, a document says why it waits and fails after
// PeerWait with an error naming the peer.
func TestPeerWaitBound(t *testing.T) {
	_, pemCert := selfSigned(t)
	b, err := bridge.New(context.Background(), bridge.Options{DataDir: t.TempDir(), PeerAddr: "127.0.0.1:9",
		PeerCAPEM: pemCert, PeerServerName: "localhost", Logger: quietLogger(), PeerWait: 4 * time.Second})
	must(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	req := wholeReq()
	req.Content = []byte("nobody home")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	waiting := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.WaitReason != "" || terminal(d.State) })
	if !strings.Contains(waiting.WaitReason, "127.0.0.1:9") {
		t.Fatalf("wait reason %q does not name the peer", waiting.WaitReason)
	}
	if !eventLogHas(t, b, d.Id, waiting.WaitReason) {
		t.Fatal("the wait reason is not in the event log")
	}
	if ps := b.Peers(); len(ps) != 1 || ps[0].Addr != "127.0.0.1:9" || (ps[0].State != "down" && ps[0].State != "connecting") {
		t.Fatalf("peers %+v", ps)
	}
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_FAILED || !strings.Contains(doc.Error, "127.0.0.1:9") || !strings.Contains(doc.Error, "peer-wait") {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
}

func docTerminal(d *gatewayv1.Document) bool { return terminal(d.State) }

// eventLogHas reports whether the document's events, replayed from the
// start of the log, include one whose message is msg.
func eventLogHas(t *testing.T, b *bridge.Bridge, docID, msg string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	zero := uint64(0)
	found := false
	_ = b.Events().Subscribe(ctx, "", "", &zero, bridge.EventFilter{DocumentID: docID}, func(ev *gatewayv1.Event) error {
		if ev.Message == msg {
			found = true
			cancel()
		}
		return nil
	})
	return found
}
