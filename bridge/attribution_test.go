package bridge_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Result attribution (docs/profile.md 9.4): an entity a peer sends is
// matched to at most one live entity of the session, parent-id first; an
// entity-id is compared only where the conversation leaves no other
// reading; a result that matches nothing, or a second one, is refused,
// logged and counted (pipestream_bridge_results_refused_total).

const refusedMetric = "pipestream_bridge_results_refused_total"

// newPlainEnvReg is newPlainEnv with the bridge's metrics in a registry.
func newPlainEnvReg(t *testing.T) (*scripted, *bridge.Bridge, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	p, b := newPlainEnv(t, func(o *bridge.Options) { o.Registerer = reg })
	return p, b, reg
}

// counter sums the counter name over the series whose labels include
// label=value (value "" = every series).
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			ok := value == ""
			for _, lp := range m.GetLabel() {
				ok = ok || (lp.GetName() == label && lp.GetValue() == value)
			}
			if ok {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// waitCounter waits until counter(...) >= want.
func waitCounter(t *testing.T, reg *prometheus.Registry, name, label, value string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, reg, name, label, value) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s{%s=%q} = %v, want %v", name, label, value, counter(t, reg, name, label, value), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitDocOf(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, id string) *gatewayv1.Document {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		doc, err := b.GetDocument(context.Background(), tenant, id, false)
		must(t, err)
		if terminal(doc.State) {
			return doc
		}
		if time.Now().After(deadline) {
			t.Fatalf("document %s of %q: not terminal: state %s error %q", id, tenant, doc.State, doc.Error)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func resultOf(t *testing.T, b *bridge.Bridge, tenant bridge.Tenant, id string) []byte {
	t.Helper()
	_, _, rc, err := b.Result(context.Background(), tenant, id)
	must(t, err)
	defer rc.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(rc)
	must(t, err)
	return buf.Bytes()
}

// A peer that numbers its results itself (its own counter, parent-id =
// the input) may give a result an entity-id that is another live
// document's id, here the other tenant's: the parent-id decides, so each
// document gets the result of its own content. (The old matching took the
// entity-id first and swapped the two results across tenants.)
func TestPlainAttributionParentIDFirst(t *testing.T) {
	p, b, reg := newPlainEnvReg(t)
	docs := map[bridge.Tenant][]byte{"acme": []byte("alpha: acme's document"), "globex": []byte("bravo: globex's document")}
	ids := map[bridge.Tenant]string{}
	for tenant, content := range docs {
		req := wholeReq()
		req.Content = content
		d, err := b.Submit(context.Background(), tenant, req)
		must(t, err)
		ids[tenant] = d.Id
	}
	roots := map[bridge.Tenant]arrival{}
	for range 2 {
		a := p.next(t)
		for tenant, content := range docs {
			if sum := sha256.Sum256(content); bytes.Equal(a.h.Checksum, sum[:]) {
				roots[tenant] = a
			}
		}
	}
	if len(roots) != 2 {
		t.Fatalf("roots %v: want one per tenant", roots)
	}
	ra, rg := roots["acme"].h.EntityID, roots["globex"].h.EntityID
	s := roots["acme"].s
	for _, id := range []uint32{ra, rg} {
		status(t, s, wire.StatusProcessing, id, 0, 0)
	}
	// Each result's own entity-id is the OTHER document's root id.
	sendNewResult(t, s, rg, ra, bytes.ToUpper(docs["acme"]))
	sendNewResult(t, s, ra, rg, bytes.ToUpper(docs["globex"]))
	for _, id := range []uint32{ra, rg} {
		status(t, s, wire.StatusComplete, id, 0, 0)
	}
	for tenant, content := range docs {
		doc := waitDocOf(t, b, tenant, ids[tenant])
		if doc.State != gatewayv1.State_SUCCEEDED || doc.ResultAbsent {
			t.Fatalf("%s: state %s absent %v error %q", tenant, doc.State, doc.ResultAbsent, doc.Error)
		}
		if got, want := resultOf(t, b, tenant, ids[tenant]), bytes.ToUpper(content); !bytes.Equal(got, want) {
			t.Errorf("%s's result is %q, want %q (the result of its own content)", tenant, got, want)
		}
	}
	if n := counter(t, reg, refusedMetric, "", ""); n != 0 {
		t.Errorf("%v results refused, want none", n)
	}
}

// A dehydrated document onto a peer that numbers its own results from the
// parent's id up: the first chunk result's entity-id equals R. Every
// chunk's result is taken for its chunk (parent-id), none for R, and the
// document's result is all of them in chunk order although they arrive
// in reverse. (The old matching took the first as R's whole result.)
func TestPlainChunkResultsOwnNumbering(t *testing.T) {
	p, b, reg := newPlainEnvReg(t)
	content := bytes.Repeat([]byte("abcdefghijklmnop"), 3*1024) // 48 KiB: 3 chunks of 16 KiB
	req := &gatewayv1.SubmitDocumentRequest{Content: content, ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 16 << 10}}
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	chunks := make([]arrival, 3)
	for range 3 {
		a := p.next(t)
		if a.h.ChunkInfo == nil || a.h.ParentID == nil || a.h.ChunkInfo.ChunkIndex > 2 {
			t.Fatalf("chunk header %+v", a.h)
		}
		chunks[a.h.ChunkInfo.ChunkIndex] = a
	}
	root := *chunks[0].h.ParentID
	next := root // the peer's own counter starts at R's id
	for i := 2; i >= 0; i-- {
		a := chunks[i]
		status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
		out := bytes.ToUpper(content[i*16<<10 : (i+1)*16<<10])
		sendNewResult(t, a.s, next, a.h.EntityID, out)
		next++
		status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	}
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, bytes.ToUpper(content)) {
		t.Fatalf("result: %d octets, want the %d upper-cased octets of all chunks in chunk order", len(got), len(content))
	}
	if n := counter(t, reg, refusedMetric, "", ""); n != 0 {
		t.Errorf("%v results refused, want none", n)
	}
}

// A second result for the same entity is refused (reason duplicate) and
// the first one stands.
func TestPlainSecondResultRefused(t *testing.T) {
	p, b, reg := newPlainEnvReg(t)
	req := wholeReq()
	req.Content = []byte("answer me once")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	r := a.h.EntityID
	status(t, a.s, wire.StatusProcessing, r, 0, 0)
	first := []byte("FIRST ANSWER")
	sendNewResult(t, a.s, 0x7000_0001, r, first)
	waitCounter(t, reg, "pipestream_bridge_bytes_out_total", "", "", float64(len(first)))
	sendNewResult(t, a.s, 0x7000_0002, r, []byte("SECOND ANSWER, FROM ANOTHER DOCUMENT"))
	waitCounter(t, reg, refusedMetric, "reason", "duplicate", 1)
	status(t, a.s, wire.StatusComplete, r, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, first) {
		t.Fatalf("result %q, want the first one %q", got, first)
	}
}

// An entity whose parent-id names nothing live is refused (unmatched),
// never matched by its entity-id instead; once the peer has numbered an
// entity itself, an entity-id without parent-id is its own numbering and
// is refused (ambiguous). Neither reaches a document.
func TestPlainUnmatchedAndAmbiguousRefused(t *testing.T) {
	p, b, reg := newPlainEnvReg(t)
	req := wholeReq()
	req.Content = []byte("only my own result")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	r := a.h.EntityID
	status(t, a.s, wire.StatusProcessing, r, 0, 0)
	// entity-id = R, parent-id = nothing live.
	sendNewResult(t, a.s, r, 0x6000_0000, []byte("STRAY"))
	waitCounter(t, reg, refusedMetric, "reason", "unmatched", 1)
	// entity-id = R, no parent-id, from a peer now known to number itself.
	sum := sha256.Sum256([]byte("AMBIGUOUS"))
	must(t, a.s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: r, ContentType: "text/plain",
		PayloadLength: 9, Checksum: sum[:]}, bytesReader([]byte("AMBIGUOUS"))))
	waitCounter(t, reg, refusedMetric, "reason", "ambiguous", 1)
	want := []byte("ONLY MY OWN RESULT")
	sendNewResult(t, a.s, 0x7000_0001, r, want)
	status(t, a.s, wire.StatusComplete, r, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED || doc.ResultAbsent {
		t.Fatalf("state %s absent %v error %q", doc.State, doc.ResultAbsent, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, want) {
		t.Fatalf("result %q, want %q", got, want)
	}
}

// A peer answering with the input's entity-id (no parent-id, the form of
// profile 9.1 and of the draft-04 reference) is matched by entity-id.
func TestPlainSameIDResult(t *testing.T) {
	p, b, reg := newPlainEnvReg(t)
	req := wholeReq()
	req.Content = []byte("same id")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	r := a.h.EntityID
	status(t, a.s, wire.StatusProcessing, r, 0, 0)
	out := []byte("SAME ID")
	sum := sha256.Sum256(out)
	must(t, a.s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: r, ContentType: "text/plain",
		PayloadLength: uint64(len(out)), Checksum: sum[:]}, bytesReader(out)))
	status(t, a.s, wire.StatusComplete, r, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, out) {
		t.Fatalf("result %q, want %q", got, out)
	}
	if n := counter(t, reg, refusedMetric, "", ""); n != 0 {
		t.Errorf("%v results refused, want none", n)
	}
}

// The profile path has the same rule: a result names R by entity-id and
// carries no parent-id. An entity with role result whose entity-id is R
// but which carries a parent-id is a new entity of the peer's, refused
// (form); the real result after it is the document's.
func TestProfileResultWithParentIDRefused(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p := startScripted(t, false)
	b, err := bridge.New(context.Background(), bridge.Options{DataDir: t.TempDir(), PeerAddr: p.ln.Addr().String(),
		PeerCAPEM: p.certPEM, PeerServerName: "localhost", Logger: quietLogger(), Registerer: reg})
	must(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
		p.stop()
	})
	req := wholeReq()
	req.Content = []byte("profile document")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	r := a.h.EntityID
	status(t, a.s, wire.StatusProcessing, r, 0, 0)
	bad := []byte("NOT MINE")
	sum := sha256.Sum256(bad)
	other := r + 1000
	must(t, a.s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: r, ParentID: &other, ContentType: "text/plain",
		PayloadLength: uint64(len(bad)), Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result"}}, bytesReader(bad)))
	waitCounter(t, reg, refusedMetric, "reason", "form", 1)
	good := []byte("PROFILE DOCUMENT")
	sendResult(t, a.s, r, good)
	status(t, a.s, wire.StatusComplete, r, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, good) {
		t.Fatalf("result %q, want %q", got, good)
	}
	sendResult(t, a.s, r, []byte("late"))
	waitCounter(t, reg, refusedMetric, "reason", "unmatched", 1)
}

// A peer that returns chunk results returns one for every chunk it
// completes: when one is missing once every chunk is COMPLETE, the gateway
// does not assemble the others into the document's result (that would
// drop the chunk's output) but waits; the late result completes it.
func TestPlainMissingChunkResultAwaited(t *testing.T) {
	p, b, _ := newPlainEnvReg(t)
	content := bytes.Repeat([]byte("0123456789abcdef"), 3*1024) // 3 chunks of 16 KiB
	req := &gatewayv1.SubmitDocumentRequest{Content: content, ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 16 << 10}}
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	chunks := make([]arrival, 3)
	for range 3 {
		a := p.next(t)
		chunks[a.h.ChunkInfo.ChunkIndex] = a
	}
	root := *chunks[0].h.ParentID
	part := func(i int) []byte { return bytes.ToUpper(content[i*16<<10 : (i+1)*16<<10]) }
	for i, a := range chunks {
		status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
		if i != 1 {
			sendNewResult(t, a.s, 0x7000_0000+uint32(i), a.h.EntityID, part(i))
		}
		status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	}
	// The gateway rehydrates R itself (the peer never reports it) ...
	waitDoc(t, b, d.Id, func(doc *gatewayv1.Document) bool {
		for _, e := range doc.Entities {
			if e.EntityId == root && e.Status == gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE {
				return true
			}
		}
		return terminal(doc.State)
	})
	// ... and chunk 1's result, late, is still the document's.
	sendNewResult(t, chunks[1].s, 0x7000_0001, chunks[1].h.EntityID, part(1))
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, bytes.ToUpper(content)) {
		t.Fatalf("result: %d octets, want all %d in chunk order (a chunk's output was dropped)", len(got), len(content))
	}
}

// A plain document's root deferred by a plain peer is redeemed with what
// it carried, the raw content (profile 9.1, 6), not the profile envelope;
// the result of the redeemed entity is the document's.
func TestPlainRedemptionCarriesRawContent(t *testing.T) {
	p, b, _ := newPlainEnvReg(t)
	ctx := context.Background()
	req := wholeReq()
	req.Content = []byte("deferred plain content")
	d, err := b.Submit(ctx, "", req)
	must(t, err)
	a := p.next(t)
	r := a.h.EntityID
	status(t, a.s, wire.StatusProcessing, r, 0, 0)
	ext := wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: 91, ExpiryMicros: uint64(time.Now().Add(time.Hour).UnixMicro())})
	must(t, a.s.SendStatus(wire.StatusFrame{Status: wire.StatusDeferred, EntityID: r, HasExt: true, Ext: ext}))
	waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) == 1 })
	redeemed := make(chan error, 1)
	go func() { _, err := b.Redeem(ctx, "", "91"); redeemed <- err }()
	red := p.next(t)
	sum := sha256.Sum256(req.Content)
	if red.h.EntityID != r || red.h.Metadata["pipestream.claim-id"] != "91" || red.h.PayloadLength != uint64(len(req.Content)) || !bytes.Equal(red.h.Checksum, sum[:]) {
		t.Fatalf("redemption header %+v: want entity %d, claim 91 and the %d raw octets of the content", red.h, r, len(req.Content))
	}
	status(t, a.s, wire.StatusProcessing, r, 0, 0)
	must(t, <-redeemed)
	sendNewResult(t, a.s, 1, r, bytes.ToUpper(req.Content))
	status(t, a.s, wire.StatusComplete, r, 0, 0)
	doc := waitDoc(t, b, d.Id, docTerminal)
	if doc.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", doc.State, doc.Error)
	}
	if got := readResult(t, b, d.Id); !bytes.Equal(got, bytes.ToUpper(req.Content)) {
		t.Fatalf("result %q", got)
	}
}
