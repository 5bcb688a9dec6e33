package h2guard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// frame is an HTTP/2 frame header (RFC 9113 section 4.1) and payload.
func frame(typ, flags byte, id uint32, payload []byte) []byte {
	f := make([]byte, frameHeaderLen, frameHeaderLen+len(payload))
	n := len(payload)
	f[0], f[1], f[2] = byte(n>>16), byte(n>>8), byte(n)
	f[3], f[4] = typ, flags
	binary.BigEndian.PutUint32(f[5:], id)
	return append(f, payload...)
}

// pipeConn is one end of a TCP connection on loopback: the guard wraps
// the server's end, the test writes the client's.
func pipeConn(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return server, client
}

// TestScanAcrossReads: frame headers split over reads of one octet are
// still counted: the 11th RST_STREAM of a burst of 10 cuts the
// connection, what came before it reaches the server, the GOAWAY names the
// highest client stream seen, and a DATA payload that looks like frame
// headers is skipped, not parsed.
func TestScanAcrossReads(t *testing.T) {
	server, client := pipeConn(t)
	g := &Guard{Limits: Limits{Resets: Budget{PerSecond: 0.001, Burst: 10}}}
	gc := g.Wrap(server, false)
	var in bytes.Buffer
	in.WriteString(Preface)
	in.Write(frame(frameSettings, 0, 0, nil))
	// A DATA payload full of RST_STREAM headers: payload, not frames.
	fake := bytes.Repeat(frame(frameRSTStream, 0, 99, []byte{0, 0, 0, 8}), 20)
	in.Write(frame(frameData, 0, 1, fake))
	for id := uint32(1); id <= 21; id += 2 {
		in.Write(frame(frameRSTStream, 0, id, []byte{0, 0, 0, 8}))
	}
	go func() {
		for _, b := range in.Bytes() {
			if _, err := client.Write([]byte{b}); err != nil {
				return
			}
		}
	}()
	var got bytes.Buffer
	buf := make([]byte, 1)
	var err error
	for err == nil {
		var n int
		n, err = gc.Read(buf)
		got.Write(buf[:n])
	}
	if !errors.Is(err, ErrCut) || gc.CutReason() != "rst_stream" {
		t.Fatalf("read ended with %v (reason %q), want ErrCut for rst_stream", err, gc.CutReason())
	}
	// Everything before the 11th reset reached the server, and the first 8
	// octets of its header, passed on by earlier one-octet reads.
	if want := in.Len() - 13 + 8; got.Len() != want {
		t.Errorf("the server got %d octets, want %d (all before the offending frame header's last octet)", got.Len(), want)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	goaway, _ := io.ReadAll(client)
	if len(goaway) < 17 || goaway[3] != frameGoAway || binary.BigEndian.Uint32(goaway[9:]) != 21 || binary.BigEndian.Uint32(goaway[13:]) != errEnhanceCalm {
		t.Errorf("client got %x, want GOAWAY last stream 21 ENHANCE_YOUR_CALM", goaway)
	}
}

// TestHTTP1Untouched: an HTTP/1 connection is not parsed, counted or
// cut, and nothing is written to it by the guard.
func TestHTTP1Untouched(t *testing.T) {
	server, client := pipeConn(t)
	g := &Guard{Limits: Limits{Resets: Budget{PerSecond: 0.001, Burst: 1}, Settings: Budget{PerSecond: 0.001, Burst: 1}}}
	gc := g.Wrap(server, false)
	req := "POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + string(bytes.Repeat(frame(frameRSTStream, 0, 1, []byte{0, 0, 0, 8}), 8))[:100]
	go func() { _, _ = io.WriteString(client, req); client.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(gc)
	if err != nil || string(got) != req {
		t.Fatalf("read %q, %v; want the request unchanged", got, err)
	}
	gc.Attribute("acme")
	if gc.CutReason() != "" {
		t.Errorf("HTTP/1 connection cut: %s", gc.CutReason())
	}
}

// TestCooldown: after a cut the address is refused and the tenant's next
// HTTP/2 connection is cut when a request of it authenticates.
func TestCooldown(t *testing.T) {
	g := &Guard{Limits: Limits{Settings: Budget{PerSecond: 0.001, Burst: 1}}, Cooldown: time.Minute}
	server, client := pipeConn(t)
	gc := g.Wrap(server, false)
	go func() {
		var b bytes.Buffer
		b.WriteString(Preface)
		b.Write(frame(frameSettings, 0, 0, nil))
		b.Write(frame(frameSettings, 0, 0, nil))
		_, _ = client.Write(b.Bytes())
	}()
	gc.Attribute("acme") // not HTTP/2 yet: ignored
	_, err := io.ReadAll(gc)
	if !errors.Is(err, ErrCut) {
		t.Fatalf("settings flood: %v, want ErrCut", err)
	}
	if !g.Refuses(server.RemoteAddr()) {
		t.Error("the cut connection's address is not in cooldown")
	}
	// The tenant is known only now (its request authenticated late).
	gc.isH2.Store(true)
	gc.tenant.Store(nil)
	gc.Attribute("acme")
	other, _ := pipeConn(t)
	gc2 := &Conn{Conn: other, g: g, slot: make(chan struct{}, 1)}
	gc2.isH2.Store(true)
	gc2.Attribute("acme")
	if gc2.CutReason() != "tenant_cooldown" {
		t.Errorf("the tenant's next connection: cut %q, want tenant_cooldown", gc2.CutReason())
	}
}

// writeHeld is a server connection whose Write hands the octets to the
// test and returns only when the test says so: the client has them (and
// may answer) before the server's Write returns.
type writeHeld struct {
	net.Conn
	wrote  chan []byte
	resume chan struct{}
}

func (w *writeHeld) Write(p []byte) (int, error) {
	if w.wrote != nil {
		w.wrote <- p
		<-w.resume
	}
	return w.Conn.Write(p)
}

// TestPingAnsweringDataIsNotCounted: a client PING that answers DATA the
// server writes (grpc-go's BDP estimator pings once per round trip of
// received data) is not counted, also when it is read before the
// server's Write returns. Rounds alternate a write that returns before
// the client's ping and one that is held until the ping was read; with a
// ping budget of one, six rounds leave the connection up (marking the
// data only after the write counted every held round's ping: cut at the
// fourth). Two pings with no data between them are counted: the second
// is cut.
func TestPingAnsweringDataIsNotCounted(t *testing.T) {
	for _, withData := range []bool{true, false} {
		server, client := pipeConn(t)
		held := &writeHeld{Conn: server, resume: make(chan struct{})}
		g := &Guard{Limits: Limits{Pings: Budget{PerSecond: 0.001, Burst: 1}}}
		gc := g.Wrap(held, true)
		read := func(want int) error {
			buf := make([]byte, want)
			_, err := io.ReadFull(gc, buf)
			return err
		}
		go func() { _, _ = io.Copy(io.Discard, client) }()
		hello := append([]byte(Preface), frame(frameSettings, 0, 0, nil)...)
		if _, err := client.Write(hello); err != nil {
			t.Fatal(err)
		}
		if err := read(len(hello)); err != nil {
			t.Fatalf("preface: %v", err)
		}
		var err error
		for round := 0; round < 6 && err == nil; round++ {
			err = pingRound(t, gc, held, client, read, withData, round%2 == 1)
		}
		switch {
		case withData && err != nil:
			t.Errorf("pings answering data: %v (cut for %q), want the connection up", err, gc.CutReason())
		case !withData && (!errors.Is(err, ErrCut) || gc.CutReason() != "ping"):
			t.Errorf("pings without data: %v (cut for %q), want the second cut for ping", err, gc.CutReason())
		}
	}
}

// pingRound writes DATA (when withData; held: the write returns only once
// the client's ping was read), then the client pings and the server reads
// the ping.
func pingRound(t *testing.T, gc *Conn, held *writeHeld, client net.Conn, read func(int) error, withData, hold bool) error {
	done := make(chan error, 1)
	held.wrote = nil
	if withData && hold {
		held.wrote = make(chan []byte)
	}
	if withData {
		go func() {
			_, err := gc.Write(frame(frameData, 0, 1, []byte("event")))
			done <- err
		}()
		if hold {
			<-held.wrote // the DATA is on its way; its Write has not returned
		} else if err := <-done; err != nil {
			return err
		}
	}
	ping := frame(framePing, 0, 0, make([]byte, 8))
	if _, err := client.Write(ping); err != nil {
		t.Fatal(err)
	}
	err := read(len(ping))
	if withData && hold {
		close(held.resume)
		if werr := <-done; werr != nil && err == nil {
			err = werr
		}
		held.resume = make(chan struct{})
	}
	return err
}
