package peer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Plain draft-02 entities (docs/profile.md, "Plain use (no profile)"):
// no pipestream.profile marker, raw payloads, the generic result form.

// sendPlainRoot sends content as a plain entity (no marker) and returns
// its ID.
func (c *client) sendPlainRoot(t *testing.T, content []byte, md map[string]string, pol *wire.CompletionPolicy) uint32 {
	t.Helper()
	id := c.assign(t)
	h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain", Metadata: md, CompletionPolicy: pol}
	if err := c.sendPlain(t, h, content); err != nil {
		t.Fatal(err)
	}
	return id
}

// sendPlainChild sends a plain child of root.
func (c *client) sendPlainChild(t *testing.T, root, id uint32, total, idx, off int, data []byte, md map[string]string, pol *wire.CompletionPolicy) {
	t.Helper()
	p := root
	h := &wire.EntityHeader{EntityID: id, ParentID: &p, ContentType: "text/plain", Metadata: md, CompletionPolicy: pol,
		ChunkInfo: &wire.ChunkInfo{TotalChunks: uint64(total), ChunkIndex: uint64(idx), ChunkOffset: uint64(off)}}
	if err := c.sendPlain(t, h, data); err != nil {
		t.Fatal(err)
	}
}

// announce sends STATUS(root, DEHYDRATING).
func (c *client) announce(t *testing.T, root uint32) {
	t.Helper()
	if err := c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root}); err != nil {
		t.Fatal(err)
	}
}

// waitPlainResult waits for the result of id and checks the generic form:
// exactly entity-id, layer, content-type, payload-length and checksum.
func (r *recorder) waitPlainResult(t *testing.T, id uint32) result {
	t.Helper()
	var res result
	r.waitFor(t, "result of "+itoa(id), func() bool {
		var ok bool
		res, ok = r.results[id]
		return ok
	})
	if res.err != nil {
		t.Fatalf("result stream of %d: %v", id, res.err)
	}
	checkGeneric(t, res.h, id)
	if !bytes.Equal(res.h.Checksum, res.sum[:]) || res.h.PayloadLength != uint64(res.n) {
		t.Fatalf("result of %d: header %+v does not describe the %d octets received", id, res.h, res.n)
	}
	return res
}

// checkGeneric fails unless h is the generic result header of entity id.
func checkGeneric(t *testing.T, h *wire.EntityHeader, id uint32) {
	t.Helper()
	if h.EntityID != id || h.ParentID != nil || h.ScopeID != nil || h.Metadata != nil || h.ChunkInfo != nil ||
		h.CompletionPolicy != nil || h.ContentType == "" || len(h.Checksum) != sha256.Size {
		t.Fatalf("result header of %d is not the generic form {entity-id, layer, content-type, payload-length, checksum}: %+v", id, h)
	}
}

// A plain entity of 1 KiB or 8 MiB comes back unchanged (passthrough) in
// the generic form, with exactly PROCESSING then COMPLETE.
func TestPlainRoundTrip(t *testing.T) {
	for _, size := range []int{1 << 10, 8 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			srv := startPeer(t, peer.Options{})
			c := dial(t, srv, wire.FormatCBOR, nil)
			content := make([]byte, size)
			rand.Read(content)
			id := c.sendPlainRoot(t, content, nil, nil)
			res := c.rec.waitPlainResult(t, id)
			c.rec.waitStatus(t, id, wire.StatusComplete)
			if !bytes.Equal(res.data, content) || res.h.Layer != 0 || res.h.ContentType != "text/plain" {
				t.Fatalf("result: %d octets, layer %d, content-type %q; want the %d input octets, layer 0, text/plain",
					len(res.data), res.h.Layer, res.h.ContentType, size)
			}
			if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
				t.Fatalf("statuses %v, want PROCESSING COMPLETE", got)
			}
		})
	}
}

// 200 plain entities in flight at once each get their own bytes back.
func TestPlainConcurrent(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	const n = 200
	ids := make([]uint32, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = c.assign(t)
		wg.Go(func() {
			data := []byte(fmt.Sprint("entity ", i))
			sum := sha256.Sum256(data)
			h := &wire.EntityHeader{EntityID: ids[i], ContentType: "application/octet-stream", PayloadLength: uint64(len(data)), Checksum: sum[:]}
			if err := c.sess.SendEntity(context.Background(), h, bytes.NewReader(data)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		res := c.rec.waitPlainResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		if string(res.data) != fmt.Sprint("entity ", i) {
			t.Fatalf("entity %d: result %q", id, res.data)
		}
		if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
			t.Fatalf("entity %d: statuses %v", id, got)
		}
	}
}

// pipestream.processor selects the processor of a plain entity; the
// result carries the processor's layer and content-type.
func TestPlainTextStats(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	text := []byte("A cat. A dog!\nA bird?\n")
	id := c.sendPlainRoot(t, text, map[string]string{peer.MetaProcessor: "textstats"}, nil)
	res := c.rec.waitPlainResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	want, err := peer.TextStats{}.Process(context.Background(), &peer.Input{Header: &wire.EntityHeader{}, Payload: text, ChunkIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	var st peer.TextStatsResult
	if err := json.Unmarshal(res.data, &st); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.data, want.Data) || res.h.Layer != want.Layer || res.h.ContentType != want.ContentType || st.Words != 6 {
		t.Fatalf("result %s (layer %d, %q), want %s (layer %d, %q)", res.data, res.h.Layer, res.h.ContentType, want.Data, want.Layer, want.ContentType)
	}
}

// Plain N:1: DEHYDRATING, three plain children (total-chunks only on the
// last), one result entity R with the concatenation, statuses in order.
func TestPlainDehydration(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root := c.assign(t)
	kids := []uint32{c.assign(t), c.assign(t), c.assign(t)}
	chunks := []string{"alpha ", "beta ", "gamma"}
	c.announce(t, root)
	off := 0
	for i, ch := range chunks {
		total := 0
		if i == len(chunks)-1 {
			total = len(chunks)
		}
		c.sendPlainChild(t, root, kids[i], total, i, off, []byte(ch), nil, nil)
		off += len(ch)
	}
	res := c.rec.waitPlainResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if string(res.data) != "alpha beta gamma" {
		t.Fatalf("result %q", res.data)
	}
	if got := c.rec.history(0, root); !slices.Equal(got, statuses(wire.StatusRehydrating, wire.StatusComplete)) {
		t.Fatalf("root statuses %v, want REHYDRATING COMPLETE", got)
	}
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	for _, k := range kids {
		if got := c.rec.historyLocked(0, k); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
			t.Fatalf("child %d statuses %v", k, got)
		}
		if _, ok := c.rec.results[k]; ok {
			t.Fatalf("child %d got a result of its own", k)
		}
	}
	last := -1
	for i, f := range c.rec.statuses {
		if f.EntityID == root && f.Status == wire.StatusRehydrating {
			last = i
		}
	}
	for i, f := range c.rec.statuses {
		if slices.Contains(kids, f.EntityID) && f.Status == wire.StatusComplete && i > last {
			t.Fatalf("child %d COMPLETE after REHYDRATING of the root: %s", f.EntityID, fmtStatuses(c.rec.statuses))
		}
	}
}

// Under STRICT (no policy) a failed child fails R without a result.
func TestPlainChildFailureStrict(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root := c.assign(t)
	kids := []uint32{c.assign(t), c.assign(t)}
	c.announce(t, root)
	c.sendPlainChild(t, root, kids[0], 0, 0, 0, []byte("good"), nil, nil)
	c.sendPlainChild(t, root, kids[1], 2, 1, 4, []byte("bad"), fault(peer.FaultFail), nil)
	c.rec.waitStatus(t, root, wire.StatusFailed)
	// A control entity after R's FAILED gives a result of R, which the peer
	// would have sent before R's terminal status, time to arrive (the
	// engine test TestPlainOrderNto1Failure checks the order exactly).
	ctl := c.sendPlainRoot(t, []byte("control"), nil, nil)
	c.rec.waitPlainResult(t, ctl)
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	if got := c.rec.historyLocked(0, root); !slices.Equal(got, statuses(wire.StatusRehydrating, wire.StatusFailed)) {
		t.Fatalf("root statuses %v, want REHYDRATING FAILED", got)
	}
	if got := c.rec.historyLocked(0, kids[1]); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusFailed)) {
		t.Fatalf("failed child statuses %v", got)
	}
	if _, ok := c.rec.results[root]; ok {
		t.Fatal("a FAILED plain parent got a result")
	}
}

// The profile marker decides the path: the same PipeDoc envelope (valid
// CBOR) is unwrapped when marked and comes back as it is when not.
func TestProfileMarkerSelectsPath(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	marked := c.sendWhole(t, "inside the envelope", nil, nil) // c.send marks it
	res := c.rec.waitResult(t, marked)
	c.rec.waitStatus(t, marked, wire.StatusComplete)
	if string(res.data) != "inside the envelope" || res.h.Metadata[peer.MetaRole] != "result" {
		t.Fatalf("marked entity: result %q, metadata %v; want the blob with role result", res.data, res.h.Metadata)
	}

	id := c.assign(t)
	env := c.envelope(t, id, []byte("inside the envelope"))
	if err := c.sendPlain(t, &wire.EntityHeader{EntityID: id, ContentType: "application/cbor"}, env); err != nil {
		t.Fatal(err)
	}
	plain := c.rec.waitPlainResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if !bytes.Equal(plain.data, env) {
		t.Fatalf("unmarked valid CBOR: result %x, want the payload as sent %x", plain.data, env)
	}
	// A marker with another value is not the profile either.
	id = c.sendPlainRoot(t, []byte("v2?"), map[string]string{peer.MetaProfile: "2"}, nil)
	if res := c.rec.waitPlainResult(t, id); string(res.data) != "v2?" {
		t.Fatalf("pipestream.profile=2: result %q", res.data)
	}
}

// The completion policy of a plain entity applies: retries and timeouts.
func TestPlainPolicy(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendPlainRoot(t, []byte("payload"), fault(peer.FaultFailOnce), retryPolicy(2, 1))
	res := c.rec.waitPlainResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	want := statuses(wire.StatusProcessing, wire.StatusFailed, wire.StatusRetrying, wire.StatusProcessing, wire.StatusComplete)
	if got := c.rec.history(0, id); !slices.Equal(got, want) || string(res.data) != "payload" {
		t.Fatalf("statuses %v, want %v; result %q", got, want, res.data)
	}
	// timeout-ms ends a stalled attempt: the wait is for the status event
	id = c.sendPlainRoot(t, []byte("x"), fault(peer.FaultTimeout), timeoutPolicy(50, wire.ActionFail, 0))
	c.rec.waitStatus(t, id, wire.StatusAbandoned)
	if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusAbandoned)) {
		t.Fatalf("statuses %v, want PROCESSING ABANDONED", got)
	}
}

// Plain children that arrive before their parent is announced are
// processed at once and rehydrated when the announcement comes.
func TestPlainChildrenBeforeAnnouncement(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root := c.assign(t)
	kids := []uint32{c.assign(t), c.assign(t)}
	c.sendPlainChild(t, root, kids[1], 2, 1, 3, []byte("def"), nil, nil)
	c.sendPlainChild(t, root, kids[0], 0, 0, 0, []byte("abc"), nil, nil)
	for _, k := range kids {
		c.rec.waitStatus(t, k, wire.StatusComplete)
	}
	if got := c.rec.history(0, root); len(got) != 0 {
		t.Fatalf("root statuses before the announcement: %v", got)
	}
	c.announce(t, root)
	res := c.rec.waitPlainResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if string(res.data) != "abcdef" {
		t.Fatalf("result %q", res.data)
	}
}

// A plain entity with a parent-id but no chunk-info is processed 1:1; its
// result has no parent-id.
func TestPlainParentWithoutChunkInfo(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	other, id := c.assign(t), c.assign(t)
	if err := c.sendPlain(t, &wire.EntityHeader{EntityID: id, ParentID: &other, ContentType: "text/plain"}, []byte("on its own")); err != nil {
		t.Fatal(err)
	}
	res := c.rec.waitPlainResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if string(res.data) != "on its own" {
		t.Fatalf("result %q", res.data)
	}
}

// fault defer on a plain entity (Layer 2) issues a claim check; a profile
// redemption carrying the raw content completes it, and the result keeps
// the generic form of the entity it stands for.
func TestPlainDeferRedeemed(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendPlainRoot(t, []byte("later"), fault(peer.FaultDefer), nil)
	cc := c.deferred(t, id)
	if err := c.redeem(t, id, cc.ClaimID, []byte("later")); err != nil {
		t.Fatal(err)
	}
	res := c.rec.waitPlainResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	want := statuses(wire.StatusProcessing, wire.StatusDeferred, wire.StatusProcessing, wire.StatusComplete)
	if got := c.rec.history(0, id); !slices.Equal(got, want) || string(res.data) != "later" {
		t.Fatalf("statuses %v, want %v; result %q", got, want, res.data)
	}
}

// pipestream.claim-id on an unmarked entity is ordinary metadata: the
// entity is processed, not taken for a redemption.
func TestPlainClaimIDIsMetadata(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendPlainRoot(t, []byte("not a redemption"), map[string]string{peer.MetaClaimID: "12345"}, nil)
	res := c.rec.waitPlainResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if string(res.data) != "not a redemption" {
		t.Fatalf("result %q", res.data)
	}
}
