package quicpeer_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func fmtp(f wire.Format) *wire.Format { return &f }

// Section 3.4-3.5, docs/profile.md section 1: both ends compute the same
// down-negotiated capabilities.
func TestCapabilityNegotiationMatrix(t *testing.T) {
	type offer struct {
		l1, l2 bool
		format *wire.Format
		ka     *uint64
		window *uint64
		depth  *uint64
	}
	cases := []struct {
		name           string
		client, server offer
		want           quicpeer.Negotiated
	}{
		{"layer0 defaults", offer{}, offer{},
			quicpeer.Negotiated{Format: wire.FormatCBOR, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"layer1 both", offer{l1: true}, offer{l1: true},
			quicpeer.Negotiated{Layer1: true, Format: wire.FormatCBOR, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"layer1 one side", offer{l1: true, l2: true}, offer{},
			quicpeer.Negotiated{Format: wire.FormatCBOR, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"layer2 needs layer1", offer{l1: false, l2: true}, offer{l1: true, l2: true},
			quicpeer.Negotiated{Format: wire.FormatCBOR, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"layer2 both", offer{l1: true, l2: true}, offer{l1: true, l2: true},
			quicpeer.Negotiated{Layer1: true, Layer2: true, Format: wire.FormatCBOR, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"protobuf both", offer{format: fmtp(wire.FormatProtobuf)}, offer{format: fmtp(wire.FormatProtobuf)},
			quicpeer.Negotiated{Format: wire.FormatProtobuf, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"protobuf one side falls back to cbor", offer{format: fmtp(wire.FormatProtobuf)}, offer{},
			quicpeer.Negotiated{Format: wire.FormatCBOR, MaxDepth: 7, Keepalive: 30 * time.Second, MaxWindow: wire.MaxSafeWindow}},
		{"keepalive window depth are minimums", offer{l1: true, ka: u64(5000), window: u64(64), depth: u64(5)}, offer{l1: true, ka: u64(20000), window: u64(16), depth: u64(6)},
			quicpeer.Negotiated{Layer1: true, Format: wire.FormatCBOR, MaxDepth: 5, Keepalive: 5 * time.Second, MaxWindow: 16}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			apply := func(c *quicpeer.Config, o offer) {
				c.Offer = wire.Capabilities{Layer0Core: true, Layer1Recursive: o.l1, Layer2Resilience: o.l2,
					SerializationFormat: o.format, KeepaliveTimeoutMs: o.ka, MaxWindowSize: o.window, MaxScopeDepth: o.depth}
			}
			p := newPair(t, cborMode, func(c, s *quicpeer.Config) { apply(c, tc.client); apply(s, tc.server) })
			for _, s := range []*quicpeer.Session{p.client, p.server} {
				got := s.Negotiated()
				got.PeerOffer = wire.Capabilities{}
				got.MaxPerScope = 0
				if got != tc.want {
					t.Errorf("%v negotiated %+v, want %+v", s.Role(), got, tc.want)
				}
			}
			if p.client.Role() != quicpeer.RoleClient || p.server.Role() != quicpeer.RoleServer {
				t.Error("roles are wrong")
			}
			if len(p.client.ID()) != 32 || p.client.ID() == p.server.ID() {
				t.Errorf("session IDs %q %q are not distinct 128-bit hex", p.client.ID(), p.server.ID())
			}
		})
	}
}

// Section 3.4.2: an undecodable first CAPABILITIES closes with 0x01;
// layer0-core false with 0x0C (docs/profile.md section 1).
func TestFirstCapabilitiesRejected(t *testing.T) {
	cases := []struct {
		name  string
		frame []byte
		want  wire.ErrorCode
	}{
		{"undecodable CBOR", wire.AppendVariable(nil, wire.FrameCapabilities, []byte{0xff, 0xfe, 0x01}), wire.CodeInternalError},
		{"not CAPABILITIES first", appendStatus(status(wire.StatusProcessing, 1)), wire.CodeInternalError},
		{"truncated length", []byte{0x80, 0x00}, wire.CodeInternalError},
		// The 4 KiB cap applies to the declared length: no body follows,
		// so the close can only come from the length (docs/profile.md 1).
		{"declared 4097 octets", []byte{0x80, 0x00, 0x00, 0x10, 0x01}, wire.CodeEntityTooLarge},
		{"declared 1 MiB", []byte{0x80, 0x00, 0x10, 0x00, 0x00}, wire.CodeEntityTooLarge},
		// vector control-cbor/invalid-capabilities-layer0-false.bin
		{"layer0-core false", hexBytes(t, "8000000033a36b6c61796572302d636f7265f4706c61796572312d726563757273697665f4716c61796572322d726573696c69656e6365f4"), wire.CodeLayerUnsupported},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sr := newRecorder()
			cfg := baseConfig(t, cborMode, sr, true)
			ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw := dialRaw(t, ln.Addr().String(), nil)
			raw.write(tc.frame)
			if tc.name == "truncated length" {
				raw.ctrl.Close() // FIN inside the frame
			}
			if got := raw.closeCode(); got != tc.want {
				t.Fatalf("closed with %v, want %v", got, tc.want)
			}
		})
	}
}

// The client side applies the same rule to the server's answer.
func TestClientRejectsUndecodableServerCapabilities(t *testing.T) {
	addr, accept := listenRaw(t)
	errc := make(chan error, 1)
	cfg := baseConfig(t, cborMode, newRecorder(), false)
	go func() {
		_, err := quicpeer.Dial(context.Background(), addr, cfg)
		errc <- err
	}()
	raw := accept()
	if _, err := raw.cr.Next(); err != nil {
		t.Fatalf("client CAPABILITIES: %v", err)
	}
	raw.write(wire.AppendVariable(nil, wire.FrameCapabilities, []byte{0xa1, 0xff}))
	if got := raw.closeCode(); got != wire.CodeInternalError {
		t.Fatalf("closed with %v, want 0x01", got)
	}
	if err := recv(t, errc, "Dial"); codeOf(err) != wire.CodeInternalError {
		t.Fatalf("Dial returned %v, want PIPESTREAM_INTERNAL_ERROR", err)
	}
}

// A client that never sends CAPABILITIES is closed after HandshakeTimeout.
func TestHandshakeTimeout(t *testing.T) {
	cfg := baseConfig(t, cborMode, newRecorder(), true)
	cfg.HandshakeTimeout = 300 * time.Millisecond
	ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), nil)
	raw.write([]byte{0x80}) // make stream 0 visible, never finish the frame
	if got := raw.closeCode(); got != wire.CodeIdleTimeout {
		t.Fatalf("closed with %v, want PIPESTREAM_IDLE_TIMEOUT", got)
	}
}

// Section 10.1: TLS 1.3 only; no way to turn encryption off.
func TestTLSIsMandatory(t *testing.T) {
	cfg := baseConfig(t, cborMode, newRecorder(), false)
	cfg.TLS = nil
	if _, err := quicpeer.Dial(context.Background(), "127.0.0.1:1", cfg); err == nil {
		t.Fatal("Dial without TLS succeeded")
	}
	cfg = baseConfig(t, cborMode, newRecorder(), false)
	cfg.TLS.MaxVersion = tls.VersionTLS12
	if _, err := quicpeer.Dial(context.Background(), "127.0.0.1:1", cfg); err == nil {
		t.Fatal("Dial with TLS 1.2 max succeeded")
	}
	p := newPair(t, cborMode)
	_ = p // handshake succeeded with MinVersion forced to 1.3 on both ends
}

// A Config can offer max-scope-depth 0 (Offer.MaxScopeDepth -> 0): the
// server advertises 0, both ends negotiate 0, and a STATUS at depth 1 is
// refused with PIPESTREAM_DEPTH_EXCEEDED (0x07, Section 10.4).
func TestOfferMaxScopeDepthZero(t *testing.T) {
	sr := newRecorder()
	sr.closed = make(chan error, 2) // two sessions end on this listener
	cfg := baseConfig(t, cborMode, sr, true)
	cfg.Offer.Layer1Recursive = true
	cfg.Offer.MaxScopeDepth = u64(0)
	ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	t.Run("negotiated", func(t *testing.T) {
		ccfg := baseConfig(t, cborMode, newRecorder(), false)
		ccfg.Offer.Layer1Recursive = true
		c, err := quicpeer.Dial(context.Background(), ln.Addr().String(), ccfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseWithError(wire.CodeNoError, "")
		if n := c.Negotiated(); !n.Layer1 || n.MaxDepth != 0 {
			t.Errorf("client negotiated layer1=%t max-depth=%d, want layer1 and depth 0", n.Layer1, n.MaxDepth)
		}
		s, err := ln.Accept(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d := s.Negotiated().MaxDepth; d != 0 {
			t.Errorf("server negotiated max-depth %d, want 0", d)
		}
	})
	t.Run("advertised and enforced", func(t *testing.T) {
		raw := dialRaw(t, ln.Addr().String(), nil)
		raw.write(capsFrame(t, &wire.Capabilities{Layer0Core: true, Layer1Recursive: true}))
		f, err := raw.cr.Next()
		if err != nil || f.Type != wire.FrameCapabilities {
			t.Fatalf("server CAPABILITIES: %v", err)
		}
		c, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCapabilities(f.Body)
		if err != nil {
			t.Fatal(err)
		}
		if c.MaxScopeDepth == nil || *c.MaxScopeDepth != 0 {
			t.Errorf("server advertised max-scope-depth %v, want 0", c.MaxScopeDepth)
		}
		raw.status(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: 1, ScopeID: 5, Depth: 1})
		if got := raw.closeCode(); got != wire.CodeDepthExceeded {
			t.Errorf("STATUS at depth 1 with max-depth 0: closed with %v, want 0x07", got)
		}
	})
}

// The server's CAPABILITIES is the negotiated set in every framing mode
// (the draft-04 reference server's answer): to a client that offers Layer
// 0 only, window 1024 and keepalive 30000 it answers Layer 0 only, window
// 1024, keepalive 30000, though the server itself offers every layer and
// the largest window.
func TestServerAnswersNegotiatedSet(t *testing.T) {
	for _, mode := range []quicpeer.Framing{quicpeer.FramingAuto, quicpeer.FramingDraft02, quicpeer.FramingDraft04} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := baseConfig(t, cborMode, newRecorder(), true)
			cfg.Framing = mode
			cfg.Offer = wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}
			ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw := dialRaw(t, ln.Addr().String(), nil)
			f0 := wire.FormatCBOR
			raw.write(capsFrame(t, &wire.Capabilities{Layer0Core: true, MaxWindowSize: u64(1024), KeepaliveTimeoutMs: u64(30000), SerializationFormat: &f0}))
			f, err := raw.cr.Next()
			if err != nil || f.Type != wire.FrameCapabilities {
				t.Fatalf("server CAPABILITIES: %v (type %#x)", err, f.Type)
			}
			got, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCapabilities(f.Body)
			if err != nil {
				t.Fatal(err)
			}
			if got.Layer1Recursive || got.Layer2Resilience || got.MaxWindowSize == nil || *got.MaxWindowSize != 1024 ||
				got.KeepaliveTimeoutMs == nil || *got.KeepaliveTimeoutMs != 30000 {
				t.Errorf("answer %+v (window %v keepalive %v), want layer 0 only, window 1024, keepalive 30000", got, deref(got.MaxWindowSize), deref(got.KeepaliveTimeoutMs))
			}
			if err := wire.ValidateAnswer(&wire.Capabilities{Layer0Core: true, MaxWindowSize: u64(1024), KeepaliveTimeoutMs: u64(30000)}, got); err != nil {
				t.Errorf("the reference's validate_response would refuse the answer: %v", err)
			}
		})
	}
}

func deref(p *uint64) any {
	if p == nil {
		return nil
	}
	return *p
}

// A draft-04 client refuses a server CAPABILITIES above its offer, as the
// reference's validate_response does: PIPESTREAM_FRAME_ERROR (0x0D) on the
// connection and from Dial. A draft-02 client takes the minimum instead
// (Section 3.4: each end sends its own capabilities).
func TestClientRefusesAnswerAboveOffer(t *testing.T) {
	for _, tc := range []struct {
		mode   quicpeer.Framing
		refuse bool
	}{{quicpeer.FramingDraft04, true}, {quicpeer.FramingDraft02, false}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			addr, accept := listenRaw(t)
			cfg := baseConfig(t, cborMode, newRecorder(), false)
			cfg.Framing = tc.mode
			cfg.Offer = wire.Capabilities{Layer0Core: true, MaxWindowSize: u64(1024)}
			type dialed struct {
				s   *quicpeer.Session
				err error
			}
			dc := make(chan dialed, 1)
			go func() {
				s, err := quicpeer.Dial(context.Background(), addr, cfg)
				dc <- dialed{s, err}
			}()
			srv := accept()
			if f, err := srv.cr.Next(); err != nil || f.Type != wire.FrameCapabilities {
				t.Fatalf("client's first frame: %v %v", f.Type, err)
			}
			srv.write(capsFrame(t, &wire.Capabilities{Layer0Core: true, Layer1Recursive: true, MaxWindowSize: u64(4096)}))
			d := recv(t, dc, "dial")
			if !tc.refuse {
				if d.err != nil {
					t.Fatalf("draft-02 client: %v", d.err)
				}
				defer d.s.CloseWithError(wire.CodeNoError, "done")
				if n := d.s.Negotiated(); n.Layer1 || n.MaxWindow != 1024 {
					t.Errorf("draft-02 client negotiated %+v, want layer 0 and window 1024", n)
				}
				return
			}
			if !isCode(d.err, wire.CodeFrameError) {
				t.Fatalf("Dial: %v, want PIPESTREAM_FRAME_ERROR", d.err)
			}
			if code := srv.closeCode(); code != wire.CodeFrameError {
				t.Errorf("connection closed with %#x, want 0x0D", code)
			}
		})
	}
}
