package quicpeer_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Draft-04 framing and the reference's Layer 0 conversation
// (docs/profile.md 1.2), checked octet for octet against the frozen
// vectors of the reference suite.

func vec(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("wire", "testdata", "vectors", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cborKeys returns the sorted keys of a CBOR map.
func cborKeys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]cbor.RawMessage
	if err := cbor.Unmarshal(b, &m); err != nil {
		t.Fatalf("CBOR map: %v", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var layer0CapKeys = []string{"keepalive-timeout-ms", "layer0-core", "layer1-recursive", "layer2-resilience", "max-window-size", "serialization-format"}

// readExact reads len(want) octets from r and compares them with want.
func readExact(t *testing.T, r io.Reader, want []byte, what string) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s:\n got %x\nwant %x", what, got, want)
	}
}

// A client with FramingDraft04 runs the reference client's conversation:
// six-member CAPABILITIES, a heartbeat, PENDING before the entity stream, a
// six-member entity header, the cursor update, GOAWAY, and a graceful end
// when the server echoes GOAWAY and finishes stream 0.
// Under FramingAuto the client offers the same six members (nothing is lost
// with default limits), so a first contact with a draft-04 peer succeeds,
// and it detects draft-04 from the server's heartbeat before Dial returns.
func TestDraft04ClientConversation(t *testing.T) {
	for _, mode := range []quicpeer.Framing{quicpeer.FramingDraft04, quicpeer.FramingAuto} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) { draft04ClientConversation(t, mode) })
	}
}

func draft04ClientConversation(t *testing.T, mode quicpeer.Framing) {
	addr, accept := listenRaw(t)
	cr := newRecorder()
	cfg := baseConfig(t, cborMode, cr, false)
	cfg.Framing = mode
	cfg.Profile = true // offered by ALPN only; the reference server selects pipestream/1
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
	srv.cr.SetFraming(wire.FramingDraft04, false)
	f, err := srv.cr.Next()
	if err != nil || f.Type != wire.FrameCapabilities {
		t.Fatalf("client's first frame: %v %v", f.Type, err)
	}
	if keys := cborKeys(t, f.Body); !slices.Equal(keys, layer0CapKeys) {
		t.Fatalf("client CAPABILITIES keys %v, want exactly %v", keys, layer0CapKeys)
	}
	srv.write(vec(t, "control-cbor/valid-capabilities-default.bin"))
	srv.write(vec(t, "draft04-fixed-frames/valid-status-heartbeat.bin"))
	d := recv(t, dc, "dial")
	if d.err != nil {
		t.Fatal(d.err)
	}
	c := d.s
	if c.Framing() != wire.FramingDraft04 || c.Negotiated().Profile {
		t.Fatalf("framing %v profile %v", c.Framing(), c.Negotiated().Profile)
	}
	readExact(t, srv.ctrl, vec(t, "draft04-fixed-frames/valid-status-heartbeat.bin"), "client heartbeat after CAPABILITIES")

	ctx := context.Background()
	id, err := c.AssignID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("PipeStream Layer 0\n")
	h := header(id, int64(len(payload)), 1)
	h.ContentType = "text/plain; charset=utf-8"
	h.Checksum = nil
	withMeta := *h
	withMeta.Metadata = map[string]string{"k": "v"}
	if err := c.SendEntity(ctx, &withMeta, bytes.NewReader(payload)); codeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("metadata on a draft-04 entity: %v, want a local 0x05 refusal", err)
	}
	go func() {
		if err := c.SendEntity(ctx, h, bytes.NewReader(payload)); err != nil {
			t.Errorf("SendEntity: %v", err)
		}
	}()
	pend := wire.StatusFrame{Status: wire.StatusPending, EntityID: id}
	readExact(t, srv.ctrl, wire.AppendDraft04(nil, pend.Append(nil)), "STATUS PENDING before the entity stream")
	st, err := srv.conn.AcceptUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(st)
	if err != nil {
		t.Fatal(err)
	}
	hl := int(raw[0])<<24 | int(raw[1])<<16 | int(raw[2])<<8 | int(raw[3])
	if keys := cborKeys(t, raw[4:4+hl]); !slices.Equal(keys, []string{"content-type", "entity-id", "layer", "payload-length"}) {
		t.Fatalf("entity header keys %v", keys)
	}
	if !bytes.Equal(raw[4+hl:], payload) {
		t.Fatalf("payload %q", raw[4+hl:])
	}
	for _, s := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
		sf := status(s, id)
		srv.write(wire.AppendDraft04(nil, sf.Append(nil)))
		if got := nextStatus(t, cr); got.EntityID != id || got.Status != s {
			t.Fatalf("client got %+v, want %v", got, s)
		}
	}
	cur := wire.StatusFrame{Status: wire.StatusUnspecified, EntityID: wire.ConnectionEntity, HasCursor: true, Cursor: id + 1}
	readExact(t, srv.ctrl, wire.AppendDraft04(nil, cur.Append(nil)), "connection-level cursor update")

	done := make(chan error, 1)
	go func() { done <- c.GoAway(ctx) }()
	gw := wire.GoAwayFrame{LastEntityID: id}
	readExact(t, srv.ctrl, wire.AppendDraft04(nil, gw.Append(nil)), "GOAWAY")
	srv.write(wire.AppendDraft04(nil, gw.Append(nil)))
	if err := srv.ctrl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, done, "GoAway"); err != nil {
		t.Fatalf("GoAway: %v, want a graceful end", err)
	}
	if err := recv(t, cr.closed, "close"); err != nil {
		t.Fatalf("session ended with %v, want nil", err)
	}
}

// A server in FramingAuto detects a draft-04 client from its heartbeat and
// answers the reference client's conversation in draft-04, octet for octet
// the reference's vectors: six-member CAPABILITIES, heartbeat, PROCESSING,
// COMPLETE, the CHECKPOINT acknowledgement and the GOAWAY echo.
func TestDraft04ServerAnswersReferenceClient(t *testing.T) {
	sr := newRecorder()
	sr.setOnEntity(func(s *quicpeer.Session, e *quicpeer.IncomingEntity) {
		if _, err := io.Copy(io.Discard, e.Payload); err != nil {
			sr.entities <- entityResult{err: err}
			return
		}
		_ = s.SendStatus(status(wire.StatusProcessing, e.Header.EntityID))
		_ = s.SendStatus(status(wire.StatusComplete, e.Header.EntityID))
		sr.entities <- entityResult{h: e.Header}
	})
	cfg := baseConfig(t, cborMode, sr, true)
	cfg.Offer.Layer1Recursive, cfg.Offer.Layer2Resilience = true, true
	cfg.Profile = true
	ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := quic.DialAddr(ctx, ln.Addr().String(), clientTLS(t), &quic.Config{MaxIdleTimeout: waitFor})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t, conn: conn, ctrl: ctrl, cr: wire.NewControlReader(ctrl, 0)}
	p.cr.SetFraming(wire.FramingDraft04, false)
	p.write(vec(t, "control-cbor/valid-capabilities-default.bin"))
	f, err := p.cr.Next()
	if err != nil || f.Type != wire.FrameCapabilities {
		t.Fatalf("server CAPABILITIES: %v %v", f.Type, err)
	}
	if keys := cborKeys(t, f.Body); !slices.Equal(keys, layer0CapKeys) {
		t.Fatalf("server CAPABILITIES keys %v, want exactly %v", keys, layer0CapKeys)
	}
	p.write(vec(t, "draft04-fixed-frames/valid-status-heartbeat.bin"))
	p.write(vec(t, "draft04-fixed-frames/valid-status-pending.bin"))
	readExact(t, ctrl, vec(t, "draft04-fixed-frames/valid-status-heartbeat.bin"), "server heartbeat")
	st, err := conn.OpenUniStream()
	if err != nil {
		t.Fatal(err)
	}
	st.Write(vec(t, "entity/valid-entity-text.bin"))
	st.Close()
	if got := recv(t, sr.entities, "entity"); got.err != nil || got.h.EntityID != 7 {
		t.Fatalf("entity %+v", got)
	}
	readExact(t, ctrl, vec(t, "draft04-fixed-frames/valid-status-processing.bin"), "PROCESSING")
	readExact(t, ctrl, vec(t, "draft04-fixed-frames/valid-status-complete.bin"), "COMPLETE")
	p.write(vec(t, "control-cbor/valid-checkpoint-request.bin"))
	readExact(t, ctrl, vec(t, "control-cbor/valid-checkpoint-ack.bin"), "CHECKPOINT acknowledgement")
	p.write(vec(t, "draft04-fixed-frames/valid-status-cursor.bin"))
	p.write(vec(t, "draft04-fixed-frames/valid-goaway.bin"))
	readExact(t, ctrl, vec(t, "draft04-fixed-frames/valid-goaway.bin"), "GOAWAY echo")
	ctrl.Close()
	conn.CloseWithError(0, "complete")
	if err := recv(t, sr.closed, "server close"); err != nil {
		t.Fatalf("server session ended with %v, want nil", err)
	}
}

// Two auto endpoints settle on draft-02 during the handshake; the profile
// is negotiated (ALPN) only when both offer it.
func TestAutoFramingAndProfileDiscovery(t *testing.T) {
	for _, tc := range []struct {
		name           string
		client, server bool
		want           bool
	}{
		{"both", true, true, true},
		{"client only", true, false, false},
		{"server only", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := func(c, s *quicpeer.Config) {
				c.Profile, s.Profile = tc.client, tc.server
			}
			p := newPair(t, cborMode, opt)
			if p.client.Negotiated().Profile != tc.want || p.server.Negotiated().Profile != tc.want {
				t.Fatalf("profile client %v server %v, want %v", p.client.Negotiated().Profile, p.server.Negotiated().Profile, tc.want)
			}
			if p.client.Framing() != wire.FramingDraft02 {
				t.Fatalf("client framing %v right after Dial, want draft-02 (settled by the server's heartbeat)", p.client.Framing())
			}
			ctx := context.Background()
			id, _ := p.client.AssignID(ctx)
			if err := p.client.SendEntity(ctx, header(id, 10, 1), newGen(10, 1)); err != nil {
				t.Fatal(err)
			}
			recv(t, p.sr.entities, "entity")
			if err := p.server.SendStatus(status(wire.StatusProcessing, id)); err != nil {
				t.Fatal(err)
			}
			if got := nextStatus(t, p.cr); got.EntityID != id {
				t.Fatalf("client got %+v", got)
			}
			if p.client.Framing() != wire.FramingDraft02 || p.server.Framing() != wire.FramingDraft02 {
				t.Fatalf("framing client %v server %v", p.client.Framing(), p.server.Framing())
			}
		})
	}
}
