package gateway_test

import (
	"bytes"
	"io"
	"net"
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

func dialH2(t *testing.T, addr string) *h2Attacker {
	t.Helper()
	c, err := net.Dial("tcp", addr)
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

// goAway reads frames until a GOAWAY or the connection ends; it returns
// the GOAWAY's error code and debug data, or an error.
func (a *h2Attacker) goAway(within time.Duration) (http2.ErrCode, string, error) {
	_ = a.c.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := a.fr.ReadFrame()
		if err != nil {
			return 0, "", err
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			return g.ErrCode, string(g.DebugData()), nil
		}
	}
}

// TestH2RapidResetCut: an authenticated client that sends HEADERS +
// RST_STREAM pairs (rapid reset) on h2c or gRPC gets GOAWAY
// ENHANCE_YOUR_CALM after its connection's reset budget, long before
// 10,000 pairs (what the client wrote before it noticed includes what
// the socket buffers took); a second connection of the same tenant too;
// SETTINGS and PING floods are cut likewise.
// Another tenant's requests succeed throughout.
func TestH2RapidResetCut(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.Authenticator = gateway.StaticTokens{"tok-a": "acme", "tok-b": "globex"}
	})
	flood := func(addr string, grpc bool, send func(a *h2Attacker) error) (int, http2.ErrCode, string, error) {
		a := dialH2(t, addr)
		sent := 0
		for ; sent < 10000; sent++ {
			if err := send(a); err != nil {
				break
			}
		}
		code, debug, err := a.goAway(5 * time.Second)
		return sent, code, debug, err
	}
	reset := func(path string, grpc bool) func(a *h2Attacker) error {
		return func(a *h2Attacker) error {
			id, err := a.request(path, "tok-a", grpc)
			if err != nil {
				return err
			}
			return a.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
	}
	cases := []struct {
		name string
		addr string
		grpc bool
		send func(a *h2Attacker) error
	}{
		{"h2c rapid reset", h.srv.HTTPAddr(), false, reset("/v1/documents", false)},
		{"h2c rapid reset, second connection", h.srv.HTTPAddr(), false, reset("/v1/documents", false)},
		{"gRPC rapid reset", h.srv.GRPCAddr(), true, reset("/pipestream.gateway.v1.DocumentService/ListDocuments", true)},
		{"h2c settings flood", h.srv.HTTPAddr(), false, func(a *h2Attacker) error { return a.fr.WriteSettings() }},
		{"gRPC ping flood", h.srv.GRPCAddr(), true, func(a *h2Attacker) error { return a.fr.WritePing(false, [8]byte{1}) }},
	}
	for _, tc := range cases {
		sent, code, debug, err := flood(tc.addr, tc.grpc, tc.send)
		if err != nil {
			t.Errorf("%s: no GOAWAY after %d frames: %v", tc.name, sent, err)
		} else if code != http2.ErrCodeEnhanceYourCalm || !strings.Contains(debug, "h2guard") {
			t.Errorf("%s: GOAWAY %v %q after %d frames, want ENHANCE_YOUR_CALM from h2guard", tc.name, code, debug, sent)
		}
		if sent >= 10000 {
			t.Errorf("%s: all %d frames written before the cut", tc.name, sent)
		}
		t.Logf("%s: cut after %d frames written (GOAWAY %v %q)", tc.name, sent, code, debug)
		if code, _, body := h.do("GET", "/v1/documents", nil, "Authorization", "Bearer tok-b"); code != 200 {
			t.Errorf("after %s: bystander GET: HTTP %d %s", tc.name, code, body)
		}
	}
}
