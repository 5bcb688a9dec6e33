package quicpeer

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// These tests hold the in-process transport to the QUIC behaviour the
// session core relies on (inproc.go's list). The whole session suite
// also runs over it: go test ./quicpeer/ -args -quicpeer.transport=inproc.

func inprocPair(maxUni int64) (client, server *inprocConn) {
	return newInprocPair(ALPN, maxUni, maxUni)
}

// writeAll writes n octets to w in the background and counts what Write
// has taken so far.
func writeAll(w io.Writer, n int) (taken *atomic.Int64, done chan error) {
	taken, done = new(atomic.Int64), make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for left := n; left > 0; {
			k, err := w.Write(buf[:min(len(buf), left)])
			taken.Add(int64(k))
			if err != nil {
				done <- err
				return
			}
			left -= k
		}
		done <- nil
	}()
	return taken, done
}

func TestInProcessStreamWindowHoldsTheWriter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, s := inprocPair(8)
		defer c.CloseWithError(wire.CodeNoError, "")
		w, err := c.OpenUniStreamSync(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		taken, done := writeAll(w, 3*inprocStreamWindow)
		synctest.Wait()
		if got := taken.Load(); got != inprocStreamWindow {
			t.Fatalf("an unread stream took %d octets; want exactly its window, %d", got, inprocStreamWindow)
		}
		r, err := s.AcceptUniStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, io.LimitReader(r, 3*inprocStreamWindow)); err != nil || n != 3*inprocStreamWindow {
			t.Fatalf("read %d octets (%v); want %d", n, err, 3*inprocStreamWindow)
		}
		if err := <-done; err != nil {
			t.Fatalf("writer: %v", err)
		}
	})
}

func TestInProcessConnectionWindowBoundsUnreadStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, s := inprocPair(64)
		defer c.CloseWithError(wire.CodeNoError, "")
		n := inprocConnWindow/inprocStreamWindow + 4
		var dones []chan error
		var streams []*inprocPipe
		for range n {
			w, err := c.OpenUniStreamSync(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_, done := writeAll(w, inprocStreamWindow)
			dones = append(dones, done)
			r, err := s.AcceptUniStream(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, r.(inprocRecv).p)
		}
		synctest.Wait()
		if got := buffered(streams); got != inprocConnWindow {
			t.Fatalf("%d unread streams buffer %d octets; want the connection window, %d", n, got, inprocConnWindow)
		}
		// Reading a full stream frees its octets of the window, which the
		// blocked writers take.
		full := slices.IndexFunc(streams, func(p *inprocPipe) bool { return buffered([]*inprocPipe{p}) == inprocStreamWindow })
		if full < 0 {
			t.Fatal("no writer filled its stream's window")
		}
		if _, err := io.CopyN(io.Discard, inprocRecv{streams[full]}, inprocStreamWindow); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := buffered(streams); got != inprocConnWindow {
			t.Fatalf("after one full stream was read, the others buffer %d octets; want the window, %d, taken up again", got, inprocConnWindow)
		}
		// Every writer finishes once every stream is read (at once: a
		// receiver that reads one stream to its end while the others hold
		// the connection's window waits forever, over QUIC too).
		for j, p := range streams {
			if j != full {
				go func() {
					if _, err := io.CopyN(io.Discard, inprocRecv{p}, inprocStreamWindow); err != nil {
						t.Error(err)
					}
				}()
			}
		}
		for j, done := range dones {
			if err := <-done; err != nil {
				t.Errorf("writer %d: %v", j, err)
			}
		}
	})
}

func buffered(ps []*inprocPipe) int {
	n := 0
	for _, p := range ps {
		p.mu.Lock()
		n += p.data.n
		p.mu.Unlock()
	}
	return n
}

func TestInProcessStreamLimitWaitsForTheReceiver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, s := inprocPair(2)
		defer c.CloseWithError(wire.CodeNoError, "")
		for range 2 {
			w, err := c.OpenUniStreamSync(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
		}
		opened := make(chan sendStream, 1)
		go func() {
			w, err := c.OpenUniStreamSync(t.Context())
			if err != nil {
				t.Error(err)
			}
			opened <- w
		}()
		synctest.Wait()
		select {
		case <-opened:
			t.Fatal("a third stream opened while the receiver's limit of 2 was in use")
		default:
		}
		r, err := s.AcceptUniStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if r.StreamID() != 2 {
			t.Fatalf("the client's first uni stream is %d; want 2 (RFC 9000 2.1)", r.StreamID())
		}
		if _, err := io.ReadAll(r); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case w := <-opened:
			if w.StreamID() != 10 {
				t.Fatalf("the third uni stream is %d; want 10", w.StreamID())
			}
		default:
			t.Fatal("the stream's slot did not return once its receiver read the FIN")
		}
	})
}

func TestInProcessResetAndStopCarryTheirCodes(t *testing.T) {
	c, s := inprocPair(8)
	defer c.CloseWithError(wire.CodeNoError, "")
	ctx := t.Context()

	w, _ := c.OpenUniStreamSync(ctx)
	r, _ := s.AcceptUniStream(ctx)
	w.Write([]byte("dropped"))
	w.CancelWrite(wire.CodeEntityInvalid)
	_, err := r.Read(make([]byte, 16))
	if code, remote, ok := streamAbort(err); !ok || !remote || code != wire.CodeEntityInvalid {
		t.Fatalf("read after RESET_STREAM: %v; want a remote stream error with 0x05, the buffered octets dropped", err)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("write after CancelWrite succeeded")
	} else if _, remote, ok := streamAbort(err); !ok || remote {
		t.Fatalf("write after CancelWrite: %v; want a local stream error", err)
	}

	w2, _ := c.OpenUniStreamSync(ctx)
	r2, _ := s.AcceptUniStream(ctx)
	r2.CancelRead(wire.CodeIntegrityError)
	if _, err := w2.Write([]byte("x")); err == nil {
		t.Fatal("write after STOP_SENDING succeeded")
	} else if code, remote, ok := streamAbort(err); !ok || !remote || code != wire.CodeIntegrityError {
		t.Fatalf("write after STOP_SENDING: %v; want a remote stream error with the reader's code", err)
	}
}

func TestInProcessCloseReachesBothEnds(t *testing.T) {
	c, s := inprocPair(8)
	ctx := t.Context()
	ctrl, err := c.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sctrl, err := s.AcceptStream(ctx)
	if err != nil || sctrl.StreamID() != 0 || ctrl.StreamID() != 0 {
		t.Fatalf("stream 0: %v (ids %d, %d)", err, ctrl.StreamID(), sctrl.StreamID())
	}
	if _, err := c.OpenStreamSync(ctx); err == nil {
		t.Fatal("a second bidirectional stream opened; PipeStream has only stream 0")
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := sctrl.Read(make([]byte, 8))
		readErr <- err
	}()
	c.CloseWithError(wire.CodeLayerUnsupported, "bye")
	<-s.Context().Done()
	var ce *CloseError
	if err := closeCause(context.Cause(s.Context())); !errors.As(err, &ce) || !ce.Remote || ce.Code != wire.CodeLayerUnsupported || ce.Reason != "bye" {
		t.Fatalf("the server's close cause: %v; want the client's 0x0C, remote, with its reason", err)
	}
	if err := closeCause(context.Cause(c.Context())); !errors.As(err, &ce) || ce.Remote {
		t.Fatalf("the client's close cause: %v; want its own close", err)
	}
	var ae *quic.ApplicationError
	if err := <-readErr; !errors.As(err, &ae) {
		t.Fatalf("a pending read after the close: %v; want the close error", err)
	}
	if err := closeCause(context.Cause(s.Context())); err == nil {
		t.Fatal("a close with 0x0C reads as a clean end")
	}
}

func TestInProcessDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, s := inprocPair(8)
		defer c.CloseWithError(wire.CodeNoError, "")
		ctrl, _ := c.OpenStreamSync(t.Context())
		sctrl, _ := s.AcceptStream(t.Context())
		sctrl.SetReadDeadline(time.Now().Add(time.Second))
		start := time.Now()
		_, err := sctrl.Read(make([]byte, 8))
		if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) != time.Second {
			t.Fatalf("read past its deadline: %v after %v; want os.ErrDeadlineExceeded after 1s", err, time.Since(start))
		}
		ctrl.SetWriteDeadline(time.Now().Add(time.Second))
		_, err = ctrl.Write(make([]byte, 2*inprocStreamWindow))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a write the reader never takes: %v; want os.ErrDeadlineExceeded", err)
		}
	})
}

func TestInProcessALPN(t *testing.T) {
	alpn := func(protos ...string) *resolved {
		return &resolved{Config: Config{TLS: &tls.Config{NextProtos: protos}, Limits: Limits{MaxIncomingStreams: 8}}}
	}
	srv := alpn(ALPNProfile, ALPN)
	l, err := listenInProcess(InProcessScheme+"alpn-test", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if _, err := listenInProcess(InProcessScheme+"alpn-test", srv); err == nil {
		t.Fatal("a second listener took an address in use")
	}
	go func() {
		for {
			c, err := l.accept(context.Background())
			if err != nil {
				return
			}
			c.CloseWithError(wire.CodeNoError, "")
		}
	}()
	for _, tc := range []struct {
		offer []string
		want  string
	}{
		{[]string{ALPNProfile, ALPN}, ALPNProfile},
		{[]string{ALPN}, ALPN},
		{[]string{"h3"}, ""},
	} {
		c, err := dialInProcess(t.Context(), string(l.addr), alpn(tc.offer...))
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("offer %q: dialled; want a refusal (no protocol in common)", tc.offer)
		case tc.want != "" && (err != nil || c.NegotiatedProtocol() != tc.want):
			t.Errorf("offer %q: %v, selected %q; want %q", tc.offer, err, c.NegotiatedProtocol(), tc.want)
		}
	}
	if _, err := dialInProcess(t.Context(), InProcessScheme+"nobody", alpn(ALPN)); err == nil {
		t.Fatal("dialled an address no listener holds")
	}
}
