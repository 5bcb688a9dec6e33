package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// producers is how many goroutines open entity streams in the churn
// phase (both paths): enough to keep one connection busy on two cores.
const producers = 4

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// churn measures whole (1:1) entities of Options.EntityBytes over one
// quicpeer connection to a processing peer started in this process
// (AssignID, SendEntity, wait for COMPLETE; the peer's result stream is
// read to EOF), against raw quic-go uni-stream open/write/close churn of
// the same payload size with the same number in flight.
//
// A second baseline, raw quic-go request/response churn (the payload
// there on one uni stream, back on another the server opens), is the
// transport floor of a whole document, whose result comes back on a
// stream of its own. Every row also reports this process's CPU time per
// entity (both ends run here; the bench is otherwise idle): under a
// shared machine the rate moves with the load, the CPU per entity less.
func (b *runner) churn(ctx context.Context) error {
	n, conc, d := b.o.EntityBytes, b.o.Concurrency, b.o.Duration
	rows := []struct {
		label, path string
		base        bool
		note        string
		run         func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error)
	}{
		{"raw", "raw quic-go stream open/write/close", true, "", func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error) {
			return rawChurn(ctx, size, conc, d, false)
		}},
		{"raw-echo", "raw quic-go request/response (a stream each way)", true, "the payload back on a stream the server opens: the floor of a whole document", func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error) {
			return rawChurn(ctx, size, conc, d, true)
		}},
		{"session", "quicpeer entity -> COMPLETE (session)", false, "entity stream with header and checksum, STATUS back; no processing", func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error) {
			return sessionChurn(ctx, size, conc, d, false)
		}},
		{"session-inline", "quicpeer entity -> COMPLETE with the payload inline (session)", false, "the same, the payload back in COMPLETE as an inline result (header, SHA-256) that the client verifies: a whole document's wire work without the peer", func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error) {
			return sessionChurn(ctx, size, conc, d, true)
		}},
		{"peer", "quicpeer whole document -> COMPLETE (peer)", false, "includes the peer's processing; the result inline in COMPLETE (docs/profile.md 4.3.2)", func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error) {
			return peerChurn(ctx, size, conc, d, true)
		}},
		{"peer-stream", "quicpeer whole document -> COMPLETE (peer, result stream)", false, "the same without the inline offer: the result on a stream of its own (two streams per document)", func(ctx context.Context, size, conc int, d time.Duration) (churnRun, error) {
			return peerChurn(ctx, size, conc, d, false)
		}},
	}
	for _, row := range rows {
		b.progress("  %s, %s, %d in flight, %s", row.path, sizeStr(n), conc, d)
		var (
			out churnRun
			err error
		)
		cpu0 := processCPU()
		// The label lets a --cpuprofile be read per row: -tagfocus 'row=^peer$'
		// (a regular expression: row=peer alone also matches peer-stream).
		pprof.Do(ctx, pprof.Labels("row", row.label), func(ctx context.Context) {
			out, err = row.run(ctx, int(n), conc, d)
		})
		cpu := processCPU() - cpu0
		if err != nil {
			return fmt.Errorf("%s: %w", row.path, err)
		}
		cnt := out.count
		r := Result{Phase: "churn", Path: row.path, Baseline: row.base, Unit: "entities/s", Rate: float64(cnt) / out.secs, Count: cnt, Seconds: out.secs, Note: row.note}
		if cnt > 0 && cpu > 0 {
			r.Note = strings.TrimPrefix(r.Note+fmt.Sprintf("; %.1f µs of CPU per entity (this process, both ends)", float64(cpu.Microseconds())/float64(cnt)), "; ")
		}
		if cnt > 0 && out.sent+out.received > 0 {
			r.Note += fmt.Sprintf("; %.2f QUIC packets per entity (%.2f client to server, %.2f back)",
				float64(out.sent+out.received)/float64(cnt), float64(out.sent)/float64(cnt), float64(out.received)/float64(cnt))
		}
		b.add(r)
	}
	b.ratios("churn")
	return nil
}

// churnRun is what one churn row measured: finished entities, seconds,
// and the client connection's QUIC packets sent and received (what the
// transport's per-packet work scales with: syscalls, AEAD, ACKs).
type churnRun struct {
	count          int64
	secs           float64
	sent, received uint64
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// inflight runs producers goroutines that call send while fewer than conc
// operations are unfinished, until d has passed; done() must be called
// once per finished operation. It returns the finished count and seconds.
type inflight struct {
	sem      chan struct{}
	finished atomic.Int64
}

// newInflight makes the tracker with its semaphore before any goroutine
// can call done (network causality is invisible to the race detector).
func newInflight(conc int) *inflight { return &inflight{sem: make(chan struct{}, conc)} }

func (f *inflight) done() {
	f.finished.Add(1)
	<-f.sem
}

func runInflight(ctx context.Context, conc int, d time.Duration, f *inflight, send func(ctx context.Context) error) (int64, float64, error) {
	if cap(f.sem) != conc {
		return 0, 0, fmt.Errorf("bench: inflight made for %d, run with %d", cap(f.sem), conc)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		started atomic.Int64
		errOnce sync.Once
		first   error
	)
	start := time.Now()
	deadline := start.Add(d)
	for range producers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				select {
				case f.sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				started.Add(1)
				if err := send(ctx); err != nil {
					errOnce.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, 0, first
	}
	// Wait for the ones in flight.
	stuck := time.Now().Add(waitTimeout)
	for f.finished.Load() < started.Load() {
		if time.Now().After(stuck) {
			return 0, 0, fmt.Errorf("%d of %d operations did not finish within %s", started.Load()-f.finished.Load(), started.Load(), waitTimeout)
		}
		time.Sleep(time.Millisecond)
	}
	return f.finished.Load(), since(start), nil
}

func rawChurn(ctx context.Context, size, conc int, d time.Duration, echo bool) (churnRun, error) {
	rq, err := newRawQUICMode(ctx, echo)
	if err != nil {
		return churnRun{}, err
	}
	defer rq.close()
	f := newInflight(conc)
	stop := make(chan struct{})
	defer close(stop)
	var bad atomic.Int64
	go func() {
		for {
			select {
			case n := <-rq.got:
				if n != int64(size) {
					bad.Add(1)
				}
				f.done()
			case <-stop:
				return
			}
		}
	}()
	payload := patternBlock[:size]
	cnt, secs, err := runInflight(ctx, conc, d, f, func(ctx context.Context) error {
		st, err := rq.cc.OpenUniStreamSync(ctx)
		if err != nil {
			return err
		}
		if _, err := st.Write(payload); err != nil {
			return err
		}
		return st.Close()
	})
	if err == nil && bad.Load() > 0 {
		err = fmt.Errorf("%d streams arrived short", bad.Load())
	}
	st := rq.cc.ConnectionStats()
	return churnRun{count: cnt, secs: secs, sent: st.PacketsSent, received: st.PacketsReceived}, err
}

// churnServer is the session-level churn's receiver: it reads each
// entity's payload through the session's checksum-verifying reader and
// answers PROCESSING then COMPLETE (FAILED when the payload does not
// verify). No processor, no result stream. With inline set, COMPLETE
// carries the payload back as an inline result (docs/profile.md 4.3.2:
// result header with SHA-256, then the payload), as the peer's does.
type churnServer struct {
	churnClient
	inline bool
}

func (c *churnServer) HandleEntity(s *quicpeer.Session, e *quicpeer.IncomingEntity) {
	st := wire.StatusComplete
	var ext []byte
	if c.inline {
		payload := make([]byte, min(e.Header.PayloadLength, inlineOffer))
		_, err := io.ReadFull(e.Payload, payload)
		if err == nil {
			_, err = io.Copy(io.Discard, e.Payload) // EOF: length and checksum verified
		}
		if err == nil {
			sum := sha256.Sum256(payload)
			h := &wire.EntityHeader{EntityID: e.Header.EntityID, ContentType: "application/octet-stream", PayloadLength: uint64(len(payload)),
				Checksum: sum[:], Metadata: resultMeta}
			ext, err = wire.AppendInlineResultExt(nil, wire.CodecFor(s.Negotiated().Format), h, payload)
		}
		if err != nil {
			st, ext = wire.StatusFailed, nil
		}
	} else if _, err := io.Copy(io.Discard, e.Payload); err != nil {
		st = wire.StatusFailed
	}
	_ = s.SendStatus(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: e.Header.EntityID})
	_ = s.SendStatus(wire.StatusFrame{Status: st, EntityID: e.Header.EntityID, HasExt: ext != nil, Ext: ext})
}

// resultMeta is the inline result's metadata in the session-level rows,
// as the peer's results carry it.
var resultMeta = map[string]string{peer.MetaRole: "result"}

// sessionChurn measures PipeStream entities at the session level: the
// client sends whole entities of size octets (AssignID, header with
// checksum, payload, FIN) over one quicpeer connection, the server
// verifies each and answers COMPLETE; the clock stops when every COMPLETE
// is in. This is the protocol's own cost per entity, the same work as the
// raw baseline's stream plus header, checksum and STATUS frames. With
// inline, the payload comes back in COMPLETE (churnServer) and the client
// verifies it: what a whole document with an inline result costs on the
// wire, without the peer's processing (its envelope, bookkeeping).
func sessionChurn(ctx context.Context, size, conc int, d time.Duration, inline bool) (churnRun, error) {
	cert, pemCert, err := quicpeer.SelfSignedCert()
	if err != nil {
		return churnRun{}, err
	}
	offer := peer.DefaultOffer(false)
	ln, err := quicpeer.Listen("127.0.0.1:0", quicpeer.Config{TLS: quicpeer.ServerTLS(cert), Offer: offer, Handler: &churnServer{inline: inline}, Logger: quiet})
	if err != nil {
		return churnRun{}, err
	}
	defer ln.Close()
	accepted := make(chan *quicpeer.Session, 1)
	go func() {
		if s, err := ln.Accept(ctx); err == nil {
			accepted <- s
		}
	}()
	tc, err := quicpeer.ClientTLS(pemCert)
	if err != nil {
		return churnRun{}, err
	}
	h := &churnClient{f: newInflight(conc)}
	cfg := quicpeer.Config{TLS: tc, Offer: offer, Handler: h, Logger: quiet}
	if inline {
		cfg.Limits.InlineResultBytes = inlineOffer
	}
	s, err := quicpeer.Dial(ctx, ln.Addr().String(), cfg)
	if err != nil {
		return churnRun{}, err
	}
	defer func() {
		_ = s.CloseWithError(wire.CodeNoError, "bench done")
		<-s.Done()
		select {
		case srv := <-accepted:
			<-srv.Done()
		case <-time.After(stopTimeout):
		}
	}()
	if inline {
		h.codec = wire.CodecFor(s.Negotiated().Format)
	}
	payload := patternBlock[:size]
	sum := sha256.Sum256(payload)
	cnt, secs, err := runInflight(ctx, conc, d, h.f, func(ctx context.Context) error {
		id, err := s.AssignID(ctx)
		if err != nil {
			return err
		}
		return s.SendEntity(ctx, &wire.EntityHeader{EntityID: id, ContentType: "application/octet-stream", PayloadLength: uint64(size), Checksum: sum[:]}, bytes.NewReader(payload))
	})
	switch {
	case err != nil:
	case h.failed.Load() > 0:
		err = fmt.Errorf("%d entities did not complete (or their inline result did not verify)", h.failed.Load())
	case inline && h.inlined.Load() != cnt:
		err = fmt.Errorf("%d of %d results came inline; want all", h.inlined.Load(), cnt)
	}
	sent, received := s.PacketCounts()
	return churnRun{count: cnt, secs: secs, sent: sent, received: received}, err
}

// churnClient counts COMPLETE root statuses, verifies inline results
// (codec set) and drains result streams.
type churnClient struct {
	f       *inflight
	failed  atomic.Int64
	codec   wire.Codec // nil: no inline results offered
	inlined atomic.Int64
}

func (h *churnClient) HandleStatus(_ *quicpeer.Session, f wire.StatusFrame) {
	if f.EntityID == wire.ConnectionEntity || f.ScopeID != 0 {
		return
	}
	switch f.Status {
	case wire.StatusComplete:
		if h.codec != nil && f.HasExt {
			// What the gateway does with an inline result: decode the
			// header, check length and SHA-256 (the payload is not kept).
			if _, _, err := f.InlineResult(h.codec, inlineOffer); err != nil {
				h.failed.Add(1)
			} else {
				h.inlined.Add(1)
			}
		}
		h.f.done()
	case wire.StatusFailed, wire.StatusAbandoned, wire.StatusSkipped:
		h.failed.Add(1)
		h.f.done()
	}
}
func (h *churnClient) HandleScopeDigest(*quicpeer.Session, wire.ScopeDigestFrame) {}
func (h *churnClient) HandleBarrier(*quicpeer.Session, wire.BarrierFrame)         {}
func (h *churnClient) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame)  {}
func (h *churnClient) HandleGoAway(*quicpeer.Session, wire.GoAwayFrame)           {}
func (h *churnClient) HandleClose(*quicpeer.Session, error)                       {}
func (h *churnClient) HandleEntity(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
	_, _ = io.Copy(io.Discard, e.Payload)
}

// profileMeta marks the churn documents as profile entities (an envelope
// with a blob, docs/profile.md 4): read-only, shared by every header.
// inlineMeta also offers the result inline in COMPLETE (4.3.2), as the
// gateway does on a whole document's root.
var (
	profileMeta = map[string]string{peer.MetaProfile: peer.ProfileVersion}
	inlineMeta  = map[string]string{peer.MetaProfile: peer.ProfileVersion, peer.MetaAcceptInlineResult: strconv.Itoa(inlineOffer)}
)

// inlineOffer is the gateway's offer (bridge.inlineResultOffer).
const inlineOffer = 16 << 10

// peerChurn runs whole documents through a processing peer started in
// this process, over a profile connection (ALPN, docs/profile.md 1.1) as
// the gateway dials it. With inline, every root offers the result inline
// in COMPLETE and the run fails unless every result came that way.
func peerChurn(ctx context.Context, size, conc int, d time.Duration, inline bool) (churnRun, error) {
	dir, err := os.MkdirTemp("", "gateway-bench-peer-")
	if err != nil {
		return churnRun{}, err
	}
	defer os.RemoveAll(dir)
	srv, err := peer.Start(peer.Options{DataDir: dir, Logger: quiet})
	if err != nil {
		return churnRun{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	tc, err := quicpeer.ClientTLS(srv.CertPEM())
	if err != nil {
		return churnRun{}, err
	}
	h := &churnClient{f: newInflight(conc)}
	md := profileMeta
	if inline {
		h.codec, md = wire.CodecFor(wire.FormatCBOR), inlineMeta // DefaultOffer(false) negotiates CBOR
	}
	s, err := quicpeer.Dial(ctx, srv.Addr().String(), quicpeer.Config{TLS: tc, Offer: peer.DefaultOffer(false), Handler: h, Logger: quiet,
		Profile: true, Limits: quicpeer.Limits{InlineResultBytes: inlineOffer}})
	if err != nil {
		return churnRun{}, err
	}
	defer func() {
		_ = s.CloseWithError(wire.CodeNoError, "bench done")
		<-s.Done()
	}()
	if n := s.Negotiated(); !n.Profile || n.Format != wire.FormatCBOR {
		return churnRun{}, fmt.Errorf("the peer session negotiated profile %t, format %s; want the profile over CBOR", n.Profile, n.Format)
	}
	codec := wire.CodecFor(s.Negotiated().Format)
	blob := patternBlock[:size]
	cnt, secs, err := runInflight(ctx, conc, d, h.f, func(ctx context.Context) error {
		id, err := s.AssignID(ctx)
		if err != nil {
			return err
		}
		env, err := codec.MarshalPipeDoc(&wire.PipeDoc{DocID: "bench-" + strconv.FormatUint(uint64(id), 10), EntityID: id, Blob: blob})
		if err != nil {
			return err
		}
		sum := sha256.Sum256(env)
		return s.SendEntity(ctx, &wire.EntityHeader{EntityID: id, ContentType: "application/octet-stream", PayloadLength: uint64(len(env)), Checksum: sum[:],
			Metadata: md}, bytes.NewReader(env))
	})
	switch {
	case err != nil:
	case h.failed.Load() > 0:
		err = fmt.Errorf("%d entities did not complete (or their inline result did not verify)", h.failed.Load())
	case inline && h.inlined.Load() != cnt:
		err = fmt.Errorf("%d of %d results came inline; want all (the peer did not take the offer)", h.inlined.Load(), cnt)
	case !inline && h.inlined.Load() != 0:
		err = fmt.Errorf("%d results came inline without an offer", h.inlined.Load())
	}
	sent, received := s.PacketCounts()
	return churnRun{count: cnt, secs: secs, sent: sent, received: received}, err
}
