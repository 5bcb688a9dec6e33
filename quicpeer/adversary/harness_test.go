package adversary_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// waitLimit bounds every wait of the suite.
const waitLimit = 10 * time.Second

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	goleak.VerifyTestMain(m)
}

// logBuffer collects the peer's log lines (tests check that the peer says
// what it refused).
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// target is a real peer.Start server on loopback.
type target struct {
	srv  *peer.Server
	logs *logBuffer
	addr string
	pin  []byte
}

// startTarget starts a peer with opts (DataDir defaults to a temp dir);
// its log is printed when t fails.
func startTarget(t *testing.T, opts peer.Options) *target {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	logs := &logBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 2 * time.Second
	}
	srv, err := peer.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if t.Failed() {
			t.Logf("--- peer log ---\n%s", tail(logs.String(), 60))
		}
	})
	return &target{srv: srv, logs: logs, addr: srv.Addr().String(), pin: srv.CertPEM()}
}

func tail(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// raw is the adversary: plain quic-go with stream 0 driven by hand.
type raw struct {
	t    *testing.T
	conn *quic.Conn
	ctrl *quic.Stream
	cr   *wire.ControlReader

	mu       sync.Mutex
	statuses []wire.StatusFrame // entity statuses the peer sent on stream 0
}

// waitStatus waits until the peer sent status st for root entity id.
func (r *raw) waitStatus(id uint32, st wire.Status) {
	r.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		for _, f := range r.statuses {
			if f.ScopeID == 0 && f.EntityID == id && f.Status == st {
				r.mu.Unlock()
				return
			}
		}
		r.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.Fatalf("the peer sent no %s for entity %d (statuses %v)", st, id, r.statuses)
}

// sendEntity writes a complete entity stream (header, payload, FIN).
func (r *raw) sendEntity(h *wire.EntityHeader, payload []byte) {
	r.t.Helper()
	hb := header(r.t, h)
	st := r.entityStream(uint32(len(hb)), hb)
	if _, err := st.Write(payload); err != nil {
		r.t.Fatal(err)
	}
	st.Close()
}

// clientTLS pins the target's certificate, TLS 1.3 only, ALPN pipestream/1.
func (tg *target) clientTLS(t *testing.T) *tls.Config {
	t.Helper()
	c, err := quicpeer.ClientTLS(tg.pin)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "localhost"
	return c
}

// dialRaw connects and, with caps non-nil, completes the capability
// exchange (CBOR CAPABILITIES both ways, Section 3.4).
func dialRaw(t *testing.T, tg *target, caps *wire.Capabilities) *raw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	conn, err := quic.DialAddr(ctx, tg.addr, tg.clientTLS(t), &quic.Config{MaxIdleTimeout: 30 * time.Second, KeepAlivePeriod: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if st := conn.ConnectionState().TLS; st.Version != tls.VersionTLS13 || st.NegotiatedProtocol != quicpeer.ALPN {
		t.Fatalf("handshake: TLS %#x ALPN %q, want TLS 1.3 and %q", st.Version, st.NegotiatedProtocol, quicpeer.ALPN)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	ctrl, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &raw{t: t, conn: conn, ctrl: ctrl, cr: wire.NewControlReader(ctrl, 0)}
	if caps != nil {
		body, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(caps)
		if err != nil {
			t.Fatal(err)
		}
		r.write(wire.AppendVariable(nil, wire.FrameCapabilities, body))
		f, err := r.cr.Next()
		if err != nil || f.Type != wire.FrameCapabilities {
			t.Fatalf("server CAPABILITIES: %v (frame type %#x)", err, f.Type)
		}
		// Keep reading stream 0 (flow control must never stall the peer)
		// and record the entity statuses.
		go func() {
			for {
				f, err := r.cr.Next()
				if err != nil {
					return
				}
				if f.Type == wire.FrameStatus && f.Status.EntityID != wire.ConnectionEntity {
					st := f.Status
					st.Ext = slices.Clone(st.Ext)
					r.mu.Lock()
					r.statuses = append(r.statuses, st)
					r.mu.Unlock()
				}
			}
		}()
	}
	return r
}

// allLayers is a client offer of Layers 0-2 in CBOR.
func allLayers() *wire.Capabilities {
	return &wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}
}

func (r *raw) write(b []byte) {
	r.t.Helper()
	if _, err := r.ctrl.Write(b); err != nil {
		r.t.Fatalf("adversary write on stream 0: %v", err)
	}
}

// closeCode waits for the peer's CONNECTION_CLOSE and returns its
// application error code.
func (r *raw) closeCode() wire.ErrorCode {
	r.t.Helper()
	select {
	case <-r.conn.Context().Done():
	case <-time.After(waitLimit):
		r.t.Fatal("the peer did not close the connection")
	}
	var ae *quic.ApplicationError
	if err := context.Cause(r.conn.Context()); !errors.As(err, &ae) || !ae.Remote {
		r.t.Fatalf("connection ended with %v, want a CONNECTION_CLOSE from the peer", err)
	}
	return wire.ErrorCode(ae.ErrorCode)
}

// wantClose asserts the peer closes the connection with code.
func (r *raw) wantClose(what string, code wire.ErrorCode) {
	r.t.Helper()
	if got := r.closeCode(); got != code {
		r.t.Errorf("%s: peer closed with %s, want %s", what, got, code)
	}
}

// alive asserts the connection is still open after a moment.
func (r *raw) alive(what string) {
	r.t.Helper()
	select {
	case <-r.conn.Context().Done():
		r.t.Fatalf("%s: the connection was closed (%v); only the stream should have been refused", what, context.Cause(r.conn.Context()))
	case <-time.After(200 * time.Millisecond):
	}
}

// stopCode waits until the peer stops st (STOP_SENDING) and returns the
// code. The write side must still be open (no FIN), or the stream's
// context ends with ErrStreamClosed instead.
func stopCode(t *testing.T, st *quic.SendStream) wire.ErrorCode {
	t.Helper()
	select {
	case <-st.Context().Done():
	case <-time.After(waitLimit):
		t.Fatal("the peer did not stop the entity stream")
	}
	var se *quic.StreamError
	if err := context.Cause(st.Context()); !errors.As(err, &se) || !se.Remote {
		t.Fatalf("entity stream ended with %v, want STOP_SENDING from the peer", context.Cause(st.Context()))
	}
	return wire.ErrorCode(se.ErrorCode)
}

// entityStream opens a uni stream and writes the 4-octet Header Length
// and hdr verbatim (hdr may lie about its length).
func (r *raw) entityStream(headerLen uint32, hdr []byte) *quic.SendStream {
	r.t.Helper()
	st, err := r.conn.OpenUniStream()
	if err != nil {
		r.t.Fatal(err)
	}
	b := []byte{byte(headerLen >> 24), byte(headerLen >> 16), byte(headerLen >> 8), byte(headerLen)}
	if _, err := st.Write(append(b, hdr...)); err != nil {
		r.t.Fatal(err)
	}
	return st
}

// header encodes h in CBOR.
func header(t *testing.T, h *wire.EntityHeader) []byte {
	t.Helper()
	b, err := wire.CodecFor(wire.FormatCBOR).MarshalEntityHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// profileMD returns md plus the profile marker (profile 4): a copy.
func profileMD(md map[string]string) map[string]string {
	out := map[string]string{peer.MetaProfile: peer.ProfileVersion}
	for k, v := range md {
		out[k] = v
	}
	return out
}

// envelope is the PipeDoc a whole document travels in (profile 4.1).
func envelope(t *testing.T, format wire.Format, id uint32, blob []byte) []byte {
	t.Helper()
	b, err := wire.CodecFor(format).MarshalPipeDoc(&wire.PipeDoc{DocID: fmt.Sprintf("adv-%d", id), EntityID: id,
		Ownership: &wire.OwnershipContext{OwnerID: "tenant"}, Blob: blob})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// good is a well-behaved quicpeer client session that records statuses
// and result streams.
type good struct {
	sess    *quicpeer.Session
	mu      sync.Mutex
	changed chan struct{}
	status  map[uint32][]wire.StatusFrame // root-scope statuses by entity
	results map[uint32][]byte             // result payloads by entity id
}

func (g *good) note(f func()) {
	g.mu.Lock()
	f()
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
}

func (g *good) HandleStatus(_ *quicpeer.Session, f wire.StatusFrame) {
	f.Ext = slices.Clone(f.Ext)
	if f.ScopeID != 0 {
		return
	}
	g.note(func() { g.status[f.EntityID] = append(g.status[f.EntityID], f) })
}
func (g *good) HandleScopeDigest(*quicpeer.Session, wire.ScopeDigestFrame) {}
func (g *good) HandleBarrier(*quicpeer.Session, wire.BarrierFrame)         {}
func (g *good) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame)  {}
func (g *good) HandleGoAway(*quicpeer.Session, wire.GoAwayFrame)           {}
func (g *good) HandleClose(*quicpeer.Session, error)                       { g.note(func() {}) }
func (g *good) HandleEntity(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
	b, err := io.ReadAll(e.Payload)
	if err != nil {
		return
	}
	g.note(func() { g.results[e.Header.EntityID] = b })
}

// dialGood opens a well-behaved session to tg.
func dialGood(t *testing.T, tg *target) *good {
	t.Helper()
	g := &good{changed: make(chan struct{}), status: map[uint32][]wire.StatusFrame{}, results: map[uint32][]byte{}}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	sess, err := quicpeer.Dial(ctx, tg.addr, quicpeer.Config{TLS: tg.clientTLS(t), Offer: *allLayers(), Handler: g,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("well-behaved client: dial: %v", err)
	}
	g.sess = sess
	t.Cleanup(func() {
		sess.CloseWithError(wire.CodeNoError, "done")
		<-sess.Done()
	})
	return g
}

// waitFor waits until cond (called under g.mu) holds.
func (g *good) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		g.mu.Lock()
		ok, ch := cond(), g.changed
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			g.mu.Lock()
			defer g.mu.Unlock()
			t.Fatalf("well-behaved client: timed out waiting for %s (statuses %v)", what, g.status)
		}
	}
}

// last is the newest root-scope status of id (under g.mu).
func (g *good) last(id uint32) (wire.StatusFrame, bool) {
	fs := g.status[id]
	if len(fs) == 0 {
		return wire.StatusFrame{}, false
	}
	return fs[len(fs)-1], true
}

// send sends a whole document with md and returns its root ID.
func (g *good) send(t *testing.T, content []byte, md map[string]string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	id, err := g.sess.AssignID(ctx)
	if err != nil {
		t.Fatalf("well-behaved client: AssignID: %v", err)
	}
	payload := envelope(t, g.sess.Negotiated().Format, id, content)
	sum := sha256.Sum256(payload)
	h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain", PayloadLength: uint64(len(payload)), Checksum: sum[:], Metadata: profileMD(md)}
	if err := g.sess.SendEntity(ctx, h, bytes.NewReader(payload)); err != nil {
		t.Fatalf("well-behaved client: SendEntity: %v", err)
	}
	return id
}

// completeDocument is the "other clients are unaffected" check: a fresh
// well-behaved session sends a document and gets COMPLETE and the
// identical result back.
func completeDocument(t *testing.T, tg *target, what string) {
	t.Helper()
	g := dialGood(t, tg)
	content := []byte("well-behaved document: " + what)
	id := g.send(t, content, nil)
	g.waitFor(t, "COMPLETE and the result ("+what+")", func() bool {
		f, ok := g.last(id)
		return ok && f.Status == wire.StatusComplete && g.results[id] != nil
	})
	if got := g.results[id]; !bytes.Equal(got, content) {
		t.Errorf("well-behaved client (%s): result %q, want %q", what, got, content)
	}
	g.sess.CloseWithError(wire.CodeNoError, "done")
	<-g.sess.Done()
}
