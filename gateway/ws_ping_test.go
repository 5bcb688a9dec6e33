package gateway_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/gateway"
)

// TestWebSocketDeadConsumerIsCutByPing: a WebSocket subscriber that never
// answers the server's pings (a dead peer behind a NAT, a frozen client)
// is disconnected once a pong is overdue (Config.WSPingInterval, pong
// within half of it), so its subscription and connection do not linger.
// The client is a raw TCP connection that completes the handshake and then
// only reads: it sees at least one ping (opcode 0x9) and then the
// connection's end, without ever sending a pong.
func TestWebSocketDeadConsumerIsCutByPing(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.WSPingInterval = 100 * time.Millisecond })
	conn, err := net.Dial("tcp", h.srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // a failsafe; the cut comes after ~150 ms
	_, err = io.WriteString(conn, "GET /v1/events/ws HTTP/1.1\r\nHost: "+h.srv.HTTPAddr()+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: HTTP %d, want 101", resp.StatusCode)
	}
	var ops []byte
	for {
		hdr := make([]byte, 2)
		if _, err := io.ReadFull(br, hdr); err != nil {
			if strings.Contains(err.Error(), "timeout") {
				t.Fatalf("the connection was not cut within 30 s of unanswered pings (frames: %x)", ops)
			}
			break // the server closed the connection
		}
		ops = append(ops, hdr[0]&0x0f)
		n := int(hdr[1] & 0x7f)
		if n >= 126 {
			t.Fatalf("unexpected long frame (opcode %x) on an idle subscription", hdr[0]&0x0f)
		}
		if _, err := io.ReadFull(br, make([]byte, n)); err != nil {
			break
		}
	}
	if len(ops) == 0 || ops[0] != 0x9 {
		t.Fatalf("frames before the cut: opcodes %x, want a ping (9) first", ops)
	}
}
