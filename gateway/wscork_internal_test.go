package gateway

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
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
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	defer server.Close()
	cc := &countingConn{Conn: server}
	c := &corkConn{Conn: cc}

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
