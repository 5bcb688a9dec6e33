package bridge_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// scripted is a PipeStream peer over real loopback QUIC whose frames the
// test writes by hand: it hands every incoming entity stream to the test
// (payload already read, or aborted with abortCode) and lets the test send
// statuses, digests, barriers and results on the session.
type scripted struct {
	t         *testing.T
	ln        *quicpeer.Listener
	certPEM   []byte
	arrived   chan arrival
	mu        sync.Mutex
	sess      []*quicpeer.Session
	abortCode map[string]wire.ErrorCode // by pipestream.claim-id: read the payload, then abort
	// holdAbort, by pipestream.claim-id: hand the stream to the test with
	// its payload unread, then abort it with the code the test sends.
	holdAbort map[string]chan wire.ErrorCode
	wg        sync.WaitGroup
}

type arrival struct {
	s *quicpeer.Session
	h *wire.EntityHeader
}

func selfSigned(t *testing.T) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "scripted"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: nil, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pemCert
}

func startScripted(t *testing.T, protobuf bool) *scripted {
	// The scripted peer speaks the profile (docs/profile.md 1.1).
	return startScriptedOffer(t, protobuf, wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}, true)
}

// startScriptedOffer starts a scripted peer that offers offer, and the
// profile when profile is set.
func startScriptedOffer(t *testing.T, protobuf bool, offer wire.Capabilities, profile bool) *scripted {
	t.Helper()
	cert, pemCert := selfSigned(t)
	p := &scripted{t: t, certPEM: pemCert, arrived: make(chan arrival, 16), abortCode: map[string]wire.ErrorCode{},
		holdAbort: map[string]chan wire.ErrorCode{}}
	if protobuf {
		f := wire.FormatProtobuf
		offer.SerializationFormat = &f
	}
	ln, err := quicpeer.Listen("127.0.0.1:0", quicpeer.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}},
		Offer: offer, Handler: p, Logger: quietLogger(), Profile: profile})
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			s, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			p.mu.Lock()
			p.sess = append(p.sess, s)
			p.mu.Unlock()
		}
	}()
	return p
}

// stop closes every session and the listener (before the bridge closes its
// own side, the bridge sees a lost session; callers close the bridge first).
func (p *scripted) stop() {
	p.mu.Lock()
	ss := p.sess
	p.mu.Unlock()
	for _, s := range ss {
		_ = s.CloseWithError(0, "test done")
		<-s.Done()
	}
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *scripted) HandleStatus(*quicpeer.Session, wire.StatusFrame)           {}
func (p *scripted) HandleScopeDigest(*quicpeer.Session, wire.ScopeDigestFrame) {}
func (p *scripted) HandleBarrier(*quicpeer.Session, wire.BarrierFrame)         {}
func (p *scripted) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame)  {}
func (p *scripted) HandleClose(*quicpeer.Session, error)                       {}

// HandleGoAway: the bridge is closing (it sends GOAWAY only from Close).
// The scripted peer has no work of its own to finish (the test sends every
// status, and a test that ended leaves its documents where they are), so it
// closes the session at once: the bridge's drain ends on that event instead
// of running out its context (5 s per test with an unfinished document).
func (p *scripted) HandleGoAway(s *quicpeer.Session, _ wire.GoAwayFrame) {
	go func() { _ = s.CloseWithError(0, "scripted peer: nothing left to drain") }()
}
func (p *scripted) HandleEntity(s *quicpeer.Session, e *quicpeer.IncomingEntity) {
	p.mu.Lock()
	hold := p.holdAbort[e.Header.Metadata["pipestream.claim-id"]]
	p.mu.Unlock()
	if hold != nil {
		p.arrived <- arrival{s: s, h: e.Header}
		e.Abort(<-hold)
		return
	}
	_, _ = io.Copy(io.Discard, e.Payload)
	p.mu.Lock()
	code, abort := p.abortCode[e.Header.Metadata["pipestream.claim-id"]]
	p.mu.Unlock()
	if abort {
		e.Abort(code) // after the whole payload: the sender already closed the stream
	}
	p.arrived <- arrival{s: s, h: e.Header}
}

func (p *scripted) next(t *testing.T) arrival {
	t.Helper()
	select {
	case a := <-p.arrived:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no entity stream arrived at the scripted peer")
		return arrival{}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// status sends STATUS(status, id, scope, depth).
func status(t *testing.T, s *quicpeer.Session, st wire.Status, id, scope uint32, depth uint8) {
	t.Helper()
	must(t, s.SendStatus(wire.StatusFrame{Status: st, EntityID: id, ScopeID: scope, Depth: depth}))
}

// subScope runs one Layer 1 scope for parent (profile 6): DEHYDRATING is
// the caller's; here BARRIER waiting, the sub-entities with their final
// statuses, SCOPE_DIGEST, BARRIER released.
func subScope(t *testing.T, s *quicpeer.Session, scope, parent uint32, final []wire.Status, barrier bool) {
	t.Helper()
	if barrier {
		must(t, s.SendBarrier(wire.BarrierFrame{ScopeID: scope, ParentEntityID: parent}))
	}
	var leaves []wire.Leaf
	var ok uint64
	for i, st := range final {
		id := uint32(i + 1)
		status(t, s, wire.StatusProcessing, id, scope, 1)
		status(t, s, st, id, scope, 1)
		leaves = append(leaves, wire.Leaf{EntityID: id, Status: st})
		if st == wire.StatusComplete {
			ok++
		}
	}
	n := uint64(len(final))
	must(t, s.SendScopeDigest(wire.ScopeDigestFrame{ScopeID: scope, Processed: n, Succeeded: ok, Failed: n - ok, MerkleRoot: wire.MerkleRoot(leaves)}))
	if barrier {
		must(t, s.SendBarrier(wire.BarrierFrame{ScopeID: scope, ParentEntityID: parent, Released: true}))
	}
}

func sendResult(t *testing.T, s *quicpeer.Session, id uint32, out []byte) {
	t.Helper()
	sum := sha256.Sum256(out)
	scope := uint32(0)
	must(t, s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: id, ScopeID: &scope, ContentType: "text/plain",
		PayloadLength: uint64(len(out)), Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result"}}, bytesReader(out)))
}

func newScriptedEnv(t *testing.T, protobuf bool) (*scripted, *bridge.Bridge) {
	t.Helper()
	return newScriptedEnvOpts(t, protobuf, nil)
}

// newScriptedEnvOpts is newScriptedEnv with the bridge's options changed by
// set (nil: none) before New.
func newScriptedEnvOpts(t *testing.T, protobuf bool, set func(*bridge.Options)) (*scripted, *bridge.Bridge) {
	t.Helper()
	p := startScripted(t, protobuf)
	o := bridge.Options{DataDir: t.TempDir(), PeerAddr: p.ln.Addr().String(),
		PeerCAPEM: p.certPEM, PeerServerName: "localhost", PreferProtobuf: protobuf, Logger: quietLogger()}
	if set != nil {
		set(&o)
	}
	b, err := bridge.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
		p.stop()
	})
	return p, b
}

func wholeReq() *gatewayv1.SubmitDocumentRequest {
	return &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain", Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_NONE}}
}

func waitDoc(t *testing.T, b *bridge.Bridge, id string, cond func(*gatewayv1.Document) bool) *gatewayv1.Document {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		doc, err := b.GetDocument(context.Background(), "", id, true)
		must(t, err)
		if cond(doc) {
			return doc
		}
		if time.Now().After(deadline) {
			t.Fatalf("document %s: condition not reached: state %s error %q entities %v digests %v", id, doc.State, doc.Error, doc.Entities, doc.Digests)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Profile 6: the BARRIER names the owner of a new scope. Two documents
// dehydrate at once; the second's scope is announced first, so the old
// guess (oldest DEHYDRATING entity) would give it to the first document.
// Scope ID 1 is then reused (after its SCOPE_DIGEST) for the first
// document; and that document's root retries (FAILED -> RETRYING) and
// dehydrates into scope 1 again, so scope 1 has two instances in one
// document: both digests are kept and both verify.
func TestLayer1BarrierAttributionAndScopeReuse(t *testing.T) {
	forFormats(t, func(t *testing.T, opts ...envOpt) {
		protobuf := len(opts) > 0
		p, b := newScriptedEnv(t, protobuf)
		ctx := context.Background()
		req1 := wholeReq()
		req1.CompletionPolicy = &gatewayv1.CompletionPolicy{Mode: gatewayv1.CompletionPolicy_STRICT,
			OnFailure: gatewayv1.CompletionPolicy_RETRY, MaxRetries: 1, RetryDelayMs: 1}
		req1.Content = []byte("one")
		d1, err := b.Submit(ctx, "", req1)
		must(t, err)
		a1 := p.next(t)
		req2 := wholeReq()
		req2.Content = []byte("two")
		d2, err := b.Submit(ctx, "", req2)
		must(t, err)
		a2 := p.next(t)
		s, r1, r2 := a1.s, a1.h.EntityID, a2.h.EntityID

		status(t, s, wire.StatusProcessing, r1, 0, 0)
		status(t, s, wire.StatusProcessing, r2, 0, 0)
		status(t, s, wire.StatusDehydrating, r1, 0, 0)
		status(t, s, wire.StatusDehydrating, r2, 0, 0)
		must(t, s.SendBarrier(wire.BarrierFrame{ScopeID: 1, ParentEntityID: r2}))
		subScope(t, s, 1, r2, []wire.Status{wire.StatusComplete}, false) // barrier sent above
		must(t, s.SendBarrier(wire.BarrierFrame{ScopeID: 1, ParentEntityID: r2, Released: true}))
		// Scope 1 again, now for document 1, with a failing sub-entity.
		subScope(t, s, 1, r1, []wire.Status{wire.StatusComplete, wire.StatusFailed}, true)
		status(t, s, wire.StatusRehydrating, r2, 0, 0)
		sendResult(t, s, r2, []byte("TWO"))
		status(t, s, wire.StatusComplete, r2, 0, 0)
		// Document 1: FAILED, retry, scope 1 once more (one sub-entity).
		status(t, s, wire.StatusRehydrating, r1, 0, 0)
		status(t, s, wire.StatusFailed, r1, 0, 0)
		status(t, s, wire.StatusRetrying, r1, 0, 0)
		status(t, s, wire.StatusProcessing, r1, 0, 0)
		status(t, s, wire.StatusDehydrating, r1, 0, 0)
		subScope(t, s, 1, r1, []wire.Status{wire.StatusComplete}, true)
		status(t, s, wire.StatusRehydrating, r1, 0, 0)
		sendResult(t, s, r1, []byte("ONE"))
		status(t, s, wire.StatusComplete, r1, 0, 0)

		g2 := waitDoc(t, b, d2.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_SUCCEEDED })
		var sub2 []*gatewayv1.Entity
		for _, e := range g2.Entities {
			if e.ScopeId != 0 {
				sub2 = append(sub2, e)
			}
		}
		if len(sub2) != 1 || sub2[0].ParentId != r2 || len(g2.Digests) != 1 || !g2.Digests[0].Verified {
			t.Fatalf("document 2: sub-entities %v digests %v: want scope 1 with one sub-entity of root %d, verified", sub2, g2.Digests, r2)
		}
		g1 := waitDoc(t, b, d1.Id, func(d *gatewayv1.Document) bool { return terminal(d.State) })
		if len(g1.Digests) != 2 {
			t.Fatalf("document 1: digests %v, want both uses of scope 1", g1.Digests)
		}
		for _, dg := range g1.Digests {
			if dg.ScopeId != 1 || !dg.Verified {
				t.Fatalf("document 1: digest %v not verified (error %q)", dg, g1.Error)
			}
		}
		if g1.Digests[0].EntitiesProcessed+g1.Digests[1].EntitiesProcessed != 3 {
			t.Fatalf("document 1 digests %v: want 2 + 1 sub-entities", g1.Digests)
		}
		sub1 := 0
		for _, e := range g1.Entities {
			if e.ScopeId != 0 {
				sub1++
				if e.ParentId != r1 {
					t.Fatalf("document 1 sub-entity %v has parent %d, want %d", e, e.ParentId, r1)
				}
			}
		}
		if sub1 != 3 {
			t.Fatalf("document 1: %d sub-entities %v, want 3 (two scope instances)", sub1, g1.Entities)
		}
	})
}

// A peer that refuses a redemption after the whole payload arrived only
// aborts the stream; the sender has closed it already, so SendEntity
// returns nil and the gateway hears nothing. Silence is no refusal (issue
// 21 item 4): Redeem returns the claim REDEEMED with the redemption
// pending, the document's wait reason says so, and nothing is recorded
// until the peer answers. Here it answers FAILED for the entity: that
// refusal is recorded on the claim, entity and document, and the wait
// reason clears.
func TestRedeemUnansweredStaysPendingUntilThePeerRefuses(t *testing.T) {
	defer bridge.SetRedeemAckTimeout(300 * time.Millisecond)()
	p, b, d, a := deferredScripted(t, wire.CodeClaimNotFound)
	ctx := context.Background()
	c, err := b.Redeem(ctx, "", "77")
	if err != nil || c.State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("Redeem of a claim the peer has not answered: %v %v, want the claim REDEEMED and pending", c, err)
	}
	if r := p.next(t); r.h.Metadata["pipestream.claim-id"] != "77" || r.h.EntityID != a.h.EntityID {
		t.Fatalf("redemption stream %v", r.h)
	}
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.WaitReason != "" })
	if !contains(got.WaitReason, "waiting for the peer's answer") || got.Error != "" || got.ClaimChecks[0].State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("pending redemption: wait reason %q error %q claim %v", got.WaitReason, got.Error, got.ClaimChecks[0])
	}
	// The peer decides: FAILED for the redeemed entity.
	status(t, a.s, wire.StatusFailed, a.h.EntityID, 0, 0)
	got = waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return contains(d.Error, "the peer refused the redemption") })
	if got.WaitReason != "" {
		t.Fatalf("wait reason %q after the peer answered", got.WaitReason)
	}
	var msg string
	for _, e := range got.Entities {
		if e.EntityId == a.h.EntityID {
			msg = e.Message
		}
	}
	if !contains(msg, "claim 77") {
		t.Fatalf("deferred entity message %q, want the refusal", msg)
	}
	var actions []string
	err = b.Events().Subscribe(ctxTimeout(t, 2*time.Second), "", "k", new(uint64), bridge.EventFilter{DocumentID: d.Id}, func(ev *gatewayv1.Event) error {
		if ev.Kind == "#claim" {
			actions = append(actions, ev.ClaimAction)
			if ev.ClaimAction == "rejected" {
				if !contains(ev.Message, "FAILED for the redeemed entity") {
					t.Errorf("#claim rejected event %q, want the peer's FAILED", ev.Message)
				}
				return io.EOF
			}
		}
		return nil
	})
	if !slices.Equal(actions, []string{"issued", "redeemed", "rejected"}) {
		t.Fatalf("#claim events %v (%v), want issued, redeemed, then the peer's rejection", actions, err)
	}
}

// A peer refuses a redemption (FAILED for the redeemed entity) and then
// stops the redemption stream mid-payload with PIPESTREAM_CLAIM_EXPIRED:
// the refusal, recorded by the status handler, is the peer's answer. The
// send's failure records nothing more (no second rejection, no expiry) and
// Redeem reports the refusal.
func TestRedeemRefusedThenStoppedRecordsOneAnswer(t *testing.T) {
	// Above the peer's stream window (quic-go's initial 512 KiB, not
	// grown while nothing is read): the send is still writing the
	// payload when the peer stops the stream.
	p, b, d, _ := deferredScriptedContent(t, 0, bytes.Repeat([]byte("r"), 2<<20))
	stop := make(chan wire.ErrorCode, 1)
	p.mu.Lock()
	p.holdAbort["77"] = stop
	p.mu.Unlock()
	type result struct {
		c   *gatewayv1.ClaimCheck
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := b.Redeem(context.Background(), "", "77")
		done <- result{c, err}
	}()
	r := p.next(t) // the redemption stream, its payload unread
	status(t, r.s, wire.StatusFailed, r.h.EntityID, 0, 0)
	waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return contains(d.Error, "the peer refused the redemption") })
	stop <- wire.CodeClaimExpired
	var got result
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Redeem did not return after the peer stopped the redemption stream")
	}
	if !errors.Is(got.err, bridge.ErrFailedPrecondition) || !contains(got.err.Error(), "FAILED for the redeemed entity") {
		t.Fatalf("Redeem: %v %v, want the peer's refusal (FAILED), not the stopped stream", got.c, got.err)
	}
	doc := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return terminal(d.State) })
	if n := strings.Count(doc.Error, "claim 77"); doc.ClaimChecks[0].State != gatewayv1.ClaimCheck_REDEEMED || n != 1 {
		t.Fatalf("claim %v, document error %q (%d mentions of the claim), want the claim REDEEMED and one refusal", doc.ClaimChecks[0], doc.Error, n)
	}
	var actions []string
	_ = b.Events().Subscribe(ctxTimeout(t, time.Second), "", "k", new(uint64), bridge.EventFilter{DocumentID: d.Id}, func(ev *gatewayv1.Event) error {
		if ev.Kind == "#claim" {
			actions = append(actions, ev.ClaimAction)
		}
		return nil
	})
	if !slices.Equal(actions, []string{"issued", "redeemed", "rejected"}) {
		t.Fatalf("#claim events %v, want issued, redeemed, then one rejection", actions)
	}
}

// A slow peer acknowledges a redemption only after Redeem stopped waiting:
// the claim is never recorded as refused, the pending wait reason clears
// when PROCESSING arrives, and the document goes on.
func TestRedeemSlowPeerIsNotARefusal(t *testing.T) {
	defer bridge.SetRedeemAckTimeout(300 * time.Millisecond)()
	p, b, d, a := deferredScripted(t, 0)
	c, err := b.Redeem(context.Background(), "", "77")
	if err != nil || c.State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("Redeem: %v %v", c, err)
	}
	p.next(t) // the redemption stream, read; the peer says nothing yet
	waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return contains(d.WaitReason, "waiting for the peer's answer") })
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.WaitReason == "" })
	if got.Error != "" || got.ClaimChecks[0].State != gatewayv1.ClaimCheck_REDEEMED || terminal(got.State) {
		t.Fatalf("after a late acknowledgement: state %s error %q claim %v", got.State, got.Error, got.ClaimChecks[0])
	}
	for _, e := range got.Entities {
		if e.EntityId == a.h.EntityID && e.Status != gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING {
			t.Fatalf("redeemed entity %v, want PROCESSING", e)
		}
	}
}

// A redemption still pending when its session ends is carried to the
// document's next attempt, never dropped or counted as refused: the peer
// defers the entity again with a new claim, and the gateway resumes it
// through that claim by itself.
func TestRedeemPendingCarriesToTheNextAttempt(t *testing.T) {
	defer bridge.SetRedeemAckTimeout(300 * time.Millisecond)()
	p, b, d, a := deferredScripted(t, 0)
	if _, err := b.Redeem(context.Background(), "", "77"); err != nil {
		t.Fatalf("Redeem: %v", err)
	}
	p.next(t) // the redemption of 77; the peer says nothing
	waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return contains(d.WaitReason, "waiting for the peer's answer") })
	_ = a.s.CloseWithError(wire.CodeInternalError, "scripted peer: session lost")
	a2 := p.next(t) // the document again, on a new session
	if a2.s == a.s || a2.h.Metadata["pipestream.claim-id"] != "" {
		t.Fatalf("after the lost session: %v on the same session %v, want the document's next attempt", a2.h, a2.s == a.s)
	}
	status(t, a2.s, wire.StatusProcessing, a2.h.EntityID, 0, 0)
	ext := wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: 78, ExpiryMicros: uint64(time.Now().Add(time.Hour).UnixMicro())})
	must(t, a2.s.SendStatus(wire.StatusFrame{Status: wire.StatusDeferred, EntityID: a2.h.EntityID, HasExt: true, Ext: ext}))
	r := p.next(t)
	if r.s != a2.s || r.h.EntityID != a2.h.EntityID || r.h.Metadata["pipestream.claim-id"] != "78" {
		t.Fatalf("after the peer deferred the entity again: %v, want the redemption of claim 78 on the new session", r.h)
	}
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 2 })
	for _, c := range got.ClaimChecks {
		if c.State != gatewayv1.ClaimCheck_REDEEMED {
			t.Fatalf("claim %s is %s, want both REDEEMED (77 by the client, 78 through it)", c.ClaimId, c.State)
		}
	}
	if got.Error != "" {
		t.Fatalf("document error %q: nothing was refused", got.Error)
	}
}

// deferredScripted submits a whole document that the scripted peer defers
// with claim 77; abort (non-zero) makes the peer abort the redemption
// stream with that code after reading its payload.
func deferredScripted(t *testing.T, abort wire.ErrorCode) (*scripted, *bridge.Bridge, *gatewayv1.Document, arrival) {
	t.Helper()
	return deferredScriptedContent(t, abort, []byte("deferred"))
}

// deferredScriptedContent is deferredScripted for a document of content.
func deferredScriptedContent(t *testing.T, abort wire.ErrorCode, content []byte) (*scripted, *bridge.Bridge, *gatewayv1.Document, arrival) {
	t.Helper()
	p, b := newScriptedEnv(t, false)
	req := wholeReq()
	req.Content = content
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	if abort != 0 {
		p.mu.Lock()
		p.abortCode["77"] = abort
		p.mu.Unlock()
	}
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
	ext := wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: 77, ExpiryMicros: uint64(time.Now().Add(time.Hour).UnixMicro())})
	must(t, a.s.SendStatus(wire.StatusFrame{Status: wire.StatusDeferred, EntityID: a.h.EntityID, HasExt: true, Ext: ext}))
	waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 1 })
	return p, b, d, a
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
