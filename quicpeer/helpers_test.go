package quicpeer_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// listenAddr is where the transport-agnostic tests listen: UDP by
// default, the in-process transport with -quicpeer.transport=inproc (CI
// runs the package both ways, so the session core is checked on both).
// Tests of QUIC itself (stateless resets, raw packets, the connection
// limit's CONNECTION_CLOSE) listen on UDP either way.
var transport = flag.String("quicpeer.transport", "udp", "transport of the session tests: udp or inproc")

func listenAddr() string {
	if *transport == "inproc" {
		return quicpeer.InProcessScheme + "0"
	}
	return "127.0.0.1:0"
}

func TestMain(m *testing.M) {
	flag.Parse()
	if *transport != "udp" && *transport != "inproc" {
		fmt.Fprintf(os.Stderr, "-quicpeer.transport=%q: want udp or inproc\n", *transport)
		os.Exit(2)
	}
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	goleak.VerifyTestMain(m)
}

// mode is one way to run a test body: the serialization format both ends
// prefer (net/http's run(t, f, modes) pattern).
type mode struct {
	name   string
	format wire.Format
}

var (
	cborMode  = mode{"cbor", wire.FormatCBOR}
	protoMode = mode{"protobuf", wire.FormatProtobuf}
	allModes  = []mode{cborMode, protoMode}
)

func run(t *testing.T, modes []mode, f func(t *testing.T, m mode)) {
	t.Helper()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

var (
	certOnce sync.Once
	cert     tls.Certificate
	certPEM  []byte
)

func testCert(t testing.TB) (tls.Certificate, []byte) {
	certOnce.Do(func() {
		var err error
		cert, certPEM, err = quicpeer.SelfSignedCert()
		if err != nil {
			panic(err)
		}
	})
	return cert, certPEM
}

func clientTLS(t testing.TB) *tls.Config {
	_, pem := testCert(t)
	c, err := quicpeer.ClientTLS(pem)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func serverTLS(t testing.TB) *tls.Config {
	c, _ := testCert(t)
	return quicpeer.ServerTLS(c)
}

func u64(v uint64) *uint64 { return &v }
func u32(v uint32) *uint32 { return &v }

// entityResult is what the recorder's default HandleEntity saw.
type entityResult struct {
	h   *wire.EntityHeader
	n   int64
	sum [32]byte
	err error
}

// recorder is a Handler that records everything on channels.
type recorder struct {
	statuses    chan wire.StatusFrame
	digests     chan wire.ScopeDigestFrame
	barriers    chan wire.BarrierFrame
	checkpoints chan *wire.CheckpointFrame
	goaways     chan wire.GoAwayFrame
	entities    chan entityResult
	closed      chan error
	// onEntity replaces the default (read to EOF, hash, record); set it
	// with setOnEntity (the network does not order it for the race detector).
	mu       sync.Mutex
	onEntity func(s *quicpeer.Session, e *quicpeer.IncomingEntity)
}

func (r *recorder) setOnEntity(f func(s *quicpeer.Session, e *quicpeer.IncomingEntity)) {
	r.mu.Lock()
	r.onEntity = f
	r.mu.Unlock()
}

func newRecorder() *recorder {
	return &recorder{
		statuses:    make(chan wire.StatusFrame, 4096),
		digests:     make(chan wire.ScopeDigestFrame, 64),
		barriers:    make(chan wire.BarrierFrame, 64),
		checkpoints: make(chan *wire.CheckpointFrame, 64),
		goaways:     make(chan wire.GoAwayFrame, 64),
		entities:    make(chan entityResult, 1024),
		closed:      make(chan error, 1),
	}
}

func (r *recorder) HandleStatus(s *quicpeer.Session, f wire.StatusFrame) {
	if f.HasExt {
		f.Ext = append([]byte(nil), f.Ext...) // Ext is only valid during the call
	}
	r.statuses <- f
}
func (r *recorder) HandleScopeDigest(_ *quicpeer.Session, f wire.ScopeDigestFrame) { r.digests <- f }
func (r *recorder) HandleBarrier(_ *quicpeer.Session, f wire.BarrierFrame)         { r.barriers <- f }
func (r *recorder) HandleCheckpoint(_ *quicpeer.Session, f *wire.CheckpointFrame)  { r.checkpoints <- f }
func (r *recorder) HandleGoAway(_ *quicpeer.Session, f wire.GoAwayFrame)           { r.goaways <- f }
func (r *recorder) HandleClose(_ *quicpeer.Session, err error)                     { r.closed <- err }

func (r *recorder) HandleEntity(s *quicpeer.Session, e *quicpeer.IncomingEntity) {
	r.mu.Lock()
	on := r.onEntity
	r.mu.Unlock()
	if on != nil {
		on(s, e)
		return
	}
	h := sha256.New()
	n, err := io.Copy(h, e.Payload)
	var res entityResult
	res.h, res.n, res.err = e.Header, n, err
	copy(res.sum[:], h.Sum(nil))
	r.entities <- res
}

const waitFor = 10 * time.Second

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// nextStatus returns the next non-cursor status.
func nextStatus(t testing.TB, r *recorder) wire.StatusFrame {
	t.Helper()
	for {
		f := recv(t, r.statuses, "a STATUS frame")
		if f.EntityID != wire.ConnectionEntity {
			return f
		}
	}
}

// pairOpts adjusts the two configs before the pair is built.
type pairOpts func(client, server *quicpeer.Config)

type pair struct {
	client, server *quicpeer.Session
	cr, sr         *recorder
	ln             *quicpeer.Listener
}

func baseConfig(t testing.TB, m mode, r quicpeer.Handler, server bool) quicpeer.Config {
	f := m.format
	c := quicpeer.Config{
		Offer:   wire.Capabilities{Layer0Core: true, SerializationFormat: &f},
		Handler: r,
	}
	if server {
		c.TLS = serverTLS(t)
	} else {
		c.TLS = clientTLS(t)
	}
	return c
}

// newPair starts a listener and dials it; both sessions are closed and
// drained at cleanup.
func newPair(t testing.TB, m mode, opts ...pairOpts) *pair {
	t.Helper()
	p := &pair{cr: newRecorder(), sr: newRecorder()}
	p.client, p.server, p.ln = newPairWith(t, m, p.cr, p.sr, opts...)
	return p
}

func newPairWith(t testing.TB, m mode, ch, sh quicpeer.Handler, opts ...pairOpts) (client, server *quicpeer.Session, ln *quicpeer.Listener) {
	t.Helper()
	cc, sc := baseConfig(t, m, ch, false), baseConfig(t, m, sh, true)
	for _, o := range opts {
		o(&cc, &sc)
	}
	ln, err := quicpeer.Listen(listenAddr(), sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	client, err = quicpeer.Dial(ctx, ln.Addr().String(), cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.CloseWithError(wire.CodeNoError, "test done")
		<-client.Done()
	})
	server, err = ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		server.CloseWithError(wire.CodeNoError, "test done")
		<-server.Done()
	})
	return client, server, ln
}

// layers turns Layer 1 and 2 on in both offers.
func layers(l1, l2 bool) pairOpts {
	return func(c, s *quicpeer.Config) {
		c.Offer.Layer1Recursive, c.Offer.Layer2Resilience = l1, l2
		s.Offer.Layer1Recursive, s.Offer.Layer2Resilience = l1, l2
	}
}

// genReader yields n deterministic pseudo-random octets.
type genReader struct {
	n, off int64
	x      uint64
}

func newGen(n int64, seed uint64) *genReader { return &genReader{n: n, x: seed | 1} }

func (g *genReader) Read(p []byte) (int, error) {
	if g.off >= g.n {
		return 0, io.EOF
	}
	if int64(len(p)) > g.n-g.off {
		p = p[:g.n-g.off]
	}
	// The stream is a function of the offset only, so any read sizes
	// produce the same bytes: 8 octets per xorshift step of block off/8.
	for i := 0; i < len(p); {
		blk := uint64(g.off+int64(i)) / 8
		x := (blk + g.x) * 0x9E3779B97F4A7C15
		x ^= x >> 31
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		o := int(uint64(g.off+int64(i)) % 8)
		i += copy(p[i:], w[o:])
	}
	g.off += int64(len(p))
	return len(p), nil
}

func genSum(n int64, seed uint64) [32]byte {
	h := sha256.New()
	io.Copy(h, newGen(n, seed))
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// header builds a root-scope entity header for n octets from seed.
func header(id uint32, n int64, seed uint64) *wire.EntityHeader {
	sum := genSum(n, seed)
	return &wire.EntityHeader{EntityID: id, PayloadLength: uint64(n), Checksum: sum[:], ContentType: "application/octet-stream"}
}

func codeOf(err error) wire.ErrorCode { return wire.CodeOf(err) }

func isCode(err error, code wire.ErrorCode) bool {
	var pe *wire.Error
	return errors.As(err, &pe) && pe.Code == code
}

func status(st wire.Status, id uint32) wire.StatusFrame {
	return wire.StatusFrame{Status: st, EntityID: id}
}

func hexBytes(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func appendStatus(f wire.StatusFrame) []byte { return f.Append(nil) }

func isStreamCode(err error, code wire.ErrorCode) bool {
	var se *quic.StreamError
	return errors.As(err, &se) && wire.ErrorCode(se.ErrorCode) == code
}
