package quicpeer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestEntityScopeWithoutLayer1: Section 6.2.3 and 9.4, scopes other than the
// root scope exist only with Layer 1 (a receiver at Layer 0 treats Layer 1
// constructs as PIPESTREAM_LAYER_UNSUPPORTED, docs/profile.md 3). An
// entity stream whose header names scope 5 on a Layer 0 connection closes
// the connection with 0x0C; a local SendEntity with a scope is refused with
// the same code before a stream is opened.
func TestEntityScopeWithoutLayer1(t *testing.T) {
	t.Run("received", func(t *testing.T) {
		sr := newRecorder()
		ln, err := quicpeer.Listen("127.0.0.1:0", baseConfig(t, cborMode, sr, true))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		raw := dialRaw(t, ln.Addr().String(), defaultCaps())
		scope := uint32(5)
		payload := []byte("scoped")
		sum := sumOf(payload)
		raw.sendEntity(&wire.EntityHeader{EntityID: 1, ScopeID: &scope, PayloadLength: uint64(len(payload)), Checksum: sum}, payload)
		if got := raw.closeCode(); got != wire.CodeLayerUnsupported {
			t.Fatalf("closed with %v, want %v", got, wire.CodeLayerUnsupported)
		}
		if err := recv(t, sr.closed, "HandleClose"); codeOf(err) != wire.CodeLayerUnsupported {
			t.Fatalf("HandleClose(%v), want code %v", err, wire.CodeLayerUnsupported)
		}
	})
	t.Run("sent", func(t *testing.T) {
		p := newPair(t, cborMode)
		if p.client.Negotiated().Layer1 {
			t.Fatal("Layer 1 negotiated; the test needs Layer 0")
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		id, err := p.client.AssignID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		scope := uint32(5)
		payload := []byte("scoped")
		h := &wire.EntityHeader{EntityID: id, ScopeID: &scope, PayloadLength: uint64(len(payload)), Checksum: sumOf(payload)}
		err = p.client.SendEntity(ctx, h, bytes.NewReader(payload))
		if codeOf(err) != wire.CodeLayerUnsupported {
			t.Fatalf("SendEntity in scope 5 at Layer 0: %v, want code %v", err, wire.CodeLayerUnsupported)
		}
	})
}

func sumOf(b []byte) []byte { s := sha256.Sum256(b); return s[:] }
