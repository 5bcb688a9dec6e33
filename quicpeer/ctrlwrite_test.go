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

// A peer that stops reading stream 0 (issue 21): its flow-control window
// fills, and the next stream-0 write waits for credit that never comes.
// Limits.ControlWriteTimeout bounds that wait: SendStatus returns an
// error instead of blocking its caller forever, and the session ends with
// PIPESTREAM_IDLE_TIMEOUT (a partly written frame cannot be taken back).
func TestControlWriteDeadline(t *testing.T) {
	// The raw server grants stream 0 only 1 KiB of flow-control credit and
	// never reads past CAPABILITIES.
	addr, accept := listenRawConfig(t, &quic.Config{MaxIdleTimeout: waitFor,
		InitialStreamReceiveWindow: 1 << 10, MaxStreamReceiveWindow: 1 << 10})
	cr := newRecorder()
	cfg := baseConfig(t, cborMode, cr, false)
	cfg.Limits.ControlWriteTimeout = 200 * time.Millisecond
	done := make(chan *quicpeer.Session, 1)
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
	// 16-octet STATUS frames: 1 KiB of credit takes at most 64 of them.
	// Each write either completes or, once the window is full, fails
	// after the deadline; 1000 frames without an error would mean the
	// writes are not bounded (they would block first, and the test's
	// own timeout would end it).
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i := 0; i < 1000 && err == nil; i++ {
		var id uint32
		if id, err = s.AssignID(ctx); err == nil {
			err = s.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: id})
		}
	}
	if err == nil {
		t.Fatal("1000 STATUS frames were written to a peer that reads none past CAPABILITIES with 1 KiB of credit")
	}
	if code := wire.CodeOf(err); code != wire.CodeIdleTimeout {
		t.Fatalf("SendStatus to a peer that stopped reading stream 0: %v (code %v), want PIPESTREAM_IDLE_TIMEOUT", err, code)
	}
	if got := raw.closeCode(); got != wire.CodeIdleTimeout {
		t.Fatalf("client closed with %v, want PIPESTREAM_IDLE_TIMEOUT (0x02)", got)
	}
	<-s.Done()
	var ce *quicpeer.CloseError
	if cerr := recv(t, cr.closed, "HandleClose"); !errors.As(cerr, &ce) || ce.Code != wire.CodeIdleTimeout {
		t.Fatalf("HandleClose got %v, want a CloseError with PIPESTREAM_IDLE_TIMEOUT", cerr)
	}
}
