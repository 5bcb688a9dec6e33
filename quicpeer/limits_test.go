package quicpeer_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestHeaderTimeout: an entity stream whose header does not arrive within
// Limits.HeaderTimeout (one octet and then nothing: slowloris) is stopped
// with 0x05 and the connection lives on; a header that arrived in time is
// not subject to it however slowly the payload follows.
func TestHeaderTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	sr := newRecorder()
	sc := baseConfig(t, cborMode, sr, true)
	sc.Limits.HeaderTimeout = timeout
	ln, err := quicpeer.Listen("127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), defaultCaps())

	st, err := raw.conn.OpenUniStream()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st.Write([]byte{0}) // the first octet of Header Length; no FIN
	select {
	case <-st.Context().Done():
	case <-time.After(waitFor):
		t.Fatal("a stream stuck inside its entity header was not stopped")
	}
	if err := context.Cause(st.Context()); !isStreamCode(err, wire.CodeEntityInvalid) {
		t.Fatalf("stream ended with %v, want STOP_SENDING 0x05", err)
	}
	if d := time.Since(start); d < timeout {
		t.Fatalf("stream stopped after %v, before the header timeout %v", d, timeout)
	}

	// Header in time, payload after more than the header timeout.
	payload := []byte("slow but honest")
	sum := sha256.Sum256(payload)
	h := &wire.EntityHeader{EntityID: 1, PayloadLength: uint64(len(payload)), Checksum: sum[:]}
	st2, err := raw.conn.OpenUniStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.WriteEntityHeader(st2, wire.CodecFor(wire.FormatCBOR), h); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout)
	st2.Write(payload)
	st2.Close()
	e := recv(t, sr.entities, "the entity whose payload came after the header timeout")
	if e.err != nil || e.sum != sum {
		t.Fatalf("entity read: %v (sum %x), want the payload intact", e.err, e.sum)
	}
}
