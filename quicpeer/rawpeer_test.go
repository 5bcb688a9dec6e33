package quicpeer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// rawPeer is a hand-driven PipeStream endpoint on plain quic-go, used to put
// bytes on the wire that a correct session never sends.
type rawPeer struct {
	t    *testing.T
	conn *quic.Conn
	ctrl *quic.Stream
	cr   *wire.ControlReader
}

func capsFrame(t testing.TB, c *wire.Capabilities) []byte {
	body, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(c)
	if err != nil {
		t.Fatal(err)
	}
	return wire.AppendVariable(nil, wire.FrameCapabilities, body)
}

// dialRaw connects to a quicpeer Listener and opens stream 0. With caps
// non-nil it completes the capability exchange.
func dialRaw(t *testing.T, addr string, caps *wire.Capabilities) *rawPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := quic.DialAddr(ctx, addr, clientTLS(t), &quic.Config{MaxIdleTimeout: waitFor})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	ctrl, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t, conn: conn, ctrl: ctrl, cr: wire.NewControlReader(ctrl, 0)}
	if caps != nil {
		p.write(capsFrame(t, caps))
		f, err := p.cr.Next()
		if err != nil || f.Type != wire.FrameCapabilities {
			t.Fatalf("raw client: server CAPABILITIES: %v (type %#x)", err, f.Type)
		}
	}
	return p
}

// listenRaw accepts one connection from a quicpeer client; the returned
// function waits for it and its stream 0.
func listenRaw(t *testing.T) (addr string, accept func() *rawPeer) {
	t.Helper()
	return listenRawConfig(t, &quic.Config{MaxIdleTimeout: waitFor})
}

// listenRawConfig is listenRaw with the listener's QUIC configuration.
func listenRawConfig(t *testing.T, qc *quic.Config) (addr string, accept func() *rawPeer) {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", serverTLS(t), qc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), func() *rawPeer {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		conn, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.CloseWithError(0, "") })
		ctrl, err := conn.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &rawPeer{t: t, conn: conn, ctrl: ctrl, cr: wire.NewControlReader(ctrl, 0)}
	}
}

func (p *rawPeer) write(b []byte) {
	p.t.Helper()
	if _, err := p.ctrl.Write(b); err != nil {
		p.t.Fatalf("raw peer write: %v", err)
	}
}

func (p *rawPeer) status(f wire.StatusFrame) { p.write(f.Append(nil)) }

// closeCode waits for the connection to be closed by the other side and
// returns the application error code it carried.
func (p *rawPeer) closeCode() wire.ErrorCode {
	p.t.Helper()
	select {
	case <-p.conn.Context().Done():
	case <-time.After(waitFor):
		p.t.Fatal("connection was not closed")
	}
	var ae *quic.ApplicationError
	if err := context.Cause(p.conn.Context()); !errors.As(err, &ae) || !ae.Remote {
		p.t.Fatalf("connection ended with %v, want a CONNECTION_CLOSE from the peer", err)
	}
	return wire.ErrorCode(ae.ErrorCode)
}

// nextStatus reads stream 0 until a non-connection-level STATUS.
func (p *rawPeer) nextStatus() wire.StatusFrame {
	p.t.Helper()
	for {
		f, err := p.cr.Next()
		if err != nil {
			p.t.Fatalf("raw peer read: %v", err)
		}
		if f.Type == wire.FrameStatus && f.Status.EntityID != wire.ConnectionEntity {
			return f.Status
		}
	}
}

// sendEntity writes an entity stream by hand.
func (p *rawPeer) sendEntity(h *wire.EntityHeader, payload []byte) *quic.SendStream {
	p.t.Helper()
	st, err := p.conn.OpenUniStream()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := wire.WriteEntityHeader(st, wire.CodecFor(wire.FormatCBOR), h); err != nil {
		p.t.Fatal(err)
	}
	st.Write(payload)
	st.Close()
	return st
}

func defaultCaps() *wire.Capabilities { return &wire.Capabilities{Layer0Core: true} }

var _ = quicpeer.ALPN
