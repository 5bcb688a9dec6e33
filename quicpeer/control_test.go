package quicpeer_test

import (
	"context"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func frames(fs ...[]byte) []byte {
	var b []byte
	for _, f := range fs {
		b = append(b, f...)
	}
	return b
}

func st(s wire.Status, id, scope uint32, depth uint8) []byte {
	f := wire.StatusFrame{Status: s, EntityID: id, ScopeID: scope, Depth: depth}
	return f.Append(nil)
}

// Protocol violations on stream 0 close the connection with the draft's
// code (Section 6.1, 6.2.3, 6.3, 6.5, 11.2.1; docs/profile.md 3). The
// server session is the receiver; a raw quic-go client writes the bytes.
func TestControlStreamViolations(t *testing.T) {
	l1 := &wire.Capabilities{Layer0Core: true, Layer1Recursive: true, MaxScopeDepth: u64(3)}
	digest := func(scope uint32) []byte { f := wire.ScopeDigestFrame{ScopeID: scope}; return f.Append(nil) }
	barrier := func(scope uint32) []byte {
		f := wire.BarrierFrame{ScopeID: scope, ParentEntityID: 1}
		return f.Append(nil)
	}
	goaway := func(last uint32) []byte { f := wire.GoAwayFrame{LastEntityID: last}; return f.Append(nil) }
	cases := []struct {
		name    string
		caps    *wire.Capabilities // nil: Layer 0
		server1 bool               // server offers Layer 1
		bytes   []byte
		want    wire.ErrorCode
	}{
		{"unknown fixed frame type", nil, false, []byte{0x57, 0, 0, 0}, wire.CodeEntityInvalid},
		{"variable length over 16 MiB-1", nil, false, []byte{0x81, 0x01, 0x00, 0x00, 0x00}, wire.CodeEntityTooLarge},
		{"invalid transition", nil, false, frames(st(wire.StatusProcessing, 1, 0, 0), st(wire.StatusPending, 1, 0, 0)), wire.CodeEntityInvalid},
		{"transition after terminal", nil, false, frames(st(wire.StatusProcessing, 1, 0, 0), st(wire.StatusComplete, 1, 0, 0), st(wire.StatusProcessing, 1, 0, 0)), wire.CodeEntityInvalid},
		{"UNSPECIFIED for an entity", nil, false, st(wire.StatusUnspecified, 3, 0, 0), wire.CodeEntityInvalid},
		{"entity 0", nil, false, st(wire.StatusProcessing, 0, 0, 0), wire.CodeEntityInvalid},
		{"layer 2 status on layer 0", nil, false, frames(st(wire.StatusProcessing, 1, 0, 0), st(wire.StatusSkipped, 1, 0, 0)), wire.CodeLayerUnsupported},
		{"scope without layer 1", nil, false, st(wire.StatusProcessing, 1, 9, 1), wire.CodeLayerUnsupported},
		{"depth without layer 1", nil, false, st(wire.StatusProcessing, 1, 0, 1), wire.CodeLayerUnsupported},
		{"depth above negotiated max", l1, true, st(wire.StatusProcessing, 1, 9, 4), wire.CodeDepthExceeded},
		{"depth at negotiated max is fine, then violation", l1, true, frames(st(wire.StatusProcessing, 1, 9, 3), []byte{0x60}), wire.CodeEntityInvalid},
		{"SCOPE_DIGEST without layer 1", nil, false, digest(7), wire.CodeLayerUnsupported},
		{"SCOPE_DIGEST for root scope", l1, true, digest(0), wire.CodeScopeInvalid},
		{"BARRIER for root scope", l1, true, barrier(0), wire.CodeScopeInvalid},
		{"GOAWAY last increases", nil, false, frames(goaway(5), goaway(6)), wire.CodeEntityInvalid},
		{"CHECKPOINT scope without layer 1", nil, false, checkpointFrame(t, &wire.CheckpointFrame{CheckpointID: "c", CheckpointEntityID: 3, ScopeID: u32(7)}), wire.CodeLayerUnsupported},
		{"stream ends inside a frame", nil, false, []byte{0x50, 0x10}, wire.CodeEntityInvalid},
		{"unsupported STATUS version", nil, false, []byte{0x50, 0x22, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, wire.CodeLayerUnsupported},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sr := newRecorder()
			cfg := baseConfig(t, cborMode, sr, true)
			cfg.Offer.Layer1Recursive = tc.server1
			ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			caps := tc.caps
			if caps == nil {
				caps = defaultCaps()
			}
			raw := dialRaw(t, ln.Addr().String(), caps)
			raw.write(tc.bytes)
			if tc.name == "stream ends inside a frame" {
				raw.ctrl.Close()
			}
			if got := raw.closeCode(); got != tc.want {
				t.Fatalf("closed with %v, want %v", got, tc.want)
			}
			// (A session that ended before Accept is never handed out.)
			if err := recv(t, sr.closed, "HandleClose"); codeOf(err) != tc.want {
				t.Fatalf("HandleClose(%v), want code %v", err, tc.want)
			}
		})
	}
}

func checkpointFrame(t testing.TB, f *wire.CheckpointFrame) []byte {
	body, err := wire.CodecFor(wire.FormatCBOR).MarshalCheckpoint(f)
	if err != nil {
		t.Fatal(err)
	}
	return wire.AppendVariable(nil, wire.FrameCheckpoint, body)
}

// The client role validates the same way (a raw quic-go server sends).
func TestClientClosesOnUnknownFixedFrame(t *testing.T) {
	addr, accept := listenRaw(t)
	cr := newRecorder()
	done := make(chan *quicpeer.Session, 1)
	cfg := baseConfig(t, cborMode, cr, false)
	go func() {
		s, err := quicpeer.Dial(context.Background(), addr, cfg)
		if err != nil {
			t.Error(err)
		}
		done <- s
	}()
	raw := accept()
	if _, err := raw.cr.Next(); err != nil {
		t.Fatal(err)
	}
	raw.write(capsFrame(t, defaultCaps()))
	s := recv(t, done, "Dial")
	if s == nil {
		return
	}
	raw.write([]byte{0x7F})
	if got := raw.closeCode(); got != wire.CodeEntityInvalid {
		t.Fatalf("client closed with %v, want 0x05", got)
	}
	<-s.Done()
	recv(t, cr.closed, "HandleClose")
}

// Section 5.3: a reset or closed stream 0 closes with PIPESTREAM_CONTROL_RESET.
func TestControlStreamResetOrClosed(t *testing.T) {
	for _, reset := range []bool{true, false} {
		name := "FIN"
		if reset {
			name = "RESET_STREAM"
		}
		t.Run(name, func(t *testing.T) {
			ln, err := quicpeer.Listen("127.0.0.1:0", baseConfig(t, cborMode, newRecorder(), true))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw := dialRaw(t, ln.Addr().String(), defaultCaps())
			if reset {
				raw.ctrl.CancelWrite(0)
			} else {
				raw.ctrl.Close()
			}
			if got := raw.closeCode(); got != wire.CodeControlReset {
				t.Fatalf("closed with %v, want PIPESTREAM_CONTROL_RESET", got)
			}
		})
	}
}

// Section 6.5.1: after sending GOAWAY, an entity above Last Entity ID is
// rejected with 0x05 (and reported FAILED on stream 0).
func TestEntityAboveGoAwayRejected(t *testing.T) {
	sr := newRecorder()
	ln, err := quicpeer.Listen("127.0.0.1:0", baseConfig(t, cborMode, sr, true))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), defaultCaps())
	raw.sendEntity(&wire.EntityHeader{EntityID: 1, PayloadLength: 3}, []byte("abc"))
	s, err := ln.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, sr.entities, "entity 1"); got.err != nil {
		t.Fatal(got.err)
	}
	gctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.GoAway(gctx)
	for {
		f, err := raw.cr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if f.Type == wire.FrameGoAway {
			if f.GoAway.LastEntityID != 1 {
				t.Fatalf("GOAWAY Last %d, want 1 (highest root ID seen)", f.GoAway.LastEntityID)
			}
			break
		}
	}
	str := raw.sendEntity(&wire.EntityHeader{EntityID: 2, PayloadLength: 0}, nil)
	_ = str
	if f := raw.nextStatus(); f.EntityID != 2 || f.Status != wire.StatusFailed {
		t.Fatalf("got %+v, want FAILED for entity 2", f)
	}
	select {
	case e := <-sr.entities:
		t.Fatalf("handler got entity %d above GOAWAY", e.h.EntityID)
	case <-time.After(50 * time.Millisecond):
	}
	// Entity 1 still drains: once it is terminal the server closes with 0x00.
	raw.status(wire.StatusFrame{Status: wire.StatusFailed, EntityID: 1})
	if got := raw.closeCode(); got != wire.CodeNoError {
		t.Fatalf("closed with %v, want PIPESTREAM_NO_ERROR after drain", got)
	}
}
