package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// A peer that stops reading its stream 0 (issue 21): nothing the gateway
// writes to a peer's control stream may be written under a lock that
// other documents need. deafPeer is a plain draft-02 peer on raw quic-go
// (hand-built frames, written from the draft): it answers CAPABILITIES,
// then never reads stream 0 again, and grants it only deafWindow octets of
// flow-control credit, so the gateway's stream-0 writes to it block once
// that credit is spent. It still completes every entity it receives
// (PROCESSING, COMPLETE on its own sending half of stream 0) and returns
// no results.

const deafWindow = 256

type deafPeer struct {
	t    *testing.T
	ln   *quic.Listener
	addr string
	pem  []byte

	mu    sync.Mutex
	conns int
	ctl   *quic.Stream        // stream 0 of the first connection
	got   *countingReader     // counts what the gateway wrote to it
	roots map[uint32]struct{} // parents named by the chunks it received
	hold  bool                // entities are not answered until release
	held  []uint32            // entities received while holding
	wmu   sync.Mutex          // the peer's own stream-0 writes
	first chan struct{}       // closed once the first connection's stream 0 is up
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func startDeafPeer(t *testing.T) *deafPeer {
	t.Helper()
	cert, pem, err := quicpeer.SelfSignedCert()
	must(t, err)
	ln, err := quic.ListenAddr("127.0.0.1:0", quicpeer.ServerTLS(cert), &quic.Config{MaxIdleTimeout: time.Minute,
		InitialStreamReceiveWindow: deafWindow, MaxStreamReceiveWindow: deafWindow})
	must(t, err)
	p := &deafPeer{t: t, ln: ln, addr: ln.Addr().String(), pem: pem, roots: map[uint32]struct{}{}, first: make(chan struct{}), hold: true}
	t.Cleanup(func() { ln.Close() })
	go p.serve()
	return p
}

func (p *deafPeer) serve() {
	for {
		conn, err := p.ln.Accept(context.Background())
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns++
		n := p.conns
		p.mu.Unlock()
		if n > 1 {
			// One conversation only: a redial finds the peer refusing.
			_ = conn.CloseWithError(quic.ApplicationErrorCode(wire.CodeInternalError), "this peer takes one connection")
			continue
		}
		go p.handle(conn)
	}
}

func (p *deafPeer) handle(conn *quic.Conn) {
	ctl, err := conn.AcceptStream(context.Background())
	if err != nil {
		return
	}
	cr := &countingReader{r: ctl}
	if f, err := wire.NewControlReader(cr, 4096).Next(); err != nil || f.Type != wire.FrameCapabilities {
		p.t.Errorf("deaf peer: the gateway's first frame: %v (type %#x)", err, f.Type)
		return
	}
	body, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(&wire.Capabilities{Layer0Core: true})
	if err != nil {
		p.t.Error(err)
		return
	}
	p.write(ctl, wire.AppendVariable(nil, wire.FrameCapabilities, body))
	p.mu.Lock()
	p.ctl, p.got = ctl, cr
	p.mu.Unlock()
	close(p.first)
	for {
		rs, err := conn.AcceptUniStream(context.Background())
		if err != nil {
			return
		}
		go p.entity(ctl, rs)
	}
}

func (p *deafPeer) write(ctl *quic.Stream, b []byte) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, _ = ctl.Write(b)
}

// entity reads one entity and reports it PROCESSING, then COMPLETE (at
// once, or on release while the peer holds its answers).
func (p *deafPeer) entity(ctl *quic.Stream, rs *quic.ReceiveStream) {
	h, err := wire.ReadEntityHeader(rs, wire.CodecFor(wire.FormatCBOR), 64<<10)
	if err != nil {
		return
	}
	if _, err := io.Copy(io.Discard, rs); err != nil {
		return
	}
	p.mu.Lock()
	if h.ParentID != nil {
		p.roots[*h.ParentID] = struct{}{}
	}
	hold := p.hold
	if hold {
		p.held = append(p.held, h.EntityID)
	}
	p.mu.Unlock()
	if !hold {
		p.answer(ctl, h.EntityID)
	}
}

func (p *deafPeer) answer(ctl *quic.Stream, id uint32) {
	for _, st := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
		p.write(ctl, (&wire.StatusFrame{Status: st, EntityID: id}).Append(nil))
	}
}

// release answers the held entities and stops holding.
func (p *deafPeer) release() {
	p.mu.Lock()
	held, ctl := p.held, p.ctl
	p.held, p.hold = nil, false
	p.mu.Unlock()
	for _, id := range held {
		p.answer(ctl, id)
	}
}

// rootsSeen counts the dehydrated documents whose chunks arrived.
func (p *deafPeer) rootsSeen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.roots)
}

// listen reads stream 0 again until every dehydrated root it saw has a
// terminal status from the gateway (or ctx ends), and returns the octets
// the gateway wrote to stream 0 in all.
func (p *deafPeer) listen(ctx context.Context) (int, error) {
	p.mu.Lock()
	ctl, got := p.ctl, p.got
	open := make(map[uint32]bool, len(p.roots))
	for r := range p.roots {
		open[r] = true
	}
	p.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = ctl.SetReadDeadline(dl)
	}
	cr := wire.NewControlReader(got, 4096)
	for len(open) > 0 {
		f, err := cr.Next()
		if err != nil {
			return got.n, fmt.Errorf("stream 0 with roots %v still open: %w", open, err)
		}
		if f.Type == wire.FrameStatus && open[f.Status.EntityID] &&
			(f.Status.Status == wire.StatusComplete || f.Status.Status == wire.StatusFailed || f.Status.Status == wire.StatusAbandoned) {
			delete(open, f.Status.EntityID)
		}
	}
	return got.n, nil
}

// One peer stops reading stream 0 while the gateway still has statuses to
// send it: REHYDRATING and COMPLETE for R of every dehydrated document,
// which the gateway decides under its lock and reports itself toward a
// plain peer, and the chunks' cursor updates. The stream-0 write deadline
// is set far beyond the test, so the deaf session stays up throughout.
//
//  1. With the other peer down, 64 dehydrated documents go to the deaf
//     peer, which holds its answers: 64 DEHYDRATING frames, 1 KiB, fit in
//     its 256 octets of credit plus what quic-go buffers before a write
//     waits (one packet, 1452 octets).
//  2. It answers all their chunks at once: the gateway rehydrates the 64
//     documents itself and has 2 KiB more to write, which cannot all fit,
//     so some writes wait. Every one of the 64 documents still completes
//     (the gateway decides it; the statuses wait in the session's queue).
//     A write under the lock would have stopped the whole bridge here.
//  3. With the other peer still down, more documents go to the deaf peer:
//     their DEHYDRATING cannot be written, so as many sendings as one peer
//     may run at once (MaxConcurrentDispatch) wait on it, the rest are
//     queued. The other peer comes up: the queued documents and every one
//     submitted then complete there (the deaf peer's waiting sendings hold
//     up no other peer's).
//  4. The deaf peer reads again: everything queued for it arrives, far
//     more octets than its credit, and every document completes.
func TestDeafPeerStallsNoOtherDocument(t *testing.T) {
	defer bridge.SetControlWriteTimeout(time.Hour)()
	deaf, good := startDeafPeer(t), newTestPeer(t)
	good.stop(0)
	e := &env{t: t, dir: t.TempDir()}
	e.opts.DataDir = e.dir
	e.opts.Logger = quietLogger()
	e.opts.Peers = []bridge.PeerEndpoint{{Addr: deaf.addr, CAPEM: deaf.pem}, {Addr: good.addr, CAPEM: good.cert}}
	e.startBridge()
	t.Cleanup(func() {
		if e.b != nil {
			e.closeBridge()
		}
	})
	e.waitPeer(deaf.addr, "connected", connected)
	<-deaf.first
	// Registered after the bridge's cleanup, so run before it: a failing
	// test leaves writes to the deaf peer waiting, which the bridge's
	// Close would wait for.
	t.Cleanup(func() {
		deaf.mu.Lock()
		ctl := deaf.ctl
		deaf.mu.Unlock()
		go func() { _, _ = io.Copy(io.Discard, ctl) }()
	})
	// A wedged bridge would hang the test's own calls: on failure, the
	// deaf peer reads again so that the cleanup can close the bridge.
	unwedge := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = deaf.listen(ctx)
	}

	ins := map[string][]byte{}
	submit := func(tag string) string {
		in := bytes.Repeat(fmt.Appendf(nil, "line %s of a document while one peer is deaf\n", tag), 6<<10/48)
		d, err := e.b.Submit(context.Background(), "", &gatewayv1.SubmitDocumentRequest{Content: in, ContentType: "text/plain",
			Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 4096}})
		must(t, err)
		ins[d.Id] = in
		return d.Id
	}
	// 1.
	var first []string
	for i := range 64 {
		first = append(first, submit(fmt.Sprintf("1.%02d", i)))
	}
	deadline := time.Now().Add(60 * time.Second)
	for deaf.rootsSeen() < len(first) {
		if time.Now().After(deadline) {
			t.Fatalf("the deaf peer got the chunks of %d of %d documents", deaf.rootsSeen(), len(first))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// 2.
	deaf.release()
	finished := make(chan error, 1)
	go func() {
		for _, id := range first {
			d, err := e.terminalWithin(id, 60*time.Second)
			if err != nil {
				finished <- err
				return
			}
			if d.State != gatewayv1.State_SUCCEEDED || !d.ResultAbsent {
				finished <- fmt.Errorf("document %s: %s (result absent %v) %q, want SUCCEEDED without a result", id, d.State, d.ResultAbsent, d.Error)
				return
			}
		}
		finished <- nil
	}()
	select {
	case err := <-finished:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(90 * time.Second):
		unwedge()
		t.Fatal("the deaf peer's 64 documents did not finish: the bridge waits on a write to its stream 0")
	}
	if p := e.peerStatus(deaf.addr); p.State != "connected" {
		t.Fatalf("the deaf peer's session ended (%+v): the test means to show documents complete while writes to it wait", p)
	}
	// 3.
	var later []string
	for i := range bridge.MaxConcurrentDispatch + 2 {
		later = append(later, submit(fmt.Sprintf("3.%02d", i)))
	}
	deadline = time.Now().Add(60 * time.Second)
	for e.peerStatus(deaf.addr).InFlight < bridge.MaxConcurrentDispatch {
		if time.Now().After(deadline) {
			t.Fatalf("%d documents in flight at the deaf peer, want %d sendings stuck there", e.peerStatus(deaf.addr).InFlight, bridge.MaxConcurrentDispatch)
		}
		time.Sleep(10 * time.Millisecond)
	}
	good.start()
	e.waitPeer(good.addr, "connected", connected)
	for i := range 8 {
		later = append(later, submit(fmt.Sprintf("3.%02d", 10+i)))
	}
	e.settleAt(deaf.addr, good.addr, later)
	if done := e.completedWithResults(later, ins); done != len(later)-bridge.MaxConcurrentDispatch {
		t.Fatalf("%d of %d documents completed at the good peer, want all but the %d whose sending waits on the deaf peer",
			done, len(later), bridge.MaxConcurrentDispatch)
	}
	// 4.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := slices.Collect(maps.Keys(ins))
	// listen returns once the deaf peer has read every root's end, which
	// can be before this goroutine's last poll: the test waits for it
	// before it returns, so no poll of e.b outlives the test (the
	// cleanup closes the bridge and clears e.b).
	polled := e.cancelWhenTerminal(ctx, cancel, ids)
	defer func() { cancel(); <-polled }()
	n, err := deaf.listen(ctx)
	if err != nil && ctx.Err() == nil {
		t.Fatalf("deaf peer reading stream 0 again after %d octets: %v", n, err)
	}
	if n <= deafWindow+1452 {
		t.Fatalf("the gateway wrote %d octets to the deaf peer's stream 0, within its %d octets of credit and a packet: no write ever waited", n, deafWindow)
	}
	for id := range ins {
		if d := e.wait(id, 60*time.Second); d.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("document %s after the deaf peer read again: %s %q", id, d.State, d.Error)
		}
	}
	t.Logf("%d octets reached the deaf peer's stream 0 (credit %d)", n, deafWindow)
}

// cancelWhenTerminal polls the documents of ids on a goroutine of its own
// until each is terminal (or one is not within a minute, or ctx ends),
// then cancels; the returned channel is closed when the goroutine is done.
func (e *env) cancelWhenTerminal(ctx context.Context, cancel context.CancelFunc, ids []string) <-chan struct{} {
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		defer cancel()
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			if _, err := e.terminalWithin(id, 60*time.Second); err != nil {
				return
			}
		}
	}()
	return polled
}

// completedWithResults checks the documents of ids that finished (the
// others wait on the deaf peer): each SUCCEEDED with its own bytes as the
// result. It returns how many finished.
func (e *env) completedWithResults(ids []string, ins map[string][]byte) int {
	e.t.Helper()
	done := 0
	for _, id := range ids {
		d, err := e.b.GetDocument(context.Background(), "", id, false)
		must(e.t, err)
		if !terminal(d.State) {
			continue // placed on the deaf peer
		}
		if d.State != gatewayv1.State_SUCCEEDED || d.ResultAbsent {
			e.t.Fatalf("document %s at the good peer: %s (result absent %v) %q", id, d.State, d.ResultAbsent, d.Error)
		}
		if got := e.result(id); !bytes.Equal(got, ins[id]) {
			e.t.Fatalf("result of %s: %d bytes, want %d", id, len(got), len(ins[id]))
		}
		done++
	}
	return done
}

// terminalWithin polls the document until it is terminal; unlike wait it
// may run on any goroutine.
func (e *env) terminalWithin(id string, within time.Duration) (*gatewayv1.Document, error) {
	deadline := time.Now().Add(within)
	for {
		d, err := e.b.GetDocument(context.Background(), "", id, false)
		if err != nil || terminal(d.State) {
			return d, err
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("document %s not terminal after %v: %s %q", id, within, d.State, d.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settleAt waits until every document of ins is finished or in flight at
// the peer deaf, and none is in flight at good.
func (e *env) settleAt(deaf, good string, ins []string) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		fin := 0
		for _, id := range ins {
			d, err := e.b.GetDocument(context.Background(), "", id, false)
			must(e.t, err)
			if terminal(d.State) {
				fin++
			}
		}
		atDeaf, atGood := e.peerStatus(deaf).InFlight, e.peerStatus(good).InFlight
		if atGood == 0 && fin+atDeaf == len(ins) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("after 60 s: %d of %d documents finished, %d in flight at the deaf peer, %d at the good one", fin, len(ins), atDeaf, atGood)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
