package quicpeer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Section 5.2, 6.8: one entity per unidirectional stream in both
// directions, streamed (32 MiB, never buffered whole), SHA-256 verified.
func TestEntityRoundTripBothDirections(t *testing.T) {
	size := int64(32 << 20)
	if testing.Short() {
		size = 1 << 20
	}
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m)
		ctx := context.Background()
		id, err := p.client.AssignID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := header(id, size, 1)
		h.Metadata = map[string]string{"pipestream.processor": "passthrough"}
		if err := p.client.SendEntity(ctx, h, newGen(size, 1)); err != nil {
			t.Fatalf("client SendEntity: %v", err)
		}
		got := recv(t, p.sr.entities, "entity at the server")
		if got.err != nil || got.n != size || got.sum != genSum(size, 1) {
			t.Fatalf("server got n=%d err=%v (sum ok=%v)", got.n, got.err, got.sum == genSum(size, 1))
		}
		if got.h.EntityID != id || got.h.Metadata["pipestream.processor"] != "passthrough" {
			t.Fatalf("server header %+v", got.h)
		}
		// The result goes back on a server-initiated stream (docs/profile.md 4.3).
		rh := header(id, size, 2)
		rh.Metadata = map[string]string{"pipestream.role": "result"}
		if err := p.server.SendEntity(ctx, rh, newGen(size, 2)); err != nil {
			t.Fatalf("server SendEntity: %v", err)
		}
		got = recv(t, p.cr.entities, "result at the client")
		if got.err != nil || got.n != size || got.sum != genSum(size, 2) || got.h.Metadata["pipestream.role"] != "result" {
			t.Fatalf("client got n=%d err=%v header=%+v", got.n, got.err, got.h)
		}
	})
}

// Section 10.2 + docs/profile.md 7: a checksum mismatch aborts that stream
// with 0x04, the receiver reports FAILED on stream 0, the connection lives.
func TestChecksumMismatchFailsEntityOnly(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m)
		ctx := context.Background()
		id, _ := p.client.AssignID(ctx)
		h := header(id, 100_000, 3)
		h.Checksum[0] ^= 0xFF
		err := p.client.SendEntity(ctx, h, newGen(100_000, 3))
		if err != nil && codeOf(err) != wire.CodeIntegrityError {
			t.Fatalf("SendEntity: %v (want nil or STOP_SENDING 0x04)", err)
		}
		got := recv(t, p.sr.entities, "entity at the server")
		if !isCode(got.err, wire.CodeIntegrityError) {
			t.Fatalf("server Payload.Read error %v, want *wire.Error 0x04", got.err)
		}
		if f := nextStatus(t, p.cr); f.EntityID != id || f.Status != wire.StatusFailed {
			t.Fatalf("client saw %+v, want FAILED for %d", f, id)
		}
		// The connection lives on.
		id2, err := p.client.AssignID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.client.SendEntity(ctx, header(id2, 10, 4), newGen(10, 4)); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, p.sr.entities, "second entity"); got.err != nil {
			t.Fatal(got.err)
		}
	})
}

// A payload shorter than payload-length is refused by the sender, which
// resets the stream with 0x05 and reports FAILED itself (the receiver may
// never see the header).
func TestEntityLengthAndHeaderErrors(t *testing.T) {
	p := newPair(t, cborMode, window(1))
	ctx := context.Background()
	id, _ := p.client.AssignID(ctx)
	err := p.client.SendEntity(ctx, header(id, 100, 5), newGen(99, 5))
	if codeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("short payload: %v, want 0x05", err)
	}
	waitFailed(t, p, id)
	if err := p.client.SendEntity(ctx, header(77, 1, 1), newGen(1, 1)); codeOf(err) != wire.CodeEntityInvalid {
		// 77 was never assigned
		t.Fatalf("unassigned root ID: %v, want 0x05", err)
	}
}

// waitFailed checks that entity id ended FAILED on both sides: the side
// that aborted the stream reports FAILED (if both do, each ignores the
// other's under the race rule). The pair has window 1, so the client can
// assign again only once id is resolved; the server acknowledges a
// checkpoint after id only once it sees id terminal.
func waitFailed(t *testing.T, p *pair, id uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	next, err := p.client.AssignID(ctx)
	if err != nil {
		t.Fatalf("entity %d never resolved at the client: %v", id, err)
	}
	if err := p.client.Checkpoint(ctx, &wire.CheckpointFrame{CheckpointID: "failed", CheckpointEntityID: next}); err != nil {
		t.Fatalf("entity %d not terminal at the server: %v", id, err)
	}
}

func TestMalformedEntityHeaderAborted(t *testing.T) {
	sr := newRecorder()
	ln, err := quicpeer.Listen("127.0.0.1:0", baseConfig(t, cborMode, sr, true))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), defaultCaps())
	st, err := raw.conn.OpenUniStream()
	if err != nil {
		t.Fatal(err)
	}
	// vector entity/invalid-entity-reserved-id.bin: entity-id 0.
	st.Write(hexBytes(t, "00000076a5656c617965720068636865636b73756d5820bb5a83c47c5bdba84780944786379d0a989f6bc0b4fa17501350131fe723df9a69656e746974792d6964006c636f6e74656e742d747970657819746578742f706c61696e3b20636861727365743d7574662d386e7061796c6f61642d6c656e677468135069706553747265616d204c6179657220300a"))
	// no FIN: the stream stays open until the receiver stops it
	select {
	case <-st.Context().Done():
	case <-time.After(waitFor):
		t.Fatal("malformed entity stream was not stopped")
	}
	if err := context.Cause(st.Context()); !isStreamCode(err, wire.CodeEntityInvalid) {
		t.Fatalf("stream ended with %v, want STOP_SENDING 0x05", err)
	}
	select {
	case e := <-sr.entities:
		t.Fatalf("handler got a malformed entity %+v", e.h)
	default:
	}
}

// Section 5.3: an entity stream aborted by its sender yields FAILED.
func TestResetEntityStreamYieldsFailed(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m, window(1))
		id, _ := p.client.AssignID(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		errc := make(chan error, 1)
		go func() { errc <- p.client.SendEntity(ctx, header(id, 1<<20, 6), pr) }()
		pw.Write(make([]byte, 1000))
		cancel() // resets the stream with PIPESTREAM_NO_ERROR
		pw.Close()
		if err := recv(t, errc, "SendEntity"); !errors.Is(err, context.Canceled) {
			t.Fatalf("SendEntity: %v, want context.Canceled", err)
		}
		waitFailed(t, p, id)
		// If the header got through, the handler saw the reset as an error.
		select {
		case got := <-p.sr.entities:
			if got.err == nil {
				t.Fatal("server read a reset entity without error")
			}
		case <-time.After(100 * time.Millisecond):
		}
	})
}

// Section 5.3: on connection loss HandleClose reports an error, so the
// owner fails every non-terminal entity. The network is cut mid-entity.
func TestPeerDeathMidEntity(t *testing.T) {
	p := newPairViaProxy(t, cborMode, func(c, s *quicpeer.Config) {
		ka := uint64(200)
		c.Offer.KeepaliveTimeoutMs, s.Offer.KeepaliveTimeoutMs = &ka, &ka
	})
	ctx := context.Background()
	id, _ := p.client.AssignID(ctx)
	started := make(chan struct{})
	p.sr.setOnEntity(func(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
		buf := make([]byte, 1000)
		io.ReadFull(e.Payload, buf)
		close(started)
		_, err := io.Copy(io.Discard, e.Payload)
		p.sr.entities <- entityResult{err: err}
	})
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	big := &wire.EntityHeader{EntityID: id, PayloadLength: 1 << 30} // no checksum: never completes
	go func() { errc <- p.client.SendEntity(ctx, big, pr) }()
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := pw.Write(buf); err != nil {
				return
			}
		}
	}()
	recv(t, started, "entity start")
	p.proxy.cut()
	if err := recv(t, p.cr.closed, "client HandleClose"); err == nil {
		t.Fatal("client HandleClose(nil) after the peer vanished")
	}
	if err := recv(t, errc, "SendEntity"); err == nil {
		t.Fatal("SendEntity succeeded across a dead connection")
	}
	pr.CloseWithError(io.ErrClosedPipe)
	if err := recv(t, p.sr.closed, "server HandleClose"); err == nil {
		t.Fatal("server HandleClose(nil) after the client vanished")
	}
	if got := recv(t, p.sr.entities, "server read end"); got.err == nil {
		t.Fatal("server payload read ended cleanly")
	}
}

// udpProxy forwards datagrams between one client and a server until cut.
type udpProxy struct {
	pc     net.PacketConn
	server *net.UDPAddr
	client atomic.Pointer[net.UDPAddr]
	dead   atomic.Bool
	wg     sync.WaitGroup
	up     *net.UDPConn
}

func newUDPProxy(t *testing.T, server string) *udpProxy {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := net.ResolveUDPAddr("udp", server)
	up, err := net.DialUDP("udp", nil, sa)
	if err != nil {
		t.Fatal(err)
	}
	p := &udpProxy{pc: pc, server: sa, up: up}
	p.wg.Add(2)
	go func() { // client -> server
		defer p.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			p.client.Store(from.(*net.UDPAddr))
			if !p.dead.Load() {
				up.Write(buf[:n])
			}
		}
	}()
	go func() { // server -> client
		defer p.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			if c := p.client.Load(); c != nil && !p.dead.Load() {
				pc.WriteTo(buf[:n], c)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); up.Close(); p.wg.Wait() })
	return p
}

func (p *udpProxy) cut() { p.dead.Store(true) }

type proxiedPair struct {
	*pair
	proxy *udpProxy
}

func newPairViaProxy(t *testing.T, m mode, opts ...pairOpts) *proxiedPair {
	t.Helper()
	p := &pair{cr: newRecorder(), sr: newRecorder()}
	cc, sc := baseConfig(t, m, p.cr, false), baseConfig(t, m, p.sr, true)
	for _, o := range opts {
		o(&cc, &sc)
	}
	ln, err := quicpeer.Listen("127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	px := newUDPProxy(t, ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if p.client, err = quicpeer.Dial(ctx, px.pc.LocalAddr().String(), cc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.client.CloseWithError(0, ""); <-p.client.Done() })
	if p.server, err = ln.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.server.CloseWithError(0, ""); <-p.server.Done() })
	return &proxiedPair{p, px}
}

// Section 10.3: the payload cap and max-entities-per-scope reject the
// entity (0x06) and report FAILED; the connection lives on.
func TestEntityLimits(t *testing.T) {
	p := newPair(t, cborMode, func(c, s *quicpeer.Config) {
		s.Limits.MaxPayloadBytes = 1000
		s.Offer.MaxEntitiesPerScope = u64(2)
	})
	ctx := context.Background()
	id1, _ := p.client.AssignID(ctx)
	if err := p.client.SendEntity(ctx, header(id1, 1001, 1), newGen(1001, 1)); err != nil && codeOf(err) != wire.CodeEntityTooLarge {
		t.Fatalf("oversize entity: %v", err)
	}
	if f := nextStatus(t, p.cr); f.EntityID != id1 || f.Status != wire.StatusFailed {
		t.Fatalf("got %+v, want FAILED for the oversize entity %d", f, id1)
	}
	if p.client.Err() != nil || p.server.Err() != nil {
		t.Fatal("connection closed")
	}
	// The client never has more root entities in flight than the per-scope
	// limit: with 2, the third AssignID waits.
	p.client.AssignID(ctx)
	p.client.AssignID(ctx)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.client.AssignID(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AssignID beyond max-entities-per-scope: %v, want to wait", err)
	}
}

// A peer that ignores max-entities-per-scope gets the extra entity
// rejected with 0x06 and reported FAILED (raw client, no cursor updates).
func TestPerScopeLimitEnforcedOnReceive(t *testing.T) {
	sr := newRecorder()
	cfg := baseConfig(t, cborMode, sr, true)
	cfg.Offer.MaxEntitiesPerScope = u64(2)
	ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), defaultCaps())
	for id := uint32(1); id <= 2; id++ {
		raw.sendEntity(&wire.EntityHeader{EntityID: id, PayloadLength: 1}, []byte{1})
		if got := recv(t, sr.entities, "entity"); got.err != nil {
			t.Fatal(got.err)
		}
	}
	raw.sendEntity(&wire.EntityHeader{EntityID: 3, PayloadLength: 1}, []byte{1})
	if f := raw.nextStatus(); f.EntityID != 3 || f.Status != wire.StatusFailed {
		t.Fatalf("got %+v, want FAILED for entity 3", f)
	}
}

// docs/profile.md 3: statuses may arrive before their entity stream, and
// children before their parent; none of that is an error.
func TestOutOfOrderArrival(t *testing.T) {
	p := newPair(t, cborMode)
	ctx := context.Background()
	root, _ := p.client.AssignID(ctx)
	child, _ := p.client.AssignID(ctx)
	if err := p.client.SendStatus(status(wire.StatusDehydrating, root)); err != nil {
		t.Fatal(err)
	}
	// The peer reports the child before its stream arrived.
	if err := p.server.SendStatus(status(wire.StatusProcessing, child)); err != nil {
		t.Fatal(err)
	}
	ch := header(child, 5, 3)
	ch.ParentID = u32(root)
	if err := p.client.SendEntity(ctx, ch, newGen(5, 3)); err != nil {
		t.Fatal(err)
	}
	if err := p.client.SendEntity(ctx, header(root, 7, 4), newGen(7, 4)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := recv(t, p.sr.entities, "entity"); got.err != nil {
			t.Fatal(got.err)
		}
	}
	if f := nextStatus(t, p.sr); f.EntityID != root || f.Status != wire.StatusDehydrating {
		t.Fatalf("server got %+v", f)
	}
	if f := nextStatus(t, p.cr); f.EntityID != child || f.Status != wire.StatusProcessing {
		t.Fatalf("client got %+v", f)
	}
	// A result stream from the server for an ID the client never assigned
	// is refused (0x05).
	if err := p.server.SendEntity(ctx, header(99, 1, 5), newGen(1, 5)); err == nil || codeOf(err) != wire.CodeEntityInvalid {
		// the server may finish writing before STOP_SENDING arrives
		if err != nil {
			t.Fatalf("unassigned result stream: %v", err)
		}
	}
}

// A small entity with an in-memory payload (*bytes.Reader) arrives
// complete and verified under a context that can be cancelled; a reader
// that does not hold payload-length octets is refused with 0x05; a
// context cancelled before the send resets the stream and reports
// FAILED. PacketCounts counts the connection's
// QUIC packets (none over the in-process transport).
func TestSmallInMemoryEntity(t *testing.T) {
	p := newPair(t, cborMode, window(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	payload := bytes.Repeat([]byte("pipestream "), 93) // 1023 octets
	sum := sha256.Sum256(payload)
	id, err := p.client.AssignID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain", PayloadLength: uint64(len(payload)), Checksum: sum[:]}
	if err := p.client.SendEntity(ctx, h, bytes.NewReader(payload)); err != nil {
		t.Fatalf("SendEntity: %v", err)
	}
	got := recv(t, p.sr.entities, "entity at the server")
	if got.err != nil || got.n != int64(len(payload)) || got.sum != sum {
		t.Fatalf("server got n=%d err=%v (sum ok=%v)", got.n, got.err, got.sum == sum)
	}
	if err := p.server.SendStatus(status(wire.StatusProcessing, id)); err != nil {
		t.Fatal(err)
	}
	if err := p.server.SendStatus(status(wire.StatusComplete, id)); err != nil {
		t.Fatal(err)
	}
	for f := nextStatus(t, p.cr); f.Status != wire.StatusComplete; f = nextStatus(t, p.cr) {
	}
	sent, received := p.client.PacketCounts()
	if *transport == "inproc" {
		if sent != 0 || received != 0 {
			t.Errorf("in-process PacketCounts = %d, %d; want 0, 0", sent, received)
		}
	} else if sent == 0 || received == 0 {
		t.Errorf("PacketCounts = %d sent, %d received after an entity and its statuses; want both > 0", sent, received)
	}

	// A reader one octet short of payload-length: 0x05, FAILED.
	id2, err := p.client.AssignID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h2 := &wire.EntityHeader{EntityID: id2, ContentType: "text/plain", PayloadLength: uint64(len(payload))}
	if err := p.client.SendEntity(ctx, h2, bytes.NewReader(payload[1:])); codeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("short in-memory payload: %v, want 0x05", err)
	}

	// Cancelled before the send: the stream is reset, the entity FAILED.
	// (Window 1: the next ID comes only once the short one is resolved.)
	actx, acancel := context.WithTimeout(context.Background(), waitFor)
	defer acancel()
	id3, err := p.client.AssignID(actx)
	if err != nil {
		t.Fatalf("entity %d (short payload) never resolved: %v", id2, err)
	}
	cancel()
	h3 := &wire.EntityHeader{EntityID: id3, ContentType: "text/plain", PayloadLength: uint64(len(payload)), Checksum: sum[:]}
	if err := p.client.SendEntity(ctx, h3, bytes.NewReader(payload)); !errors.Is(err, context.Canceled) {
		t.Fatalf("SendEntity under a cancelled context: %v, want context.Canceled", err)
	}
	waitFailed(t, p, id3)
}
