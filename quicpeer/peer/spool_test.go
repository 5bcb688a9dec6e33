package peer_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// heapPeak samples runtime.MemStats.HeapInuse until stop is called and
// returns the highest value seen.
func heapPeak() (stop func() uint64) {
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// sendGenerated sends a dehydrated passthrough document of n chunks of
// chunkBytes pseudo-random octets, generated chunk by chunk into one
// buffer, and returns its root ID and content SHA-256.
func (c *client) sendGenerated(t *testing.T, n, chunkBytes int) (uint32, [32]byte) {
	t.Helper()
	root := c.assign(t)
	if err := c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root}); err != nil {
		t.Fatal(err)
	}
	content := sha256.New()
	buf := make([]byte, chunkBytes)
	for i := range n {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		for j := 0; j < len(buf); j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		content.Write(buf)
		p := root
		h := &wire.EntityHeader{EntityID: c.assign(t), ParentID: &p, ContentType: "application/octet-stream",
			Metadata:  map[string]string{peer.MetaAcceptResultParts: "1"}, // streamed, as to the gateway
			ChunkInfo: &wire.ChunkInfo{TotalChunks: uint64(n), ChunkIndex: uint64(i), ChunkOffset: uint64(i * chunkBytes)}}
		if err := c.send(t, h, buf); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
	var sum [32]byte
	content.Sum(sum[:0])
	md := map[string]string{peer.MetaTotalChunks: strconv.Itoa(n), peer.MetaContentLength: strconv.Itoa(n * chunkBytes),
		peer.MetaContentSHA256: hex.EncodeToString(sum[:])}
	if err := c.send(t, &wire.EntityHeader{EntityID: root, Metadata: md}, c.envelope(t, root, nil)); err != nil {
		t.Fatal(err)
	}
	return root, sum
}

// A large dehydrated document passes through the peer with a flat heap:
// child outputs are spooled to the data dir and streamed into the result,
// and unread payloads wait under QUIC flow control (profile 4.2, 4.3).
func TestLargeDocumentFlatHeap(t *testing.T) {
	size := 256 << 20
	if testing.Short() {
		size = 32 << 20
	}
	const chunk = 1 << 20
	const limit = 64 << 20
	modes(t, func(t *testing.T, format wire.Format) {
		dir := t.TempDir()
		srv := startPeer(t, peer.Options{DataDir: dir})
		c := dial(t, srv, format, nil)
		c.rec.hashOnly = true
		runtime.GC()
		stop := heapPeak()
		root, sum := c.sendGenerated(t, size/chunk, chunk)
		res := c.rec.waitResult(t, root)
		c.rec.waitStatus(t, root, wire.StatusComplete)
		peak := stop()
		t.Logf("%d MiB document, %d MiB chunks: peak HeapInuse %.1f MiB", size>>20, chunk>>20, float64(peak)/(1<<20))
		if res.sum != sum || res.n != int64(size) {
			t.Fatalf("result %d octets sha256 %x, want %d octets %x", res.n, res.sum, size, sum)
		}
		if res.parts != size/chunk { // the children accept parts: streamed (profile 4.3.1)
			t.Fatalf("result in %d parts, want %d streamed parts", res.parts, size/chunk)
		}
		if peak > limit {
			t.Fatalf("peak HeapInuse %d MiB exceeds %d MiB: the document is held in memory", peak>>20, limit>>20)
		}
		waitWorkEmpty(t, dir)
	})
}

// detachWatch is a slog.Handler that reports the roots the peer detaches
// from the GOAWAY drain (its debug line "root detached") and passes every
// record on to next.
type detachWatch struct {
	ids  chan uint64
	next slog.Handler
}

func (w *detachWatch) Enabled(context.Context, slog.Level) bool { return true }

func (w *detachWatch) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "root detached:") {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "entity" {
				select {
				case w.ids <- a.Value.Uint64():
				default:
				}
				return false
			}
			return true
		})
	}
	if w.next.Enabled(ctx, r.Level) {
		return w.next.Handle(ctx, r)
	}
	return nil
}

func (w *detachWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return &detachWatch{ids: w.ids, next: w.next.WithAttrs(as)}
}

func (w *detachWatch) WithGroup(name string) slog.Handler {
	return &detachWatch{ids: w.ids, next: w.next.WithGroup(name)}
}

// wait waits (10 s at most) until root is detached.
func (w *detachWatch) wait(t *testing.T, root uint32) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case id := <-w.ids:
			if id == uint64(root) {
				return
			}
		case <-deadline:
			t.Fatalf("root %d was never detached from the GOAWAY drain", root)
		}
	}
}

// waitWorkEmpty waits until <dir>/work holds no document spool.
func waitWorkEmpty(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var files []string
		filepath.WalkDir(filepath.Join(dir, "work"), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if len(files) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("spool files left behind: %v", files)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stale spools of an earlier run are removed on start.
func TestStaleWorkDirRemoved(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "work", "s1", "7-1", "0.out")
	if err := os.MkdirAll(filepath.Dir(stale), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	startPeer(t, peer.Options{DataDir: dir})
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale spool survived the start: %v", err)
	}
}

// The root's content summary is checked against the children's inputs in
// chunk order; a mismatch FAILS the document without a result, also when
// the processor's output is not the input (textstats).
func TestContentSummaryMismatchFails(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		for _, tc := range []struct {
			name string
			md   map[string]string
		}{
			{"sha256", map[string]string{peer.MetaContentSHA256: strings.Repeat("ab", 32)}},
			{"sha256 textstats", map[string]string{peer.MetaContentSHA256: strings.Repeat("cd", 32), peer.MetaProcessor: "textstats"}},
			{"length", map[string]string{peer.MetaContentLength: "5"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				srv := startPeer(t, peer.Options{DataDir: dir})
				c := dial(t, srv, format, nil)
				root, kids := c.sendDehydrated(t, []string{"one. ", "two. ", "three."}, tc.md, nil, true)
				for _, k := range kids {
					c.rec.waitStatus(t, k, wire.StatusComplete)
				}
				c.rec.waitStatus(t, root, wire.StatusFailed)
				c.rec.mu.Lock()
				_, sent := c.rec.results[root]
				c.rec.mu.Unlock()
				if sent {
					t.Fatal("result sent for a document whose content summary does not match")
				}
				if got := c.rec.history(0, root); !equal(got, statuses(wire.StatusRehydrating, wire.StatusFailed)) {
					t.Fatalf("root statuses %v", got)
				}
				waitWorkEmpty(t, dir)
			})
		}
	})
}

// Children arriving out of order (reverse) are hashed in chunk order: the
// correct summary (sent by sendDehydrated) passes with textstats too.
func TestContentSummaryOutOfOrder(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root, _ := c.sendDehydrated(t, []string{"a b. ", "c d. ", "e f."}, map[string]string{peer.MetaProcessor: "textstats"}, nil, false)
	c.rec.waitResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
}

func timeoutPolicy(ms uint32, action wire.FailureAction, retries uint32) *wire.CompletionPolicy {
	return &wire.CompletionPolicy{TimeoutMs: &ms, OnTimeout: &action, MaxRetries: &retries, RetryDelayMs: new(uint32)}
}

// on-timeout RETRY: the timed-out entity is retried (FAILED, RETRYING,
// PROCESSING) within max-retries.
func TestOnTimeoutRetry(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "slow once", fault(peer.FaultTimeoutOnce), timeoutPolicy(100, wire.ActionRetry, 2))
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		want := statuses(wire.StatusProcessing, wire.StatusFailed, wire.StatusRetrying, wire.StatusProcessing, wire.StatusComplete)
		if got := c.rec.history(0, id); !equal(got, want) || string(res.data) != "slow once" {
			t.Fatalf("statuses %v, want %v; result %q", got, want, res.data)
		}
		// retries exhausted: ABANDONED after the last attempt times out
		id = c.sendWhole(t, "x", fault(peer.FaultTimeout), timeoutPolicy(50, wire.ActionRetry, 1))
		c.rec.waitStatus(t, id, wire.StatusAbandoned)
		want = statuses(wire.StatusProcessing, wire.StatusFailed, wire.StatusRetrying, wire.StatusProcessing, wire.StatusAbandoned)
		if got := c.rec.history(0, id); !equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
	})
}

// on-timeout DEFER: a claim check instead of ABANDONED; redeeming it
// completes the entity.
func TestOnTimeoutDefer(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "later", fault(peer.FaultTimeout), timeoutPolicy(50, wire.ActionDefer, 0))
		cc := c.deferred(t, id)
		if err := c.redeem(t, id, cc.ClaimID, c.envelope(t, id, []byte("later"))); err != nil {
			t.Fatal(err)
		}
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		want := statuses(wire.StatusProcessing, wire.StatusDeferred, wire.StatusProcessing, wire.StatusComplete)
		if got := c.rec.history(0, id); !equal(got, want) || string(res.data) != "later" {
			t.Fatalf("statuses %v result %q", got, res.data)
		}
	})
}

// on-timeout SKIP: the chunk is ABANDONED and excluded; STRICT still
// completes with the others.
func TestOnTimeoutSkipStrict(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatProtobuf, nil)
	md := fault(peer.FaultTimeout)
	md[peer.MetaFaultChunks] = "1"
	root, kids := c.sendDehydrated(t, []string{"a\n", "b\n", "c\n"}, md, timeoutPolicy(50, wire.ActionSkip, 0), true)
	res := c.rec.waitResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if got := c.rec.history(0, kids[1]); !equal(got, statuses(wire.StatusProcessing, wire.StatusAbandoned)) || string(res.data) != "a\nc\n" {
		t.Fatalf("chunk statuses %v result %q", got, res.data)
	}
}

// A stalled entity (timeout fault) holds no worker: with one worker,
// another document completes while it waits.
func TestStallHoldsNoWorker(t *testing.T) {
	srv := startPeer(t, peer.Options{Workers: 1})
	c := dial(t, srv, wire.FormatCBOR, nil)
	slow := c.sendWhole(t, "x", fault(peer.FaultTimeout), timeoutPolicy(30_000, wire.ActionFail, 0))
	c.rec.waitStatus(t, slow, wire.StatusProcessing)
	fast := c.sendWhole(t, "quick", nil, nil)
	if res := c.rec.waitResult(t, fast); string(res.data) != "quick" {
		t.Fatalf("result %q", res.data)
	}
	c.rec.waitStatus(t, fast, wire.StatusComplete)
	if f, _ := c.rec.lastLocked(0, slow); f.Status != wire.StatusProcessing {
		t.Fatalf("stalled entity is %s, want still PROCESSING", f.Status)
	}
}

// A deferred chunk redeemed with a fresh ID on the same session goes back
// into its still-open document; the superseded ID is SKIPPED.
func TestDeferredChildRedeemedWithFreshID(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		md := fault("defer")
		md[peer.MetaFaultChunks] = "1"
		root, kids := c.sendDehydrated(t, []string{"a\n", "b\n", "c\n"}, md, nil, true)
		cc := c.deferred(t, kids[1])
		fresh := c.assign(t)
		p := root
		h := &wire.EntityHeader{EntityID: fresh, ParentID: &p, Metadata: map[string]string{peer.MetaClaimID: strconv.FormatUint(cc.ClaimID, 10)},
			ChunkInfo: &wire.ChunkInfo{TotalChunks: 3, ChunkIndex: 1, ChunkOffset: 2}}
		if err := c.send(t, h, []byte("b\n")); err != nil {
			t.Fatal(err)
		}
		res := c.rec.waitResult(t, root)
		c.rec.waitStatus(t, root, wire.StatusComplete)
		if string(res.data) != "a\nb\nc\n" || res.h.Metadata[peer.MetaChildrenComplete] != "3" {
			t.Fatalf("result %q %v", res.data, res.h.Metadata)
		}
		if got := c.rec.history(0, fresh); !equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
			t.Fatalf("redemption statuses %v", got)
		}
		if got := c.rec.history(0, kids[1]); !equal(got, statuses(wire.StatusProcessing, wire.StatusDeferred, wire.StatusSkipped)) {
			t.Fatalf("superseded entity statuses %v", got)
		}
	})
}

// Shutdown does not wait the drain timeout for unredeemed claims: a
// DEFERRED entity (and a document waiting only for one) is detached; the
// claim survives in claims.jsonl.
func TestShutdownDetachesDeferred(t *testing.T) {
	dir := t.TempDir()
	detached := &detachWatch{ids: make(chan uint64, 16), next: testLogger(t).Handler()}
	srv := startPeer(t, peer.Options{DataDir: dir, DrainTimeout: 30 * time.Second, Logger: slog.New(detached)})
	c := dial(t, srv, wire.FormatCBOR, nil)
	whole := c.sendWhole(t, "w", fault("defer"), nil)
	cc := c.deferred(t, whole)
	md := fault("defer")
	md[peer.MetaFaultChunks] = "0"
	root, kids := c.sendDehydrated(t, []string{"a\n", "b\n"}, md, nil, true)
	c.deferred(t, kids[0])
	c.rec.waitStatus(t, kids[1], wire.StatusComplete)
	detached.wait(t, root) // the root envelope is processed and the root leaves the drain
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Shutdown took %v: it waited for deferred entities", d)
	}
	c.rec.waitFor(t, "close", func() bool { return c.rec.closed })
	if c.rec.closeErr != nil {
		t.Fatalf("closed with %v", c.rec.closeErr)
	}
	if f, _ := c.rec.lastLocked(0, root); f.Status == wire.StatusFailed {
		t.Fatal("document failed instead of staying open for its claim")
	}
	b, err := os.ReadFile(filepath.Join(dir, "claims.jsonl"))
	if err != nil || !strings.Contains(string(b), strconv.FormatUint(cc.ClaimID, 10)) {
		t.Fatalf("claim %d not persisted: %v", cc.ClaimID, err)
	}
}
