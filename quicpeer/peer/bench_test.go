package peer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// benchSink is a minimal gateway-side Handler for benchmarks: it drains
// result streams (the session verifies their SHA-256 at EOF) and signals
// an entity once both its result and its COMPLETE (or FAILED) arrived.
type benchSink struct {
	mu    sync.Mutex
	want  map[uint32]*benchWait
	codec wire.Codec // set: inline results are offered (profile 4.3.2)
}

type benchWait struct {
	result, terminal bool
	failed           bool
	n                int64
	err              error
	first, last      time.Time // result header arrived, result read to EOF
	done             chan struct{}
}

func (s *benchSink) expect(id uint32) *benchWait {
	w := &benchWait{done: make(chan struct{})}
	s.mu.Lock()
	s.want[id] = w
	s.mu.Unlock()
	return w
}

// settle updates w under s.mu and closes done once both parts are in.
func (s *benchSink) settle(id uint32, f func(w *benchWait)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.want[id]
	if w == nil {
		return
	}
	f(w)
	if w.terminal && (w.result || w.failed) {
		delete(s.want, id)
		close(w.done)
	}
}

func (s *benchSink) HandleStatus(_ *quicpeer.Session, f wire.StatusFrame) {
	if f.ScopeID != 0 || (f.Status != wire.StatusComplete && f.Status != wire.StatusFailed) {
		return
	}
	if s.codec != nil && f.HasExt && f.Status == wire.StatusComplete {
		_, p, err := f.InlineResult(s.codec, benchInlineOffer)
		s.settle(f.EntityID, func(w *benchWait) { w.result, w.n, w.err = true, int64(len(p)), err })
	}
	s.settle(f.EntityID, func(w *benchWait) { w.terminal, w.failed = true, f.Status == wire.StatusFailed })
}

// benchInlineOffer is the gateway's inline-result offer.
const benchInlineOffer = 16 << 10

func (s *benchSink) HandleScopeDigest(*quicpeer.Session, wire.ScopeDigestFrame) {}
func (s *benchSink) HandleBarrier(*quicpeer.Session, wire.BarrierFrame)         {}
func (s *benchSink) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame)  {}
func (s *benchSink) HandleGoAway(*quicpeer.Session, wire.GoAwayFrame)           {}
func (s *benchSink) HandleClose(*quicpeer.Session, error)                       {}
func (s *benchSink) HandleEntity(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
	first := time.Now()
	n, err := io.Copy(io.Discard, e.Payload)
	last := time.Now()
	s.settle(e.Header.EntityID, func(w *benchWait) { w.result, w.n, w.err, w.first, w.last = true, n, err, first, last })
}

// benchLogger is what `gateway bench` gives its in-process peer: a text
// handler at Info into io.Discard, so Info records are still formatted.
var benchLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// benchSession starts a peer (spool in a temp dir) and dials it over
// loopback QUIC with TLS 1.3, Protobuf preferred (the gateway's
// --prefer-protobuf).
func benchSession(b *testing.B) (*quicpeer.Session, *benchSink) {
	return benchSessionWith(b, true)
}

// benchSessionWith is benchSession with Protobuf preferred or not (CBOR:
// the gateway's default).
func benchSessionWith(b *testing.B, preferProtobuf bool) (*quicpeer.Session, *benchSink) {
	return benchSessionInline(b, preferProtobuf, false)
}

// benchSessionInline is benchSessionWith over a profile connection (ALPN)
// whose client takes inline results when inline is set.
func benchSessionInline(b *testing.B, preferProtobuf, inline bool) (*quicpeer.Session, *benchSink) {
	b.Helper()
	o := peer.DefaultOffer(preferProtobuf)
	srv, err := peer.Start(peer.Options{DataDir: b.TempDir(), Logger: benchLogger, Offer: &o, DrainTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	tlsConf, err := quicpeer.ClientTLS(srv.CertPEM())
	if err != nil {
		b.Fatal(err)
	}
	sink := &benchSink{want: map[uint32]*benchWait{}}
	cfg := quicpeer.Config{TLS: tlsConf, Offer: o, Handler: sink, Logger: benchLogger}
	if inline {
		format := wire.FormatCBOR
		if preferProtobuf {
			format = wire.FormatProtobuf // both ends prefer it
		}
		sink.codec = wire.CodecFor(format)
		cfg.Profile, cfg.Limits.InlineResultBytes = true, benchInlineOffer
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := quicpeer.Dial(ctx, srv.Addr().String(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		sess.CloseWithError(wire.CodeNoError, "bench done")
		<-sess.Done()
	})
	return sess, sink
}

// cpuTime is the process's user+system CPU time: under a shared, noisy
// machine it measures the work per op better than wall time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per op since start (both ends:
// the peer and the client session share the process).
func reportCPU(b *testing.B, start time.Duration, unit string, scale time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(scale)/float64(b.N), unit)
}

func benchEnvelope(b *testing.B, format wire.Format, id uint32, blob []byte) []byte {
	env, err := wire.CodecFor(format).MarshalPipeDoc(&wire.PipeDoc{DocID: "doc-" + strconv.FormatUint(uint64(id), 10), EntityID: id,
		Ownership: &wire.OwnershipContext{OwnerID: "tenant"}, Blob: blob})
	if err != nil {
		b.Fatal(err)
	}
	return env
}

// BenchmarkDehydratedPassthrough sends one 64 MiB document as 1 MiB
// children in chunk order, then its root, through passthrough (profile
// 4.2, 4.3) and waits for the rehydrated result and COMPLETE: the peer's
// per-byte cost (input verify and content summary, spool, rehydration)
// plus the session's on both sides.
func BenchmarkDehydratedPassthrough(b *testing.B) {
	const chunk, n = 1 << 20, 64
	chunks := make([][]byte, n)
	sums := make([][]byte, n)
	content := sha256.New()
	for i := range chunks {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		buf := make([]byte, chunk)
		for j := 0; j < len(buf); j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		s := sha256.Sum256(buf)
		chunks[i], sums[i] = buf, s[:]
		content.Write(buf)
	}
	md := map[string]string{peer.MetaTotalChunks: strconv.Itoa(n), peer.MetaContentLength: strconv.Itoa(n * chunk),
		peer.MetaContentSHA256: hex.EncodeToString(content.Sum(nil))}
	sess, sink := benchSession(b)
	format := sess.Negotiated().Format
	ctx := context.Background()
	b.SetBytes(n * chunk)
	b.ReportAllocs()
	var toResult, streaming time.Duration
	cpu := cpuTime(b)
	for b.Loop() {
		root, err := sess.AssignID(ctx)
		if err != nil {
			b.Fatal(err)
		}
		w := sink.expect(root)
		if err := sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root}); err != nil {
			b.Fatal(err)
		}
		for i := range chunks {
			id, err := sess.AssignID(ctx)
			if err != nil {
				b.Fatal(err)
			}
			p := root
			h := &wire.EntityHeader{EntityID: id, ParentID: &p, ContentType: "application/octet-stream", PayloadLength: chunk, Checksum: sums[i],
				Metadata:  map[string]string{peer.MetaProfile: peer.ProfileVersion, peer.MetaAcceptResultParts: "1"},
				ChunkInfo: &wire.ChunkInfo{TotalChunks: n, ChunkIndex: uint64(i), ChunkOffset: uint64(i * chunk)}}
			if err := sess.SendEntity(ctx, h, bytes.NewReader(chunks[i])); err != nil {
				b.Fatal(err)
			}
		}
		env := benchEnvelope(b, format, root, nil)
		es := sha256.Sum256(env)
		h := &wire.EntityHeader{EntityID: root, Metadata: profileMD(md), PayloadLength: uint64(len(env)), Checksum: es[:]}
		if err := sess.SendEntity(ctx, h, bytes.NewReader(env)); err != nil {
			b.Fatal(err)
		}
		sent := time.Now()
		<-w.done
		toResult += w.first.Sub(sent)
		streaming += w.last.Sub(w.first)
		if w.failed || w.err != nil || w.n != n*chunk {
			b.Fatalf("document %d: failed %v, result %d octets, err %v", root, w.failed, w.n, w.err)
		}
	}
	// Where a document's time goes after its root was sent: until the
	// result header (rehydration start, hashing) and the result stream.
	b.ReportMetric(float64(toResult.Milliseconds())/float64(b.N), "ms-to-result/op")
	b.ReportMetric(float64(streaming.Milliseconds())/float64(b.N), "ms-result/op")
	reportCPU(b, cpu, "cpu-ms/op", time.Millisecond)
}

// BenchmarkWholeSmall sends 1 KiB documents whole (profile 4.1) through
// passthrough, up to 64 in flight, and reports the cost per entity: the
// peer's wholeRoot path (envelope decode, processor, result stream) plus
// both sessions' per-stream costs; in both serialization formats (CBOR is
// the gateway's default, `gateway bench`'s churn row).
func BenchmarkWholeSmall(b *testing.B) {
	b.Run("cbor", func(b *testing.B) { benchWholeSmall(b, false, false) })
	b.Run("protobuf", func(b *testing.B) { benchWholeSmall(b, true, false) })
	// The result inline in COMPLETE (profile 4.3.2): no result stream.
	b.Run("cbor-inline", func(b *testing.B) { benchWholeSmall(b, false, true) })
	b.Run("protobuf-inline", func(b *testing.B) { benchWholeSmall(b, true, true) })
}

func benchWholeSmall(b *testing.B, preferProtobuf, inline bool) {
	const size, inflight = 1 << 10, 64
	blob := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range blob {
		blob[i] = byte('a' + rng.IntN(26))
	}
	sess, sink := benchSessionInline(b, preferProtobuf, inline)
	format := sess.Negotiated().Format
	ctx := context.Background()
	md := map[string]string{peer.MetaProcessor: "passthrough"}
	if inline {
		if sink.codec != wire.CodecFor(format) || !sess.Negotiated().Profile {
			b.Fatalf("negotiated %s, profile %t: the sink cannot decode inline results", format, sess.Negotiated().Profile)
		}
		md[peer.MetaAcceptInlineResult] = strconv.Itoa(benchInlineOffer)
	}
	window := make(chan *benchWait, inflight)
	check := func(w *benchWait) {
		<-w.done
		if w.failed || w.err != nil || w.n != int64(len(blob)) {
			b.Fatalf("failed %v, result %d octets, err %v", w.failed, w.n, w.err)
		}
	}
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		if len(window) == inflight {
			check(<-window)
		}
		id, err := sess.AssignID(ctx)
		if err != nil {
			b.Fatal(err)
		}
		w := sink.expect(id)
		env := benchEnvelope(b, format, id, blob)
		sum := sha256.Sum256(env)
		h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain", Metadata: profileMD(md), PayloadLength: uint64(len(env)), Checksum: sum[:]}
		if err := sess.SendEntity(ctx, h, bytes.NewReader(env)); err != nil {
			b.Fatal(err)
		}
		window <- w
	}
	for len(window) > 0 {
		check(<-window)
	}
	reportCPU(b, cpu, "cpu-µs/op", time.Microsecond)
}
