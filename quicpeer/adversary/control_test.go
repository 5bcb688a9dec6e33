package adversary_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Stream-0 attacks: each closes the adversary's connection with the
// draft's code, and a well-behaved session completes a document right
// after, on the same peer.

func u64(v uint64) *uint64 { return &v }

// statusBytes is a STATUS frame (Section 6.2.1) with a raw status nibble
// and depth, bypassing every local check.
func statusBytes(status, depth uint8, entity, scope uint32) []byte {
	return []byte{byte(wire.FrameStatus), wire.Version<<4 | status&0x0F, (depth & 7) << 3, 0,
		byte(entity >> 24), byte(entity >> 16), byte(entity >> 8), byte(entity),
		byte(scope >> 24), byte(scope >> 16), byte(scope >> 8), byte(scope),
		0, 0, 0, 0}
}

func TestControlStreamAttacks(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	// The flags octet's depth bits: check the layout this file assumes
	// against the codec, so a wrong test frame cannot pass for a refusal.
	want := (&wire.StatusFrame{Status: wire.StatusProcessing, Depth: 3, EntityID: 5, ScopeID: 9}).Append(nil)
	if got := statusBytes(uint8(wire.StatusProcessing), 3, 5, 9); string(got) != string(want) {
		t.Fatalf("test STATUS encoding % x, codec % x", got, want)
	}

	cases := []struct {
		name  string
		caps  *wire.Capabilities
		frame []byte
		fin   bool // close stream 0 (FIN) after the bytes
		code  wire.ErrorCode
	}{
		// Unknown fixed frame types (0x50-0x7F without a definition) cannot
		// be skipped: their length is unknown (Section 6.1).
		{"unknown fixed type 0x60", allLayers(), append([]byte{0x60}, make([]byte, 15)...), false, wire.CodeEntityInvalid},
		{"unknown fixed type 0x7F", allLayers(), append([]byte{0x7F}, make([]byte, 15)...), false, wire.CodeEntityInvalid},
		// A variable frame announcing 16 MiB (one above the 24-bit maximum):
		// refused before a byte of its body is buffered.
		{"variable length 16MiB", allLayers(), []byte{0x81, 0x01, 0x00, 0x00, 0x00}, false, wire.CodeEntityTooLarge},
		{"variable length 4GiB-1", allLayers(), []byte{0x9F, 0xFF, 0xFF, 0xFF, 0xFF}, false, wire.CodeEntityTooLarge},
		// Truncated frames, then FIN on stream 0: the stream ended inside a
		// frame.
		{"truncated STATUS then FIN", allLayers(), statusBytes(2, 0, 1, 0)[:9], true, wire.CodeEntityInvalid},
		{"truncated CHECKPOINT then FIN", allLayers(), []byte{0x81, 0, 0, 0, 40, 0xA1}, true, wire.CodeEntityInvalid},
		// Invalid transitions: PENDING -> COMPLETE, and a status for an
		// entity the client never sent that skips PROCESSING.
		{"transition PENDING->COMPLETE", allLayers(), statusBytes(uint8(wire.StatusComplete), 0, 1, 0), false, wire.CodeEntityInvalid},
		{"transition PENDING->REHYDRATING", allLayers(), statusBytes(uint8(wire.StatusRehydrating), 0, 2, 0), false, wire.CodeEntityInvalid},
		// Entity 0 is NULL_ENTITY (Section 9.1).
		{"entity 0", allLayers(), statusBytes(uint8(wire.StatusProcessing), 0, 0, 0), false, wire.CodeEntityInvalid},
		// UNSPECIFIED for a real entity.
		{"UNSPECIFIED for entity 1", allLayers(), statusBytes(0, 0, 1, 0), false, wire.CodeEntityInvalid},
		// Layer 2 status without Layer 2.
		{"RETRYING without Layer 2", &wire.Capabilities{Layer0Core: true}, statusBytes(uint8(wire.StatusRetrying), 0, 1, 0), false, wire.CodeLayerUnsupported},
		// A scope without Layer 1.
		{"scope without Layer 1", &wire.Capabilities{Layer0Core: true}, statusBytes(uint8(wire.StatusProcessing), 0, 1, 7), false, wire.CodeLayerUnsupported},
	}
	// Unregistered status codes 0xD-0xF (Section 6.2.2): 0x05.
	for s := uint8(0xD); s <= 0xF; s++ {
		cases = append(cases, struct {
			name  string
			caps  *wire.Capabilities
			frame []byte
			fin   bool
			code  wire.ErrorCode
		}{fmt.Sprintf("status code 0x%X", s), allLayers(), statusBytes(s, 0, 1, 0), false, wire.CodeEntityInvalid})
	}
	// Depth bombs: with max-scope-depth 3 negotiated, depths 4-7 are
	// refused with PIPESTREAM_DEPTH_EXCEEDED (Section 10.3).
	for d := uint8(4); d <= 7; d++ {
		caps := allLayers()
		caps.MaxScopeDepth = u64(3)
		cases = append(cases, struct {
			name  string
			caps  *wire.Capabilities
			frame []byte
			fin   bool
			code  wire.ErrorCode
		}{fmt.Sprintf("depth %d over negotiated 3", d), caps, statusBytes(uint8(wire.StatusPending), d, 1, 1), false, wire.CodeDepthExceeded})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := dialRaw(t, tg, c.caps)
			r.write(c.frame)
			if c.fin {
				if err := r.ctrl.Close(); err != nil {
					t.Fatal(err)
				}
			}
			r.wantClose(c.name, c.code)
			completeDocument(t, tg, "after "+c.name)
		})
	}
}

// TestDepthBombDuringTraffic: a depth bomb on one connection while a
// well-behaved session's document is in flight on another.
func TestDepthBombDuringTraffic(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	g := dialGood(t, tg)
	content := make([]byte, 1<<20)
	for i := range content {
		content[i] = byte('a' + i%26)
	}
	id := g.send(t, content, nil)
	caps := allLayers()
	caps.MaxScopeDepth = u64(1)
	r := dialRaw(t, tg, caps)
	// Nested scopes: PENDING announced ever deeper, then past the limit.
	r.write(statusBytes(uint8(wire.StatusPending), 1, 1, 1))
	r.write(statusBytes(uint8(wire.StatusPending), 2, 2, 2))
	r.wantClose("nested scope at depth 2 over negotiated 1", wire.CodeDepthExceeded)
	g.waitFor(t, "the in-flight document to complete", func() bool {
		f, ok := g.last(id)
		return ok && f.Status == wire.StatusComplete && g.results[id] != nil
	})
	if string(g.results[id]) != string(content) {
		t.Errorf("in-flight document result differs (%d bytes, want %d)", len(g.results[id]), len(content))
	}
}

// TestHandshakeAttacks: before the capability exchange, an oversized
// CAPABILITIES or a STATUS first are refused.
func TestHandshakeAttacks(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	t.Run("STATUS before CAPABILITIES", func(t *testing.T) {
		r := dialRaw(t, tg, nil)
		r.write(statusBytes(uint8(wire.StatusProcessing), 0, 1, 0))
		if code := r.closeCode(); code == wire.CodeNoError {
			t.Errorf("STATUS before CAPABILITIES: closed with %s, want an error code", code)
		}
		completeDocument(t, tg, "after STATUS first")
	})
	// A declared length above the 4 KiB CAPABILITIES cap must be refused
	// from the length alone, before the body is buffered (Section 10.3:
	// no allocation from a length the peer sent), and well before the
	// 10 s handshake timeout.
	t.Run("CAPABILITIES declaring 1 MiB", func(t *testing.T) {
		r := dialRaw(t, tg, nil)
		start := time.Now()
		r.write([]byte{0x80, 0x00, 0x10, 0x00, 0x00})
		select {
		case <-r.conn.Context().Done():
			if code := r.closeCode(); code == wire.CodeNoError {
				t.Errorf("1 MiB CAPABILITIES: closed with %s after %v, want an error code", code, time.Since(start).Round(time.Millisecond))
			}
		case <-time.After(3 * time.Second):
			t.Errorf("a CAPABILITIES frame declaring 1 MiB (cap 4 KiB) is not refused from its length: the session still waits for the body after 3 s (the peer buffers up to 16 MiB per handshaking connection until the handshake timeout)")
			r.conn.CloseWithError(0, "")
		}
		completeDocument(t, tg, "after oversized CAPABILITIES")
	})
}
