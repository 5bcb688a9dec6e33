package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pipestream/gateway/gateway/h2guard"
)

// countingConn counts the writes that reach a real connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestCorkConnOneWritePerBatch: while corked, a corkConn collects what
// coder/websocket writes and flush sends it in one write, in order; while
// not corked every write goes straight through; full reports a batch at
// corkMaxBytes. Over a real TCP connection.
func TestCorkConnOneWritePerBatch(t *testing.T) {
	server, client := tcpPair(t)
	cc := &countingConn{Conn: server}
	c := newCorkConn(cc)

	want := []byte("direct")
	if _, err := c.Write(want); err != nil || cc.writes.Load() != 1 {
		t.Fatalf("uncorked write: %v, %d writes, want 1", err, cc.writes.Load())
	}
	c.cork()
	for _, p := range []string{"one", "two", "three"} {
		if n, err := c.Write([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("corked write: %d, %v", n, err)
		}
		want = append(want, p...)
	}
	if cc.writes.Load() != 1 || c.full() {
		t.Fatalf("corked: %d writes reached the connection (want 1), full %v", cc.writes.Load(), c.full())
	}
	if err := c.flush(); err != nil || cc.writes.Load() != 2 {
		t.Fatalf("flush: %v, %d writes, want 2", err, cc.writes.Load())
	}
	if _, err := c.Write([]byte("after")); err != nil || cc.writes.Load() != 3 {
		t.Fatalf("write after flush (uncorked): %v, %d writes, want 3", err, cc.writes.Load())
	}
	want = append(want, "after"...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}

	c.cork()
	big := bytes.Repeat([]byte{'x'}, corkMaxBytes)
	if _, err := c.Write(big); err != nil || !c.full() || cc.writes.Load() != 3 {
		t.Fatalf("a corkMaxBytes batch: %v, full %v, %d writes", err, c.full(), cc.writes.Load())
	}
}

// TestCorkConnQueueData: queueData with hold corks the connection (nothing
// is written until flush, then the batch in one write, in order) and
// reports full at corkMaxBytes; without hold it leaves an uncorked
// connection uncorked, so the next drain writes it. Real TCP.
func TestCorkConnQueueData(t *testing.T) {
	server, client := tcpPair(t)
	cc := &countingConn{Conn: server}
	c := newCorkConn(cc)
	msg := wsBinaryMessage(nil, []byte("event"))
	for i := range 3 {
		full, err := c.queueData(msg, true)
		if err != nil || full || cc.writes.Load() != 0 {
			t.Fatalf("queueData %d: full %v, %v, %d writes (want none until flush)", i, full, err, cc.writes.Load())
		}
	}
	big := wsBinaryMessage(nil, bytes.Repeat([]byte{'x'}, corkMaxBytes))
	if full, err := c.queueData(big, true); err != nil || !full || cc.writes.Load() != 0 {
		t.Fatalf("queueData past corkMaxBytes: full %v, %v, %d writes", full, err, cc.writes.Load())
	}
	if err := c.flush(); err != nil || cc.writes.Load() != 1 {
		t.Fatalf("flush: %v, %d writes, want 1 (the whole batch)", err, cc.writes.Load())
	}
	want := append(bytes.Repeat(msg, 3), big...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the queued batch read back differs (%v)", err)
	}
	if full, err := c.queueData(msg, false); err != nil || full {
		t.Fatalf("queueData without hold: full %v, %v", full, err)
	}
	ping := wsFrameBytes(0x89, 4)
	if _, err := c.Write(ping); err != nil || cc.writes.Load() != 2 {
		t.Fatalf("an uncorked Write after queueData(hold false): %v, %d writes, want 2 (one drain for both)", err, cc.writes.Load())
	}
	want = append(slices.Clone(msg), ping...)
	got = make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back differs (%v)", err)
	}
}

// TestRawWriterSkipsOnlyReadingWrappers: a hijacked WebSocket connection's
// frames are written to the socket under the smuggling guard, the
// connection cap's wrapper and the HTTP/2 guard once that guard saw
// HTTP/1 (none of them writes or follows written bytes then); an HTTP/2
// connection's guard, one that has not decided yet, and any other
// wrapper (TLS, a test's counter) stay in the way. Real TCP connections.
func TestRawWriterSkipsOnlyReadingWrappers(t *testing.T) {
	g := &h2guard.Guard{}
	wrap := func(first string) (tcp net.Conn, hg *h2guard.Conn) {
		server, client := tcpPair(t)
		hg = g.Wrap(&cappedConn{Conn: server, release: func() {}}, false)
		if got := rawWriter(newGuardConn(hg, 4096)); got != hg {
			t.Fatalf("before the first read: rawWriter = %T, want the undecided HTTP/2 guard", got)
		}
		if _, err := client.Write([]byte(first)); err != nil {
			t.Fatal(err)
		}
		if _, err := hg.Read(make([]byte, len(first))); err != nil {
			t.Fatal(err)
		}
		return server, hg
	}
	tcp, hg := wrap("GET /v1/events/ws HTTP/1.1\r\n")
	if got := rawWriter(newGuardConn(hg, 4096)); got != tcp {
		t.Fatalf("HTTP/1: rawWriter = %T, want the TCP connection", got)
	}
	_, hg2 := wrap(h2guard.Preface)
	if got := rawWriter(newGuardConn(hg2, 4096)); got != hg2 {
		t.Fatalf("HTTP/2: rawWriter = %T, want the HTTP/2 guard", got)
	}
	server, _ := tcpPair(t)
	other := &countingConn{Conn: server}
	if got := rawWriter(&cappedConn{Conn: other}); got != other {
		t.Fatalf("an unknown wrapper: rawWriter = %T, want it", got)
	}
}

// tcpPair is a real loopback TCP connection: server and client ends.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return server, client
}

// TestWSBinaryMessageReadByCoder: the frames of our own writer
// (wsBinaryMessage) are read back by coder/websocket's client as binary
// messages with the same payload, at every length boundary of RFC 6455
// 5.2 (7-bit, 16-bit and 64-bit lengths), over a real TCP connection
// after a real handshake.
func TestWSBinaryMessageReadByCoder(t *testing.T) {
	sizes := []int{0, 1, 125, 126, 127, 65535, 65536, 70000}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj := &corkHijacker{ResponseWriter: w}
		c, err := websocket.Accept(hj, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for _, n := range sizes {
			if err := hj.conn.writeData(wsBinaryMessage(nil, bytes.Repeat([]byte{byte(n)}, n))); err != nil {
				t.Error(err)
				return
			}
			if err := hj.conn.flush(); err != nil {
				t.Error(err)
				return
			}
		}
		_ = c.Close(websocket.StatusNormalClosure, "")
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	for _, n := range sizes {
		typ, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("message of %d bytes: %v", n, err)
		}
		if typ != websocket.MessageBinary || !bytes.Equal(got, bytes.Repeat([]byte{byte(n)}, n)) {
			t.Fatalf("message of %d bytes: type %v, %d bytes read", n, typ, len(got))
		}
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after the messages: %v, want a normal close", err)
	}
}

// TestCorkConnNoDataAfterClose: coder/websocket's frames reach Write in
// any pieces (seeded random splits, frames with 7-, 16- and 64-bit
// lengths whose payload bytes are all 0x88, a close frame's first byte,
// to fool the scan); data is accepted until a close frame's header has
// passed, refused after, and the wire holds exactly what was accepted, in
// order, ending with the close frame.
func TestCorkConnNoDataAfterClose(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 25))
	for round := range 40 {
		server, client := tcpPair(t)
		c := newCorkConn(server)
		data := wsBinaryMessage(nil, []byte("event"))
		var want []byte
		for range 1 + rng.IntN(4) {
			ops := []byte{0x89, 0x8a, 0x82}
			sizes := []int{0, 5, 125, 126, 300, 65535, 65536}
			f := wsFrameBytes(ops[rng.IntN(len(ops))], sizes[rng.IntN(len(sizes))])
			writePieces(t, rng, c, f)
			want = append(want, f...)
			if err := c.writeData(data); err != nil { // between whole frames
				t.Fatalf("seed %d round %d: data before the close frame refused: %v", seed, round, err)
			}
			if err := c.flush(); err != nil {
				t.Fatal(err)
			}
			want = append(want, data...)
		}
		closeFrame := wsFrameBytes(0x88, 2+rng.IntN(100))
		writePieces(t, rng, c, closeFrame)
		want = append(want, closeFrame...)
		if err := c.writeData(data); !errors.Is(err, errCloseSent) {
			t.Fatalf("seed %d round %d: data after the close frame: %v, want errCloseSent", seed, round, err)
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("seed %d round %d: wire differs from the accepted frames (%v)", seed, round, err)
		}
		_ = server.Close()
		if n, _ := client.Read(make([]byte, 1)); n != 0 {
			t.Fatalf("seed %d round %d: bytes after the close frame", seed, round)
		}
	}
}

// writePieces writes f through c.Write in random pieces.
func writePieces(t *testing.T, rng *rand.Rand, c *corkConn, f []byte) {
	t.Helper()
	for len(f) > 0 {
		k := 1 + rng.IntN(min(len(f), 200))
		if _, err := c.Write(f[:k]); err != nil {
			t.Fatal(err)
		}
		f = f[k:]
	}
}

// wsFrameBytes is an unmasked frame with first byte op and n payload
// bytes, all 0x88.
func wsFrameBytes(op byte, n int) []byte {
	b := wsBinaryMessage(nil, bytes.Repeat([]byte{0x88}, n))
	b[0] = op
	return b
}

// TestCorkConnConcurrentFrames: the owner's batches, coder/websocket's
// pings from another goroutine and a close frame from a third at a random
// moment reach the wire as whole frames (nothing interleaved inside a
// frame), every accepted data message exactly once and in order, and no
// data frame after the close frame; writeData refuses from the close on.
// Seeded; over a real TCP connection; run it with -race too.
func TestCorkConnConcurrentFrames(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 99))
	for round := range 20 {
		server, client := tcpPair(t)
		c := newCorkConn(server)
		closeAfter := 1 + rng.IntN(300) // data messages accepted before the close goes
		var accepted atomic.Int64
		ownerSeed, pingSeed := rng.Uint64(), rng.Uint64()
		wire := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(client); wire <- b }()
		var wg sync.WaitGroup
		wg.Add(3)
		go func() { // the owner: batches of data messages
			defer wg.Done()
			r := rand.New(rand.NewPCG(ownerSeed, 1))
			var seq uint64
			for seq < uint64(closeAfter)+100000 { // bounded: a writeData that never refuses fails below
				batch := r.IntN(3) > 0
				if batch {
					c.cork()
				}
				for range 1 + r.IntN(6) {
					seq++
					if err := c.writeData(wsBinaryMessage(nil, binary.BigEndian.AppendUint64(nil, seq))); err != nil {
						if !errors.Is(err, errCloseSent) {
							t.Error(err)
						}
						_ = c.flush()
						return
					}
					accepted.Add(1)
				}
				if err := c.flush(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		go func() { // coder/websocket's pings, whole frames through Write
			defer wg.Done()
			r := rand.New(rand.NewPCG(pingSeed, 2))
			for range 50 {
				if _, err := c.Write(wsFrameBytes(0x89, r.IntN(126))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		go func() { // the close frame, once closeAfter messages were accepted
			defer wg.Done()
			for accepted.Load() < int64(closeAfter) {
				runtime.Gosched()
			}
			if _, err := c.Write(wsFrameBytes(0x88, 2)); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
		_ = server.Close()
		got := <-wire
		checkWire(t, seed, round, got, accepted.Load())
	}
}

// checkWire parses server frames from b: whole frames only, data
// messages numbered 1..accepted in order, one close frame, no data
// after it, 50 pings.
func checkWire(t *testing.T, seed uint64, round int, b []byte, accepted int64) {
	t.Helper()
	var next uint64 = 1
	closed, pings := false, 0
	for len(b) > 0 {
		need, ok := wsHeaderLen(b)
		if !ok || len(b) < need {
			t.Fatalf("seed %d round %d: a cut frame header on the wire", seed, round)
		}
		n := wsPayloadLen(b[:need])
		if uint64(len(b)-need) < n {
			t.Fatalf("seed %d round %d: a cut frame on the wire", seed, round)
		}
		payload := b[need : need+int(n)]
		switch b[0] {
		case 0x82:
			if closed {
				t.Fatalf("seed %d round %d: a data frame after the close frame", seed, round)
			}
			if n != 8 || binary.BigEndian.Uint64(payload) != next {
				t.Fatalf("seed %d round %d: data message %x where %d was due", seed, round, payload, next)
			}
			next++
		case 0x88:
			if closed {
				t.Fatalf("seed %d round %d: two close frames", seed, round)
			}
			closed = true
		case 0x89:
			pings++
		default:
			t.Fatalf("seed %d round %d: frame byte %#x", seed, round, b[0])
		}
		b = b[need+int(n):]
	}
	if int64(next-1) != accepted || !closed || pings != 50 {
		t.Fatalf("seed %d round %d: %d data messages on the wire, %d accepted; close %v; %d pings", seed, round, next-1, accepted, closed, pings)
	}
}

// TestCorkConnTryFlushNeverWaits: a fan-out worker's write (tryFlush,
// eventlog.Push) returns at once when the peer stops reading: it writes
// what the socket takes, keeps the rest pending, in order and before any
// frame queued meanwhile (a ping through Write while the batch is
// corked), and reports false; the owner's flush then writes the rest once
// the peer reads. Seeded frame sizes; a failure prints the seed.
func TestCorkConnTryFlushNeverWaits(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	server, client := tcpPair(t)
	cc := newCorkConn(server)
	cc.try = newTryWriter(cc.out)
	if cc.try == nil {
		t.Fatal("no try writer over a TCP connection")
	}
	var want []byte
	partial := false
	for i := 0; !partial; i++ {
		if i > 100_000 {
			t.Fatalf("seed %d: tryFlush kept writing %d bytes to a peer that reads nothing", seed, len(want))
		}
		for range 1 + rng.IntN(8) {
			msg := wsBinaryMessage(nil, bytes.Repeat([]byte{byte(i)}, 1+rng.IntN(4<<10)))
			if _, err := cc.queueData(msg, true); err != nil {
				t.Fatal(err)
			}
			want = append(want, msg...)
		}
		start := time.Now()
		partial = !cc.tryFlush()
		if d := time.Since(start); d > 5*time.Second { // a failsafe: it never waits on the peer
			t.Fatalf("seed %d: tryFlush took %v", seed, d)
		}
	}
	// A frame queued behind the pending rest (a ping while corked).
	if _, err := cc.queueData(nil, true); err != nil {
		t.Fatal(err)
	}
	ping := []byte{0x89, 0}
	if _, err := cc.Write(ping); err != nil {
		t.Fatal(err)
	}
	want = append(want, ping...)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(client, int64(len(want))))
		got <- b
	}()
	if err := cc.flush(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("seed %d: the peer read %d bytes, want %d in the order queued", seed, len(b), len(want))
	}
	// Without a socket below (TLS, a pipe) there is no try writer: a worker
	// never serves such a subscriber.
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if newTryWriter(p1) != nil {
		t.Error("a try writer over a pipe")
	}
}
