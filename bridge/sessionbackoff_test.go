package bridge_test

import (
	"context"
	"crypto/tls"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// slammer is a peer over real loopback QUIC that completes every capability
// exchange and closes the session at once with PIPESTREAM_INTERNAL_ERROR:
// it records when each session came up.
type slammer struct {
	ln      *quicpeer.Listener
	certPEM []byte
	mu      sync.Mutex
	ups     []time.Time
	upc     chan struct{}
	wg      sync.WaitGroup
}

func startSlammer(t *testing.T) *slammer {
	t.Helper()
	cert, pemCert := selfSigned(t)
	p := &slammer{certPEM: pemCert, upc: make(chan struct{}, 1024)}
	ln, err := quicpeer.Listen("127.0.0.1:0", quicpeer.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}},
		Offer: wire.Capabilities{Layer0Core: true}, Handler: &slamHandler{}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			s, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			p.mu.Lock()
			p.ups = append(p.ups, time.Now())
			p.mu.Unlock()
			p.upc <- struct{}{}
			_ = s.CloseWithError(wire.CodeInternalError, "slammer: no sessions today")
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

// slamHandler ignores everything the bridge sends before the close lands.
type slamHandler struct{ scripted }

func (*slamHandler) HandleEntity(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
	_, _ = io.Copy(io.Discard, e.Payload)
}

// TestSessionClosedAtOnceBacksOff (issue 20 items 4 and 5): a peer that
// closes every session right after the handshake is redialled with the
// dial backoff (100 ms doubling, jitter in [d/2, d)), not in a loop: the
// sixth session comes at least 50+100+200+400+800 ms after the first. The
// document waiting for it spends none of its dispatch attempts on those
// sessions (it would have FAILED after 5), and the peer's last error, its
// count of such sessions and the document's waitReason say what happens.
func TestSessionClosedAtOnceBacksOff(t *testing.T) {
	p := startSlammer(t)
	e := &env{t: t, dir: t.TempDir()}
	e.opts.DataDir = e.dir
	e.opts.Logger = quietLogger()
	e.opts.PeerAddr = p.ln.Addr().String()
	e.opts.PeerCAPEM = p.certPEM
	e.opts.PeerServerName = "localhost"
	e.startBridge()
	t.Cleanup(e.closeBridge)
	doc := e.submit([]byte("held up by a peer that closes every session"), &gatewayv1.SubmitDocumentRequest{})
	const sessions = 6
	deadline := time.After(60 * time.Second)
	for range sessions {
		select {
		case <-p.upc:
		case <-deadline:
			t.Fatalf("only %d sessions came up within 60 s", len(p.upc))
		}
	}
	p.mu.Lock()
	span := p.ups[sessions-1].Sub(p.ups[0])
	p.mu.Unlock()
	if minSpan := 1550 * time.Millisecond; span < minSpan {
		t.Errorf("%d sessions within %v, want at least %v apart (session backoff)", sessions, span, minSpan)
	}
	t.Logf("%d sessions in %v", sessions, span)
	st := e.peerStatus(p.ln.Addr().String())
	// The peer closes either inside the capability exchange (a failed
	// dial) or right after it (a short session): both are its last error.
	if st.State != "down" && st.State != "connected" || !strings.Contains(st.LastError, "slammer: no sessions today") {
		t.Errorf("peer status %+v, want the peer's close as the last error", st)
	}
	d := e.waitFor(doc.Id, 20*time.Second, "a waitReason naming the peer and its last error", func(d *gatewayv1.Document) bool {
		return strings.Contains(d.WaitReason, p.ln.Addr().String()) && strings.Contains(d.WaitReason, "slammer: no sessions today")
	})
	if terminal(d.State) {
		t.Errorf("document %s: %q; attempts on sessions that never carried it must not count", d.State, d.Error)
	}
	t.Logf("waitReason: %s", d.WaitReason)
}
