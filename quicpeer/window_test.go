package quicpeer_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// sessionWindowGrace is the session's windowGrace (params.go): how long a
// window excess is tolerated before the connection is closed.
const sessionWindowGrace = 2 * time.Second

// windowGraceForTests is longer than sessionWindowGrace: a session that
// records a debt for a client within its window would close it by then.
// Only the "not closed" checks wait this long; they cannot fail on a slow
// machine (a slow machine only delays a wrong close past the check).
const windowGraceForTests = 2500 * time.Millisecond

// A client that opens more unresolved root entities than the window
// (max-window 4: entities 1-6, none resolved) is closed with
// PIPESTREAM_WINDOW_EXCEEDED (0x08) (Section 9.1, 10.3), not before the
// grace a client's in-flight terminals get; a client at the window
// (entities 1-4) is not. The close is awaited as an event (with the
// helpers' deadline), not against a wall-clock margin.
func TestWindowEnforcedOnReceive(t *testing.T) {
	sr := newRecorder()
	cfg := baseConfig(t, cborMode, sr, true)
	cfg.Limits.MaxWindow = 4
	ln, err := quicpeer.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), defaultCaps())
	send := func(id uint32) {
		payload, _ := io.ReadAll(newGen(64, uint64(id)))
		raw.sendEntity(header(id, 64, uint64(id)), payload)
		if res := recv(t, sr.entities, "entity"); res.err != nil || res.h.EntityID != id {
			t.Fatalf("entity %d: received %d, err %v", id, res.h.EntityID, res.err)
		}
	}
	for id := uint32(1); id <= 4; id++ {
		send(id)
	}
	select {
	case <-raw.conn.Context().Done():
		t.Fatalf("4 unresolved root entities with max-window 4: connection closed (%v)", context.Cause(raw.conn.Context()))
	case <-time.After(windowGraceForTests):
	}
	// The debt is recorded when the server counts entity 5, after start:
	// its deadline, and so the close, is at least the grace after start.
	start := time.Now()
	send(5)
	send(6)
	if got := raw.closeCode(); got != wire.CodeWindowExceeded {
		t.Fatalf("6 unresolved root entities with max-window 4: closed with %v, want PIPESTREAM_WINDOW_EXCEEDED (0x08)", got)
	}
	if d := time.Since(start); d < sessionWindowGrace {
		t.Errorf("window excess refused %v after it began, before the %v grace for the client's in-flight terminals", d, sessionWindowGrace)
	} else {
		t.Logf("window excess refused %v after it began (grace %v)", d, sessionWindowGrace)
	}
}

// windowServer completes every third entity and leaves the rest to the
// client, which cancels them (ABANDONED); it records nothing.
type windowServer struct {
	closed chan error
}

func (windowServer) HandleStatus(*quicpeer.Session, wire.StatusFrame)           {}
func (windowServer) HandleScopeDigest(*quicpeer.Session, wire.ScopeDigestFrame) {}
func (windowServer) HandleBarrier(*quicpeer.Session, wire.BarrierFrame)         {}
func (windowServer) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame)  {}
func (windowServer) HandleGoAway(*quicpeer.Session, wire.GoAwayFrame)           {}
func (w windowServer) HandleClose(_ *quicpeer.Session, err error)               { w.closed <- err }
func (windowServer) HandleEntity(s *quicpeer.Session, e *quicpeer.IncomingEntity) {
	if _, err := io.Copy(io.Discard, e.Payload); err != nil {
		return
	}
	if id := e.Header.EntityID; id%3 == 0 {
		_ = s.SendStatus(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: id})
		_ = s.SendStatus(wire.StatusFrame{Status: wire.StatusComplete, EntityID: id})
	}
}

// A client that keeps its window full (max-window 4) and frees slots by
// cancelling (its own ABANDONED, which races the next entity stream that
// reuses the slot) is never refused: 1500 entities from 4 goroutines.
func TestWindowNoFalseExceedUnderCancels(t *testing.T) {
	const total = 1500
	srv := windowServer{closed: make(chan error, 1)}
	cli := windowServer{closed: make(chan error, 1)}
	client, server, _ := newPairWith(t, cborMode, cli, srv, layers(true, true), func(c, s *quicpeer.Config) {
		c.Limits.MaxWindow, s.Limits.MaxWindow = 4, 4
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for next.Add(1) <= total {
				id, err := client.AssignID(ctx)
				if err != nil {
					errc <- err
					return
				}
				if err := client.SendEntity(ctx, header(id, 256, uint64(id)), newGen(256, uint64(id))); err != nil {
					errc <- err
					return
				}
				if id%3 != 0 {
					if err := client.SendStatus(wire.StatusFrame{Status: wire.StatusAbandoned, EntityID: id}); err != nil {
						errc <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Errorf("client: %v", err)
	}
	// Let the last terminals arrive and any window deadline pass.
	select {
	case err := <-srv.closed:
		t.Fatalf("server session ended: %v", err)
	case <-server.Done():
	case <-time.After(windowGraceForTests):
	}
	if err := server.Err(); err != nil {
		t.Fatalf("server session: %v", err)
	}
	var ce *quicpeer.CloseError
	if err := client.Err(); errors.As(err, &ce) {
		t.Fatalf("client session closed by the server: %v", err)
	}
}
