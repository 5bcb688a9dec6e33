package gateway_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/pipestream/gateway/gateway"
)

// h2Attacker is a raw HTTP/2 client connection (prior knowledge) built
// from x/net/http2's Framer: it sends what a hostile client would.
type h2Attacker struct {
	t    *testing.T
	c    net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	next uint32
}

// dialH2 connects from the loopback address ip (a cut puts the client's
// address in cooldown, so each attacker has its own).
func dialH2(t *testing.T, ip, addr string) *h2Attacker {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a := &h2Attacker{t: t, c: c, fr: http2.NewFramer(c, c), next: 1}
	a.enc = hpack.NewEncoder(&a.hbuf)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := a.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return a
}

// request sends HEADERS of an authenticated GET (path on the REST
// listener, or a gRPC method when grpc) and returns its stream id.
func (a *h2Attacker) request(path, token string, grpc bool) (uint32, error) {
	a.hbuf.Reset()
	method, ctype := "GET", ""
	if grpc {
		method, ctype = "POST", "application/grpc"
	}
	for _, f := range [][2]string{{":method", method}, {":scheme", "http"}, {":authority", "127.0.0.1"}, {":path", path},
		{"authorization", "Bearer " + token}} {
		_ = a.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if ctype != "" {
		_ = a.enc.WriteField(hpack.HeaderField{Name: "content-type", Value: ctype})
		_ = a.enc.WriteField(hpack.HeaderField{Name: "te", Value: "trailers"})
	}
	id := a.next
	a.next += 2
	return id, a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.hbuf.Bytes(), EndHeaders: true, EndStream: !grpc})
}

// goAwayFrame reads frames until a GOAWAY or the connection ends; it
// returns the GOAWAY's error code, debug data and last stream id, or an
// error.
func (a *h2Attacker) goAwayFrame(within time.Duration) (http2.ErrCode, string, uint32, error) {
	_ = a.c.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := a.fr.ReadFrame()
		if err != nil {
			return 0, "", 0, err
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			return g.ErrCode, string(g.DebugData()), g.LastStreamID, nil
		}
	}
}

// closedAtOnce reports (nil) whether a connection from ip is closed by
// the server at once (a gRPC server may first send its SETTINGS, and the
// guard a GOAWAY), before it serves anything.
func closedAtOnce(ip, addr string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil // refused
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return nil
	}
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	n, err := io.Copy(io.Discard, c)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("still open after 3 s (read %d bytes)", n)
	}
	return nil // EOF or reset
}

// TestH2RapidResetCut: an authenticated client that sends HEADERS +
// RST_STREAM pairs (rapid reset) on h2c or gRPC gets GOAWAY
// ENHANCE_YOUR_CALM after its connection's reset budget (the GOAWAY's last
// stream id shows how far the server read); SETTINGS and PING floods are
// cut likewise.
// After a cut, the address is in cooldown (a new connection from it is
// closed at once) and so is the tenant (its next connection, from
// another address, is cut at its first authenticated request). Another
// tenant's requests succeed throughout.
func TestH2RapidResetCut(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.Authenticator = gateway.StaticTokens{"tok-a": "acme", "tok-b": "globex", "tok-c": "initech", "tok-d": "umbrella"}
	})
	cuts := func(reason string) float64 {
		_, _, body := h.do("GET", "/metrics", nil)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, `pipestream_gateway_rejected_total{reason="h2_`+reason+`"}`) {
				var v float64
				fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v)
				return v
			}
		}
		return 0
	}
	flood := func(ip, addr string, send func(a *h2Attacker) error) (int, http2.ErrCode, string, uint32, error) {
		a := dialH2(t, ip, addr)
		sent := 0
		for ; sent < 10000; sent++ {
			if err := send(a); err != nil {
				break
			}
		}
		code, debug, last, err := a.goAwayFrame(5 * time.Second)
		return sent, code, debug, last, err
	}
	reset := func(tok, path string, grpc bool) func(a *h2Attacker) error {
		return func(a *h2Attacker) error {
			id, err := a.request(path, tok, grpc)
			if err != nil {
				return err
			}
			return a.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
	}
	cases := []struct {
		name, ip, addr string
		send           func(a *h2Attacker) error
		want           string
		grpc           bool
	}{
		{"h2c rapid reset", "127.0.5.1", h.srv.HTTPAddr(), reset("tok-a", "/v1/documents", false), "rst_stream", false},
		{"the tenant's next connection, plain requests", "127.0.5.2", h.srv.HTTPAddr(), func(a *h2Attacker) error {
			_, err := a.request("/v1/documents", "tok-a", false)
			return err
		}, "tenant_cooldown", false},
		{"gRPC rapid reset", "127.0.5.3", h.srv.GRPCAddr(), reset("tok-c", "/pipestream.gateway.v1.DocumentService/ListDocuments", true), "rst_stream", true},
		{"h2c settings flood", "127.0.5.4", h.srv.HTTPAddr(), func(a *h2Attacker) error { return a.fr.WriteSettings() }, "settings", false},
		{"gRPC ping flood", "127.0.5.5", h.srv.GRPCAddr(), func(a *h2Attacker) error { return a.fr.WritePing(false, [8]byte{1}) }, "ping", true},
	}
	for _, tc := range cases {
		before := cuts(tc.want)
		sent, code, debug, last, err := flood(tc.ip, tc.addr, tc.send)
		switch {
		case err != nil && !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset"):
			t.Errorf("%s: not cut after %d frames: %v", tc.name, sent, err)
		case err == nil && tc.want == "ping" && tc.grpc && debug == "too_many_pings":
			// grpc-go's own keepalive policy (no pings more often than
			// every 15 s without data) may cut a ping flood first.
			t.Logf("%s: cut by grpc-go's keepalive policy (GOAWAY %v %q) before h2guard", tc.name, code, debug)
			continue
		case err == nil && (code != http2.ErrCodeEnhanceYourCalm || !strings.Contains(debug, "h2guard") || !strings.Contains(debug, tc.want)):
			t.Errorf("%s: GOAWAY %v %q after %d frames, want ENHANCE_YOUR_CALM from h2guard for %s", tc.name, code, debug, sent, tc.want)
		}
		// The GOAWAY is written only between two of the server's frames;
		// a cut while the server is mid-frame just closes. The metric
		// counts every cut by its reason.
		if after := cuts(tc.want); after != before+1 {
			t.Errorf("%s: pipestream_gateway_rejected_total{reason=\"h2_%s\"} went from %v to %v, want one more", tc.name, tc.want, before, after)
		}
		// The GOAWAY names the last stream the server saw: a reset flood
		// is cut within its budget (100 per connection), not after
		// thousands (the client's count includes what socket buffers took).
		if tc.want == "rst_stream" && last > 2*1000 {
			t.Errorf("%s: cut after stream %d, want within about 100 resets", tc.name, last)
		}
		t.Logf("%s: %d frames written, GOAWAY %v %q, last stream %d", tc.name, sent, code, debug, last)
		if code, _, body := h.do("GET", "/v1/documents", nil, "Authorization", "Bearer tok-b"); code != 200 {
			t.Errorf("after %s: bystander GET: HTTP %d %s", tc.name, code, body)
		}
		// The address cools down: a new connection from it is closed
		// before it is served.
		if err := closedAtOnce(tc.ip, tc.addr); err != nil {
			t.Errorf("%s: a new connection from %s: %v, want it closed at once", tc.name, tc.ip, err)
		}
	}
}
