package quicpeer_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

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

// TestMaxConnections: a listener holds at most Limits.MaxConnections
// connections; one more is closed after the QUIC handshake with 0x01 and
// a reason naming the limit, and a slot that frees up is usable again.
func TestMaxConnections(t *testing.T) {
	sr := newRecorder()
	sr.closed = make(chan error, 8) // one HandleClose per server session
	sc := baseConfig(t, cborMode, sr, true)
	sc.Limits.MaxConnections = 2
	ln, err := quicpeer.Listen("127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dial := func() (*quicpeer.Session, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		return quicpeer.Dial(ctx, ln.Addr().String(), baseConfig(t, cborMode, newRecorder(), false))
	}
	var held []*quicpeer.Session
	for i := range 2 {
		s, err := dial()
		if err != nil {
			t.Fatalf("connection %d of 2: %v", i+1, err)
		}
		held = append(held, s)
	}
	defer func() {
		for _, s := range held {
			s.CloseWithError(wire.CodeNoError, "test done")
			<-s.Done()
		}
	}()
	_, err = dial()
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || !ae.Remote || wire.ErrorCode(ae.ErrorCode) != wire.CodeInternalError || !strings.Contains(ae.ErrorMessage, "MaxConnections") {
		t.Fatalf("third connection: %v, want a close with 0x01 naming Limits.MaxConnections", err)
	}

	held[0].CloseWithError(wire.CodeNoError, "making room")
	<-held[0].Done()
	held = held[1:]
	deadline := time.Now().Add(waitFor)
	for {
		s, err := dial()
		if err == nil {
			held = append(held, s)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection accepted after one of two closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
