package peer_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// deferred waits for DEFERRED on id and returns its claim check.
func (c *client) deferred(t *testing.T, id uint32) wire.ClaimCheckExtension {
	t.Helper()
	f := c.rec.waitStatus(t, id, wire.StatusDeferred)
	cc, err := f.ClaimCheck()
	if err != nil || cc.ClaimID == 0 {
		t.Fatalf("claim check extension %+v: %v", cc, err)
	}
	return cc
}

// redeem sends a redemption stream for claim with entity id (profile 6).
func (c *client) redeem(t *testing.T, id uint32, claim uint64, payload []byte) error {
	t.Helper()
	h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain",
		Metadata: map[string]string{peer.MetaClaimID: strconv.FormatUint(claim, 10)}}
	return c.send(t, h, payload)
}

// big is a payload larger than QUIC's initial stream window, so that a
// peer that aborts the stream before reading makes SendEntity fail with
// the abort code.
var big = bytes.Repeat([]byte("z"), 2<<20)

func TestClaimRedeemSameSessionThenReplay(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "deferred work", fault("defer"), nil)
		cc := c.deferred(t, id)
		if exp := time.UnixMicro(int64(cc.ExpiryMicros)); time.Until(exp) < 23*time.Hour {
			t.Fatalf("default expiry %v, want the 24h claim-check limit", exp)
		}
		if err := c.redeem(t, id, cc.ClaimID, c.envelope(t, id, []byte("deferred work"))); err != nil {
			t.Fatal(err)
		}
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		want := statuses(wire.StatusProcessing, wire.StatusDeferred, wire.StatusProcessing, wire.StatusComplete)
		if got := c.rec.history(0, id); !equal(got, want) || string(res.data) != "deferred work" {
			t.Fatalf("statuses %v result %q", got, res.data)
		}
		// replay with a fresh ID
		id2 := c.assign(t)
		err := c.redeem(t, id2, cc.ClaimID, big)
		if wire.CodeOf(err) != wire.CodeClaimNotFound {
			t.Fatalf("replay: err %v, want CLAIM_NOT_FOUND", err)
		}
		c.rec.waitStatus(t, id2, wire.StatusFailed)
	})
}

func TestClaimUnknownAndExpired(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	if err := c.redeem(t, c.assign(t), 42, big); wire.CodeOf(err) != wire.CodeClaimNotFound {
		t.Fatalf("unknown claim: %v", err)
	}
	md := fault("defer")
	md[peer.MetaClaimTTL] = "150"
	id := c.sendWhole(t, "x", md, nil)
	cc := c.deferred(t, id)
	c.rec.waitStatus(t, id, wire.StatusAbandoned) // expired unredeemed: ABANDONED
	if err := c.redeem(t, c.assign(t), cc.ClaimID, big); wire.CodeOf(err) != wire.CodeClaimExpired {
		t.Fatalf("expired claim: %v", err)
	}
}

// A deferred chunk holds its document until the claim is redeemed; the
// redeemed output is rehydrated in place.
func TestDeferredChildRedeemedIntoDocument(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	md := fault("defer")
	md[peer.MetaFaultChunks] = "1"
	root, kids := c.sendDehydrated(t, []string{"a\n", "b\n", "c\n"}, md, nil, true)
	cc := c.deferred(t, kids[1])
	// Barrier: every chunk's handling has returned (the deferred one
	// included) and no rehydration runs; a REHYDRATING the peer sent
	// would arrive before the statuses of a later document (stream 0 is
	// ordered).
	waitNoGoroutineIn(t, "peer.(*engine).child(")
	waitNoGoroutineIn(t, "peer.(*engine).rehydrate(")
	barrier := c.sendWhole(t, "barrier", nil, nil)
	c.rec.waitStatus(t, barrier, wire.StatusComplete)
	if got := c.rec.history(0, root); slices.Contains(got, wire.StatusRehydrating) {
		t.Fatal("rehydrating while a child is deferred")
	}
	p := root
	h := &wire.EntityHeader{EntityID: kids[1], ParentID: &p, Metadata: map[string]string{peer.MetaClaimID: strconv.FormatUint(cc.ClaimID, 10)},
		ChunkInfo: &wire.ChunkInfo{TotalChunks: 3, ChunkIndex: 1, ChunkOffset: 2}}
	if err := c.send(t, h, []byte("b\n")); err != nil {
		t.Fatal(err)
	}
	res := c.rec.waitResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if string(res.data) != "a\nb\nc\n" {
		t.Fatalf("result %q", res.data)
	}
}

// Claims and the redeemed set survive a peer restart on the same data dir;
// so does the certificate.
func TestClaimsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	srv := startPeer(t, peer.Options{DataDir: dir, DrainTimeout: 200 * time.Millisecond})
	pem1 := srv.CertPEM()
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendWhole(t, "later", fault("defer"), nil)
	cc := c.deferred(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	if fi, err := os.Stat(filepath.Join(dir, peer.KeyFileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}

	srv2 := startPeer(t, peer.Options{DataDir: dir})
	if !bytes.Equal(srv2.CertPEM(), pem1) {
		t.Fatal("certificate not reused across restarts")
	}
	c2 := dial(t, srv2, wire.FormatCBOR, nil)
	id2 := c2.assign(t)
	if err := c2.redeem(t, id2, cc.ClaimID, c2.envelope(t, id, []byte("later"))); err != nil {
		t.Fatal(err)
	}
	res := c2.rec.waitResult(t, id2)
	c2.rec.waitStatus(t, id2, wire.StatusComplete)
	if got := c2.rec.history(0, id2); !equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) || string(res.data) != "later" {
		t.Fatalf("statuses %v result %q", got, res.data)
	}
	if err := c2.redeem(t, c2.assign(t), cc.ClaimID, big); wire.CodeOf(err) != wire.CodeClaimNotFound {
		t.Fatalf("replay after restart: %v", err)
	}
}

// Shutdown sends GOAWAY, keeps processing what was accepted, then closes
// with PIPESTREAM_NO_ERROR.
func TestShutdownGoAwayDrains(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root := c.assign(t)
	k0, k1 := c.assign(t), c.assign(t)
	if err := c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root}); err != nil {
		t.Fatal(err)
	}
	child := func(id uint32, idx uint64, s string) {
		p := root
		if err := c.send(t, &wire.EntityHeader{EntityID: id, ParentID: &p, ChunkInfo: &wire.ChunkInfo{TotalChunks: 2, ChunkIndex: idx}}, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	child(k1, 1, "second")
	c.rec.waitStatus(t, k1, wire.StatusComplete)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- srv.Shutdown(ctx)
	}()
	c.rec.waitFor(t, "GOAWAY", func() bool { return len(c.rec.goaways) > 0 })
	if last := c.rec.goaways[0].LastEntityID; last != k1 {
		t.Fatalf("GOAWAY last entity %d, want %d", last, k1)
	}
	child(k0, 0, "first ")
	h := &wire.EntityHeader{EntityID: root, Metadata: map[string]string{peer.MetaTotalChunks: "2"}}
	if err := c.send(t, h, c.envelope(t, root, nil)); err != nil {
		t.Fatal(err)
	}
	res := c.rec.waitResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if string(res.data) != "first second" {
		t.Fatalf("result %q", res.data)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	c.rec.waitFor(t, "close", func() bool { return c.rec.closed })
	if c.rec.closeErr != nil {
		t.Fatalf("closed with %v, want PIPESTREAM_NO_ERROR", c.rec.closeErr)
	}
}

func equal(a, b []wire.Status) bool { return bytes.Equal(toBytes(a), toBytes(b)) }
func toBytes(s []wire.Status) []byte {
	b := make([]byte, len(s))
	for i, v := range s {
		b[i] = byte(v)
	}
	return b
}

// A child whose payload does not match its checksum is FAILED before any
// processing is committed; STRICT then fails the document.
func TestChildChecksumMismatchFailsDocument(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root, k := c.assign(t), c.assign(t)
	c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root})
	p := root
	bad := bytes.Repeat([]byte{0}, 32)
	h := &wire.EntityHeader{EntityID: k, ParentID: &p, ChunkInfo: &wire.ChunkInfo{TotalChunks: 1}, PayloadLength: 4, Checksum: bad,
		Metadata: profileMD(nil)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.sess.SendEntity(ctx, h, bytes.NewReader([]byte("data")))
	c.rec.waitStatus(t, k, wire.StatusFailed)
	if err := c.send(t, &wire.EntityHeader{EntityID: root, Metadata: map[string]string{peer.MetaTotalChunks: "1"}}, c.envelope(t, root, nil)); err != nil {
		t.Fatal(err)
	}
	c.rec.waitStatus(t, root, wire.StatusFailed)
	c.rec.mu.Lock()
	_, ok := c.rec.results[root]
	c.rec.mu.Unlock()
	if ok {
		t.Fatal("result sent for a document whose only chunk failed its checksum")
	}
}

// Orphans are bounded: children of more root-less documents than
// OrphanDocs are aborted with PIPESTREAM_WINDOW_EXCEEDED and FAILED.
func TestOrphanBound(t *testing.T) {
	srv := startPeer(t, peer.Options{OrphanDocs: 1})
	c := dial(t, srv, wire.FormatCBOR, nil)
	r1, k1, r2, k2 := c.assign(t), c.assign(t), c.assign(t), c.assign(t)
	send := func(root, id uint32) {
		p := root
		c.send(t, &wire.EntityHeader{EntityID: id, ParentID: &p, ChunkInfo: &wire.ChunkInfo{TotalChunks: 1}}, []byte("x"))
	}
	send(r1, k1)
	c.rec.waitStatus(t, k1, wire.StatusComplete)
	send(r2, k2)
	c.rec.waitStatus(t, k2, wire.StatusFailed)
	// the first orphan is adopted when its document shows up
	c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: r1})
	if err := c.send(t, &wire.EntityHeader{EntityID: r1, Metadata: map[string]string{peer.MetaTotalChunks: "1"}}, c.envelope(t, r1, nil)); err != nil {
		t.Fatal(err)
	}
	if res := c.rec.waitResult(t, r1); string(res.data) != "x" {
		t.Fatalf("result %q", res.data)
	}
}

// STATUS(R, ABANDONED) from the gateway cancels the document: the peer
// stops and sends nothing more for it.
func TestGatewayCancel(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendWhole(t, "x", fault("timeout"), nil)
	c.rec.waitStatus(t, id, wire.StatusProcessing)
	if err := c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusAbandoned, EntityID: id}); err != nil {
		t.Fatal(err)
	}
	// Barrier: once the peer's handling of the cancelled entity has
	// returned, nothing more can be sent for it, and a status it sent
	// arrives before those of a later document (the peer's stream 0 is
	// ordered).
	waitNoGoroutineIn(t, "peer.(*engine).standalone(")
	barrier := c.sendWhole(t, "barrier", nil, nil)
	c.rec.waitStatus(t, barrier, wire.StatusComplete)
	if got := c.rec.history(0, id); !equal(got, statuses(wire.StatusProcessing)) {
		t.Fatalf("peer sent %v after the cancel", got)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	listening := make(chan struct{})
	sig := &logSignal{msg: "peer listening", ch: listening}
	opts := peer.Options{DataDir: t.TempDir(), Logger: slog.New(signalHandler{Handler: testLogger(t).Handler(), sig: sig})}
	go func() { done <- peer.Run(ctx, opts) }()
	select {
	case <-listening: // Start returned: Run now waits for ctx
	case err := <-done:
		t.Fatalf("Run returned %v before listening", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the peer did not log that it listens")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := peer.Start(peer.Options{}); err == nil {
		t.Fatal("Start without DataDir accepted")
	}
	if _, err := peer.Start(peer.Options{DataDir: t.TempDir(), CertFile: "x.pem"}); err == nil {
		t.Fatal("--cert without --key accepted")
	}
}

// logSignal is closed the first time a record with message msg is logged.
type logSignal struct {
	msg  string
	ch   chan struct{}
	once sync.Once
}

// signalHandler passes records on to Handler and, whatever the level,
// fires sig; loggers derived with With and WithGroup keep the signal.
type signalHandler struct {
	slog.Handler
	sig *logSignal
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.sig.msg {
		h.sig.once.Do(func() { close(h.sig.ch) })
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h signalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return signalHandler{Handler: h.Handler.WithAttrs(as), sig: h.sig}
}

func (h signalHandler) WithGroup(name string) slog.Handler {
	return signalHandler{Handler: h.Handler.WithGroup(name), sig: h.sig}
}

// waitNoGoroutineIn waits until no goroutine's stack has the frame fn,
// polling the stacks (10 s at most).
func waitNoGoroutineIn(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		if !strings.Contains(string(buf), fn) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a goroutine still runs %s after 10 s\n%s", fn, buf)
		}
		time.Sleep(10 * time.Millisecond) // polling period of a condition with a deadline
	}
}
