package quicpeer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"testing"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// sinkHandler reads every entity to EOF and signals; control frames are
// dropped (a recorder would fill its channels in a benchmark).
type sinkHandler struct{ got chan error }

func newSink() *sinkHandler { return &sinkHandler{got: make(chan error, 1<<16)} }

func (h *sinkHandler) HandleStatus(*quicpeer.Session, wire.StatusFrame)           {}
func (h *sinkHandler) HandleScopeDigest(*quicpeer.Session, wire.ScopeDigestFrame) {}
func (h *sinkHandler) HandleBarrier(*quicpeer.Session, wire.BarrierFrame)         {}
func (h *sinkHandler) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame)  {}
func (h *sinkHandler) HandleGoAway(*quicpeer.Session, wire.GoAwayFrame)           {}
func (h *sinkHandler) HandleClose(*quicpeer.Session, error)                       {}
func (h *sinkHandler) HandleEntity(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
	_, err := io.Copy(io.Discard, e.Payload)
	h.got <- err
}

// rawQUICPair is a plain quic-go connection with the same TLS and ALPN; its
// server drains every uni stream and signals.
func rawQUICPair(b *testing.B) (*quic.Conn, chan error) {
	ln, err := quic.ListenAddr("127.0.0.1:0", serverTLS(b), &quic.Config{MaxIncomingUniStreams: 1024})
	if err != nil {
		b.Fatal(err)
	}
	got := make(chan error, 1<<16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc, err := ln.Accept(context.Background())
		if err != nil {
			return
		}
		for {
			st, err := sc.AcceptUniStream(context.Background())
			if err != nil {
				return
			}
			go func() {
				_, err := io.Copy(io.Discard, st)
				got <- err
			}()
		}
	}()
	cc, err := quic.DialAddr(context.Background(), ln.Addr().String(), clientTLS(b), &quic.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.CloseWithError(0, ""); ln.Close(); <-done })
	return cc, got
}

// drain receives the receivers' results while the benchmark runs (a
// handler blocked on a full channel would hold its worker goroutine and
// make the session start one per stream); wait(n) returns the first error
// once n results arrived.
func drain(got <-chan error) (wait func(n int) error) {
	target := make(chan int, 1)
	res := make(chan error, 1)
	go func() {
		var first error
		cnt, want := 0, -1
		for want < 0 || cnt < want {
			select {
			case err := <-got:
				cnt++
				if first == nil {
					first = err
				}
			case want = <-target:
			}
		}
		res <- first
	}()
	return func(n int) error { target <- n; return <-res }
}

// BenchmarkEntityThroughput sends 4 MiB entities over one connection: the
// PipeStream session (header, SHA-256 verified at the receiver) against a
// raw quic-go uni stream copy of the same bytes, in the same run.
func BenchmarkEntityThroughput(b *testing.B) {
	const size = 4 << 20
	payload := make([]byte, size)
	newGen(size, 9).Read(payload)
	sum := sha256.Sum256(payload)
	b.Run("pipestream", func(b *testing.B) {
		sink := newSink()
		client, _, _ := newPairWith(b, cborMode, newSink(), sink)
		ctx := context.Background()
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			id, err := client.AssignID(ctx)
			if err != nil {
				b.Fatal(err)
			}
			h := &wire.EntityHeader{EntityID: id, PayloadLength: size, Checksum: sum[:]}
			if err := client.SendEntity(ctx, h, bytes.NewReader(payload)); err != nil {
				b.Fatal(err)
			}
			if err := <-sink.got; err != nil {
				b.Fatal(err)
			}
			// Resolve the ID so the window and state stay flat.
			client.SendStatus(wire.StatusFrame{Status: wire.StatusFailed, EntityID: id})
		}
	})
	b.Run("raw-quic", func(b *testing.B) {
		cc, got := rawQUICPair(b)
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			st, err := cc.OpenUniStreamSync(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(st, bytes.NewReader(payload)); err != nil {
				b.Fatal(err)
			}
			st.Close()
			if err := <-got; err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEntityStreamChurn opens, writes (64 octets) and closes one stream
// per entity, pipelined; the receiver drains them. PipeStream against raw
// quic-go stream open/write/close churn.
func BenchmarkEntityStreamChurn(b *testing.B) {
	const size = 64
	payload := make([]byte, size)
	sum := sha256.Sum256(payload)
	b.Run("pipestream", func(b *testing.B) {
		sink := newSink()
		client, _, _ := newPairWith(b, cborMode, newSink(), sink)
		ctx := context.Background()
		wait := drain(sink.got)
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			id, err := client.AssignID(ctx)
			if err != nil {
				b.Fatal(err)
			}
			h := &wire.EntityHeader{EntityID: id, PayloadLength: size, Checksum: sum[:]}
			if err := client.SendEntity(ctx, h, bytes.NewReader(payload)); err != nil {
				b.Fatal(err)
			}
			client.SendStatus(wire.StatusFrame{Status: wire.StatusFailed, EntityID: id})
			n++
		}
		if err := wait(n); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("raw-quic", func(b *testing.B) {
		cc, got := rawQUICPair(b)
		wait := drain(got)
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			st, err := cc.OpenUniStreamSync(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			st.Write(payload)
			st.Close()
			n++
		}
		if err := wait(n); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkSendStatus measures the STATUS hot path (state check, append
// into the reused buffer, stream-0 write): it must not allocate.
func BenchmarkSendStatus(b *testing.B) {
	client, _, _ := newPairWith(b, cborMode, newSink(), newSink())
	id, err := client.AssignID(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	client.SendStatus(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: id})
	// PROCESSING -> CHECKPOINT -> PROCESSING is a valid cycle (Section 6.2.3).
	cycle := [2]wire.StatusFrame{{Status: wire.StatusCheckpoint, EntityID: id}, {Status: wire.StatusProcessing, EntityID: id}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := client.SendStatus(cycle[i&1]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSendStatusConcurrent is BenchmarkSendStatus with 4 x GOMAXPROCS
// goroutines on one session, each cycling its own entity: the callers
// contend for stream 0 (the case a coalescing writer would serve).
func BenchmarkSendStatusConcurrent(b *testing.B) {
	client, _, _ := newPairWith(b, cborMode, newSink(), newSink())
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		id, err := client.AssignID(context.Background())
		if err != nil {
			b.Error(err)
			return
		}
		client.SendStatus(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: id})
		cycle := [2]wire.StatusFrame{{Status: wire.StatusCheckpoint, EntityID: id}, {Status: wire.StatusProcessing, EntityID: id}}
		i := 0
		for pb.Next() {
			if err := client.SendStatus(cycle[i&1]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
