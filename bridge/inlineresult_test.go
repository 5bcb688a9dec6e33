package bridge_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

const metaAcceptInline = "pipestream.accept-inline-result"

// Inline results through the embedded peer (docs/profile.md 4.3.2): a
// small whole document finishes on its COMPLETE alone, its result (the
// passthrough: the content) equal to what the result stream gives a large
// one; a result above the 16 KiB offer still comes on a stream.
func TestInlineResultWholeDocument(t *testing.T) {
	forFormats(t, func(t *testing.T, opts ...envOpt) {
		e := newEnv(t, opts...)
		e.waitReady()
		const inlineMetric = "pipestream_bridge_inline_results_total"
		small := pseudoRandom(1<<10, 31)
		doc := e.wait(e.submit(small, nil).Id, 10*time.Second)
		if doc.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("small document: state %s error %q", doc.State, doc.Error)
		}
		if got := e.result(doc.Id); !bytes.Equal(got, small) || doc.ResultSizeBytes != uint64(len(small)) {
			t.Fatalf("small document: result %d octets (size %d), want the %d submitted", len(got), doc.ResultSizeBytes, len(small))
		}
		if n := e.metric(inlineMetric); n != 1 {
			t.Fatalf("%s = %v after one small document, want 1", inlineMetric, n)
		}
		large := pseudoRandom(64<<10, 32)
		doc = e.wait(e.submit(large, nil).Id, 10*time.Second)
		if doc.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("large document: state %s error %q", doc.State, doc.Error)
		}
		if got := e.result(doc.Id); !bytes.Equal(got, large) {
			t.Fatalf("large document: result %d octets, want the %d submitted", len(got), len(large))
		}
		if n := e.metric(inlineMetric); n != 1 {
			t.Fatalf("%s = %v after a 64 KiB document, want still 1 (its result is above the offer: a stream)", inlineMetric, n)
		}
	})
}

// inlineExt is the inline-result extension for out as the result of id.
func inlineExt(t *testing.T, c wire.Codec, id uint32, out []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(out)
	scope := uint32(0)
	ext, err := wire.AppendInlineResultExt(nil, c, &wire.EntityHeader{EntityID: id, ScopeID: &scope, ContentType: "text/plain",
		PayloadLength: uint64(len(out)), Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result"}}, out)
	must(t, err)
	return ext
}

func completeInline(t *testing.T, s *quicpeer.Session, id uint32, ext []byte) {
	t.Helper()
	status(t, s, wire.StatusProcessing, id, 0, 0)
	must(t, s.SendStatus(wire.StatusFrame{Status: wire.StatusComplete, EntityID: id, HasExt: true, Ext: ext}))
}

// A scripted profile peer: the gateway offers inline results on the root
// of a whole document; an inline result is stored exactly as the same
// bytes on a result stream are (result, size, content type); a wrong
// checksum, a malformed extension and one above the offer fail the
// document as a result that failed verification does.
func TestInlineResultScripted(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	c := wire.CodecFor(wire.FormatCBOR)
	ctx := context.Background()
	submit := func(content string) (*gatewayv1.Document, arrival) {
		t.Helper()
		req := wholeReq()
		req.Content = []byte(content)
		d, err := b.Submit(ctx, "", req)
		must(t, err)
		a := p.next(t)
		if got := a.h.Metadata[metaAcceptInline]; got != "16384" {
			t.Fatalf("root header %s = %q, want 16384 (the gateway's offer)", metaAcceptInline, got)
		}
		return d, a
	}
	out := []byte("the processed result")

	d1, a1 := submit("one")
	completeInline(t, a1.s, a1.h.EntityID, inlineExt(t, c, a1.h.EntityID, out))
	d2, a2 := submit("two")
	sendResult(t, a2.s, a2.h.EntityID, out)
	status(t, a2.s, wire.StatusProcessing, a2.h.EntityID, 0, 0)
	status(t, a2.s, wire.StatusComplete, a2.h.EntityID, 0, 0)
	g1 := waitDoc(t, b, d1.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_SUCCEEDED })
	g2 := waitDoc(t, b, d2.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_SUCCEEDED })
	ct1, _, rc1, err := b.Result(ctx, "", d1.Id)
	must(t, err)
	rc1.Close()
	ct2, _, rc2, err := b.Result(ctx, "", d2.Id)
	must(t, err)
	rc2.Close()
	if r1, r2 := resultOf(t, b, "", d1.Id), resultOf(t, b, "", d2.Id); !bytes.Equal(r1, out) || !bytes.Equal(r2, out) ||
		g1.ResultSizeBytes != g2.ResultSizeBytes || ct1 != ct2 || ct1 != "text/plain" {
		t.Fatalf("inline result %q (%d, %q) vs streamed %q (%d, %q); want both %q (text/plain)", r1, g1.ResultSizeBytes, ct1,
			r2, g2.ResultSizeBytes, ct2, out)
	}

	bad := func(name string, mangle func(id uint32) []byte, want string) {
		t.Run(name, func(t *testing.T) {
			d, a := submit(name)
			completeInline(t, a.s, a.h.EntityID, mangle(a.h.EntityID))
			got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_FAILED })
			if !contains(got.Error, "failed verification") || !contains(got.Error, want) {
				t.Fatalf("error %q, want a failed verification mentioning %q", got.Error, want)
			}
		})
	}
	bad("wrong checksum", func(id uint32) []byte {
		ext := inlineExt(t, c, id, out)
		ext[len(ext)-1] ^= 1
		return ext
	}, "SHA-256")
	bad("malformed header", func(id uint32) []byte {
		ext := inlineExt(t, c, id, out)
		binary.BigEndian.PutUint32(ext, uint32(len(ext))) // Header Length beyond the extension
		return ext
	}, "Header Length")
	bad("above the offer", func(id uint32) []byte {
		return inlineExt(t, c, id, bytes.Repeat([]byte("x"), 20<<10))
	}, "exceeds the 16384 offered")
}

// A COMPLETE extension the gateway did not offer is skipped (draft-02
// Section 6.6.1): toward a peer that did not select the profile (here
// --peer-profile on, so the profile is used without the peer's answer)
// the root carries no offer, the extension of its COMPLETE is ignored, and
// the document finishes with the result stream that follows.
func TestInlineResultNotOfferedIsSkipped(t *testing.T) {
	p := startScriptedOffer(t, false, wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}, false)
	b, err := bridge.New(context.Background(), bridge.Options{DataDir: t.TempDir(), PeerAddr: p.ln.Addr().String(),
		PeerCAPEM: p.certPEM, PeerServerName: "localhost", PeerProfile: bridge.ProfileOn, Logger: quietLogger()})
	must(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
		p.stop()
	})
	req := wholeReq()
	req.Content = []byte("content")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	if v, ok := a.h.Metadata[metaAcceptInline]; ok {
		t.Fatalf("root header offers an inline result (%q) to a peer that did not select the profile", v)
	}
	c := wire.CodecFor(wire.FormatCBOR)
	completeInline(t, a.s, a.h.EntityID, inlineExt(t, c, a.h.EntityID, []byte("not taken")))
	streamed := []byte("the streamed result")
	sendResult(t, a.s, a.h.EntityID, streamed)
	waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_SUCCEEDED })
	if got := resultOf(t, b, "", d.Id); !bytes.Equal(got, streamed) {
		t.Fatalf("result %q, want the streamed %q (the unoffered extension skipped)", got, streamed)
	}
}

// Layer 2 before the inline result: a whole document whose first attempt
// fails and is retried by the peer (FAILED, RETRYING, PROCESSING), and one
// that yields first (YIELDED, PROCESSING), both finish with their result
// inline in the final COMPLETE.
func TestInlineResultAfterRetryAndYield(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	const inlineMetric = "pipestream_bridge_inline_results_total"
	whole := func(fault string) *gatewayv1.SubmitDocumentRequest {
		return &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
			Split:            &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE, Processor: "fault"},
			CompletionPolicy: &gatewayv1.CompletionPolicy{Mode: gatewayv1.CompletionPolicy_STRICT, OnFailure: gatewayv1.CompletionPolicy_RETRY, MaxRetries: 2, RetryDelayMs: 10},
			Metadata:         map[string]string{"pipestream.fault": fault}}
	}
	for i, fault := range []string{"fail-once", "yield"} {
		content := pseudoRandom(2<<10, byte(40+i))
		doc := e.wait(e.submit(content, whole(fault)).Id, 20*time.Second)
		if doc.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("%s: state %s error %q", fault, doc.State, doc.Error)
		}
		if got := e.result(doc.Id); !bytes.Equal(got, content) {
			t.Fatalf("%s: result %d octets, want the %d submitted", fault, len(got), len(content))
		}
		if n := e.metric(inlineMetric); n != float64(i+1) {
			t.Fatalf("%s: %s = %v, want %d", fault, inlineMetric, n, i+1)
		}
	}
}
