package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// statusCounter is a server Handler that counts entity STATUS frames.
type statusCounter struct {
	churnClient
	n atomic.Int64
}

func (h *statusCounter) HandleStatus(_ *quicpeer.Session, f wire.StatusFrame) {
	if f.EntityID != wire.ConnectionEntity {
		h.n.Add(1)
	}
}

// control measures STATUS frames per second over one connection end to
// end: the client assigns IDs and sends PROCESSING then COMPLETE for each
// (a valid Section 6.2.2a sequence that resolves the ID, so the window and
// cursor move as in production); the server's Handler.HandleStatus counts.
// The clock stops when the server has counted every frame sent.
func (b *runner) control(ctx context.Context) error {
	d := b.o.Duration
	b.progress("  quicpeer SendStatus -> HandleStatus, one connection, %s", d)
	cert, pem, err := quicpeer.SelfSignedCert()
	if err != nil {
		return err
	}
	ctls, err := quicpeer.ClientTLS(pem)
	if err != nil {
		return err
	}
	offer := wire.Capabilities{Layer0Core: true}
	srvH := &statusCounter{}
	ln, err := quicpeer.Listen("127.0.0.1:0", quicpeer.Config{TLS: quicpeer.ServerTLS(cert), Offer: offer, Handler: srvH, Logger: quiet})
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan *quicpeer.Session, 1)
	go func() {
		s, err := ln.Accept(ctx)
		if err == nil {
			accepted <- s
		}
		close(accepted)
	}()
	s, err := quicpeer.Dial(ctx, ln.Addr().String(), quicpeer.Config{TLS: ctls, Offer: offer, Handler: &churnClient{f: newInflight(1)}, Logger: quiet})
	if err != nil {
		return err
	}
	ss := <-accepted
	defer func() {
		_ = s.CloseWithError(wire.CodeNoError, "bench done")
		<-s.Done()
		if ss != nil {
			_ = ss.CloseWithError(wire.CodeNoError, "bench done")
			<-ss.Done()
		}
	}()

	var sent int64
	start := time.Now()
	deadline := start.Add(d)
	for time.Now().Before(deadline) {
		for range 256 {
			id, err := s.AssignID(ctx)
			if err != nil {
				return err
			}
			if err := s.SendStatus(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: id}); err != nil {
				return err
			}
			if err := s.SendStatus(wire.StatusFrame{Status: wire.StatusComplete, EntityID: id}); err != nil {
				return err
			}
			sent += 2
		}
	}
	stuck := time.Now().Add(waitTimeout)
	for srvH.n.Load() < sent {
		if time.Now().After(stuck) || s.Err() != nil {
			return fmt.Errorf("the server counted %d of %d STATUS frames (session: %v)", srvH.n.Load(), sent, s.Err())
		}
		time.Sleep(time.Millisecond)
	}
	secs := since(start)
	b.add(Result{Phase: "control", Path: "quicpeer STATUS frames (1 conn)", Unit: "frames/s", Rate: float64(sent) / secs, Count: sent, Seconds: secs})
	return nil
}
