package conformance

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// vector reads a frozen reference vector (quicpeer/wire/testdata/vectors,
// a copy of /work/shared/vectors).
func vector(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "quicpeer", "wire", "testdata", "vectors", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOfferIsReferenceDefault: the client's CAPABILITIES is byte for byte
// the reference's Capabilities::default() (valid-capabilities-default.bin).
func TestOfferIsReferenceDefault(t *testing.T) {
	o := offer()
	b, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(&o)
	if err != nil {
		t.Fatal(err)
	}
	got := wire.AppendVariable(nil, wire.FrameCapabilities, b)
	if want := vector(t, "control-cbor/valid-capabilities-default.bin"); !bytes.Equal(got, want) {
		t.Errorf("offer = %x, want the reference default %x", got, want)
	}
}

// TestNegotiatedAnswer: the server answers with the negotiated set (common
// layers, the smaller window and keepalive), never more than was offered,
// and the client refuses an answer above its offer with 0x0D.
func TestNegotiatedAnswer(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	cases := []struct {
		name       string
		peer       wire.Capabilities
		win, ka    uint64
		wantLayers bool
	}{
		{"reference default", offer(), 1024, 30_000, false},
		{"peer offers more", wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true, MaxWindowSize: u(1 << 20), KeepaliveTimeoutMs: u(60_000)}, 1024, 30_000, false},
		{"peer offers less", wire.Capabilities{Layer0Core: true, MaxWindowSize: u(10), KeepaliveTimeoutMs: u(5_000)}, 10, 5_000, false},
		{"peer omits members", wire.Capabilities{Layer0Core: true}, 1024, 30_000, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := negotiated(&c.peer)
			if n.Layer1Recursive || n.Layer2Resilience || *n.MaxWindowSize != c.win || *n.KeepaliveTimeoutMs != c.ka || *n.SerializationFormat != wire.FormatCBOR || n.MaxScopeDepth != nil || n.MaxEntitiesPerScope != nil {
				t.Errorf("answer %+v, want Layer 0 only, window %d, keepalive %d, CBOR, six members", n, c.win, c.ka)
			}
			if err := checkAnswer(&n); err != nil {
				t.Errorf("our client refuses our own answer: %v", err)
			}
		})
	}
	for _, bad := range []wire.Capabilities{
		{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true, MaxWindowSize: u(1024), KeepaliveTimeoutMs: u(30_000)},
		{Layer0Core: true, MaxWindowSize: u(2147483646), KeepaliveTimeoutMs: u(30_000)},
		{Layer0Core: true, MaxWindowSize: u(1024), KeepaliveTimeoutMs: u(60_000)},
	} {
		if err := checkAnswer(&bad); wire.CodeOf(err) != wire.CodeFrameError {
			t.Errorf("answer %+v: got %v, want PIPESTREAM_FRAME_ERROR (the reference refuses an answer above its offer)", bad, err)
		}
	}
	if err := checkAnswer(&wire.Capabilities{Layer0Core: false}); wire.CodeOf(err) != wire.CodeLayerUnsupported {
		t.Errorf("layer0-core false: got %v, want 0x0C", err)
	}
}

// pki is a throwaway CA and a server certificate for localhost/127.0.0.1
// it signed, as the reference's driver generates them.
type pki struct{ ca, cert, key string }

func newPKI(t testing.TB) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := pki{ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "server.crt"), key: filepath.Join(dir, "server.key")}
	for path, blk := range map[string]*pem.Block{p.ca: {Type: "CERTIFICATE", Bytes: caDER}, p.cert: {Type: "CERTIFICATE", Bytes: der}, p.key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// server is a Serve running in the test.
type server struct {
	addr, out string
	stdout    *syncBuffer
	done      chan error
	cancel    context.CancelFunc
}

func startServe(t *testing.T, p pki, once bool, mut func(*ServeOptions)) *server {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{out: filepath.Join(dir, "received"), stdout: &syncBuffer{}, done: make(chan error, 1), cancel: cancel}
	ready := filepath.Join(dir, "ready")
	o := ServeOptions{Bind: "127.0.0.1:0", CertFile: p.cert, KeyFile: p.key, OutputDir: s.out, ReadyFile: ready,
		Once: once, Stdout: s.stdout, Timeout: 30 * time.Second}
	if mut != nil {
		mut(&o)
	}
	go func() { s.done <- Serve(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for { // the driver's readiness loop: a non-empty ready file
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			if !strings.HasSuffix(string(b), "\n") || strings.Count(string(b), "\n") != 1 {
				t.Fatalf("ready file %q: want one line HOST:PORT\\n", b)
			}
			s.addr = strings.TrimSpace(string(b))
			break
		}
		select {
		case err := <-s.done:
			t.Fatalf("Serve returned before it was ready: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no ready file within 10 s")
		}
	}
	if _, port, err := net.SplitHostPort(s.addr); err != nil || port == "0" {
		t.Fatalf("ready file names %q, want the bound address with its real port", s.addr)
	}
	return s
}

// wait returns Serve's result (with Once).
func (s *server) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Serve --once did not return within 30 s")
		return nil
	}
}

type syncBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func (b *syncBuffer) lock() {
	if b.mu == nil {
		b.mu = make(chan struct{}, 1)
	}
	b.mu <- struct{}{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.lock()
	defer func() { <-b.mu }()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.lock()
	defer func() { <-b.mu }()
	return b.b.String()
}

func writeInput(t *testing.T, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// referencePayload is the interop driver's payload: a marker and 17
// rounds of 0..255.
func referencePayload() []byte {
	b := []byte("PipeStream interop\x00")
	for range 17 {
		for i := range 256 {
			b = append(b, byte(i))
		}
	}
	return b
}

// TestSendServeRoundTrip: Send against Serve --once, as the reference's
// driver runs a pair: the server exits 0 after the one connection, ID.bin
// holds the exact bytes and ID.parent the parent ("42\n"); without a
// parent-id no ID.parent is left (not even a stale one).
func TestSendServeRoundTrip(t *testing.T) {
	p := newPKI(t)
	payload := referencePayload()
	input := writeInput(t, payload)
	s := startServe(t, p, true, nil)
	parent := uint32(42)
	var out bytes.Buffer
	err := Send(context.Background(), SendOptions{Connect: s.addr, CAFile: p.ca, ServerName: "localhost", EntityID: 100,
		ParentID: &parent, InputFile: input, ContentType: "application/octet-stream", Stdout: &out})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if err := s.wait(t); err != nil {
		t.Fatalf("Serve --once: %v, want nil after a complete conversation", err)
	}
	if got, err := os.ReadFile(filepath.Join(s.out, "100.bin")); err != nil || !bytes.Equal(got, payload) {
		t.Errorf("100.bin: %d octets, err %v; want the %d input octets", len(got), err, len(payload))
	}
	if got, err := os.ReadFile(filepath.Join(s.out, "100.parent")); err != nil || string(got) != "42\n" {
		t.Errorf("100.parent = %q, %v; want \"42\\n\"", got, err)
	}
	if out.String() != "SENT 100 "+itoa(len(payload))+"\n" || !strings.Contains(s.stdout.String(), "RECEIVED 100 "+itoa(len(payload))+"\n") {
		t.Errorf("progress lines: send %q, serve %q", out.String(), s.stdout.String())
	}
	assertOnly(t, s.out, "100.bin", "100.parent")

	// the same ID again without a parent: the stale 100.parent goes
	s2 := startServe(t, p, true, func(o *ServeOptions) { o.OutputDir = s.out })
	if err := Send(context.Background(), SendOptions{Connect: s2.addr, CAFile: p.ca, EntityID: 100, InputFile: input}); err != nil {
		t.Fatalf("Send without parent (server name from the address): %v", err)
	}
	if err := s2.wait(t); err != nil {
		t.Fatal(err)
	}
	assertOnly(t, s.out, "100.bin")
}

func itoa(n int) string { return big.NewInt(int64(n)).String() }

// assertOnly checks that dir holds exactly names (no temporary files).
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %v, want exactly %v", dir, got, names)
	}
}

// rawClient runs the client conversation up to and including the entity
// stream with frame as the stream's bytes, and returns how the connection
// ended (the server's close).
func rawClient(t *testing.T, p pki, addr string, id uint32, frame []byte) error {
	t.Helper()
	b, _ := os.ReadFile(p.ca)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}, quicConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	ctl, _ := conn.OpenStreamSync(ctx)
	c := newControl(ctl)
	_ = c.writeCapabilities(offer())
	if f, err := c.next("caps"); err != nil || f.Type != wire.FrameCapabilities {
		t.Fatalf("server CAPABILITIES: %v %v", f.Type, err)
	}
	_ = c.writeHeartbeat()
	_ = c.writeStatus(wire.StatusPending, id)
	us, _ := conn.OpenUniStreamSync(ctx)
	_, _ = us.Write(frame)
	_ = us.Close()
	for {
		if _, err := c.next("anything"); err != nil {
			select {
			case <-conn.Context().Done():
				return context.Cause(conn.Context())
			case <-time.After(5 * time.Second):
				return err
			}
		}
	}
}

func entityFrame(id uint32, parent *uint32, payload []byte, mut func(*wire.EntityHeader)) []byte {
	sum := sha256.Sum256(payload)
	h := wire.EntityHeader{EntityID: id, ParentID: parent, ContentType: "application/octet-stream", PayloadLength: uint64(len(payload)), Checksum: sum[:]}
	if mut != nil {
		mut(&h)
	}
	var buf bytes.Buffer
	if err := wire.WriteEntityHeader(&buf, wire.CodecFor(wire.FormatCBOR), &h); err != nil {
		panic(err)
	}
	return append(buf.Bytes(), payload...)
}

func closeCode(err error) (uint64, bool) {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) {
		return uint64(ae.ErrorCode), true
	}
	return 0, false
}

// TestServeRefusesBadEntity: an entity stream that fails verification
// leaves no ID.bin, no ID.parent and no temporary file; the connection is
// closed with the draft's code and Serve --once returns the refusal.
func TestServeRefusesBadEntity(t *testing.T) {
	p := newPKI(t)
	payload := referencePayload()
	parent := uint32(42)
	bad := entityFrame(7, &parent, payload, nil)
	bad[len(bad)-1] ^= 0xFF // corrupt the last payload octet: the checksum no longer matches
	cases := []struct {
		name  string
		id    uint32
		frame []byte
		code  wire.ErrorCode
		max   int64
	}{
		{"checksum mismatch", 7, bad, wire.CodeIntegrityError, 0},
		{"payload shorter than payload-length", 7, entityFrame(7, &parent, payload, nil)[:len(bad)-10], wire.CodeEntityInvalid, 0},
		{"payload longer than payload-length", 7, append(entityFrame(7, &parent, payload, nil), 'x'), wire.CodeEntityInvalid, 0},
		{"payload-length above --max-payload", 7, entityFrame(7, nil, payload, nil), wire.CodeEntityTooLarge, 1024},
		{"entity other than announced", 7, entityFrame(8, nil, payload, nil), wire.CodeEntityInvalid, 0},
		{"reserved entity-id", 0xFFFFFFFD, entityFrame(0xFFFFFFFD, nil, payload, nil), wire.CodeEntityInvalid, 0},
		{"header length beyond the limit", 7, binary.BigEndian.AppendUint32(nil, 1<<20), wire.CodeEntityTooLarge, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := startServe(t, p, true, func(o *ServeOptions) { o.MaxPayload = c.max })
			cerr := rawClient(t, p, s.addr, c.id, c.frame)
			err := s.wait(t)
			if wire.CodeOf(err) != c.code {
				t.Errorf("Serve --once returned %v, want code %s", err, c.code)
			}
			if code, ok := closeCode(cerr); !ok || code != uint64(c.code) {
				t.Errorf("the client saw %v, want a close with %s", cerr, c.code)
			}
			assertOnly(t, s.out)
		})
	}
}

// TestServeGracefulEndWithoutGoAway: a client that closes with 0x00 right
// after COMPLETE (no CHECKPOINT, cursor update or GOAWAY) ends the
// conversation gracefully: the entity is stored and Serve --once returns
// nil. A client that closes with an error code instead makes it fail,
// though the entity, verified and COMPLETE, stays stored.
func TestServeGracefulEndWithoutGoAway(t *testing.T) {
	p := newPKI(t)
	for _, c := range []struct {
		code uint64
		ok   bool
	}{{0, true}, {uint64(wire.CodeInternalError), false}} {
		s := startServe(t, p, true, nil)
		b, _ := os.ReadFile(p.ca)
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		conn, err := quic.DialAddr(ctx, s.addr, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}, quicConfig())
		if err != nil {
			t.Fatal(err)
		}
		ctl, _ := conn.OpenStreamSync(ctx)
		cl := newControl(ctl)
		_ = cl.writeCapabilities(offer())
		if f, err := cl.next("caps"); err != nil || f.Type != wire.FrameCapabilities {
			t.Fatalf("server CAPABILITIES: %v %v", f.Type, err)
		}
		_ = cl.writeStatus(wire.StatusPending, 9)
		us, _ := conn.OpenUniStreamSync(ctx)
		_, _ = us.Write(entityFrame(9, nil, []byte("nine"), nil))
		_ = us.Close()
		for _, want := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
			if st, err := cl.status("status"); err != nil || st.Status != want {
				t.Fatalf("got %v %v, want %s", st.Status, err, want)
			}
		}
		_ = conn.CloseWithError(quic.ApplicationErrorCode(c.code), "bye")
		cancel()
		if err := s.wait(t); (err == nil) != c.ok {
			t.Errorf("client closed with 0x%02X after COMPLETE: Serve returned %v, want success %v", c.code, err, c.ok)
		}
		assertOnly(t, s.out, "9.bin")
	}
}

// TestServeWithoutOnceKeepsServing: a refused connection does not stop a
// server without --once; the next client is served; ending the context
// ends Serve with nil.
func TestServeWithoutOnceKeepsServing(t *testing.T) {
	p := newPKI(t)
	s := startServe(t, p, false, nil)
	bad := entityFrame(5, nil, []byte("abc"), nil)
	bad[len(bad)-1] = 'x'
	_ = rawClient(t, p, s.addr, 5, bad)
	input := writeInput(t, []byte("second client"))
	if err := Send(context.Background(), SendOptions{Connect: s.addr, CAFile: p.ca, ServerName: "localhost", EntityID: 6, InputFile: input}); err != nil {
		t.Fatalf("Send after a refused connection: %v", err)
	}
	assertOnly(t, s.out, "6.bin")
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			t.Errorf("Serve after its context ended: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}

// TestServeOnceStoppedEarly: a serve --once stopped before any client
// came is not a success.
func TestServeOnceStoppedEarly(t *testing.T) {
	s := startServe(t, newPKI(t), true, nil)
	s.cancel()
	if err := s.wait(t); err == nil {
		t.Error("Serve --once stopped before a connection returned nil, want an error")
	}
	assertOnly(t, s.out)
}

// TestSendRefusals: bad arguments are refused before any connection, and
// a server that is not there is an error, not a hang.
func TestSendRefusals(t *testing.T) {
	p := newPKI(t)
	input := writeInput(t, make([]byte, 2048))
	zero := uint32(0)
	for name, o := range map[string]SendOptions{
		"entity-id 0":        {Connect: "127.0.0.1:1", CAFile: p.ca, EntityID: 0, InputFile: input},
		"reserved entity-id": {Connect: "127.0.0.1:1", CAFile: p.ca, EntityID: 0xFFFFFFFF, InputFile: input},
		"parent-id 0":        {Connect: "127.0.0.1:1", CAFile: p.ca, EntityID: 1, ParentID: &zero, InputFile: input},
		"input too large":    {Connect: "127.0.0.1:1", CAFile: p.ca, EntityID: 1, InputFile: input, MaxPayload: 1024},
		"no input":           {Connect: "127.0.0.1:1", CAFile: p.ca, EntityID: 1, InputFile: filepath.Join(t.TempDir(), "none")},
		"CA without PEM":     {Connect: "127.0.0.1:1", CAFile: input, EntityID: 1, InputFile: input},
		"nobody listening":   {Connect: "127.0.0.1:9", CAFile: p.ca, EntityID: 1, InputFile: input, Timeout: 2 * time.Second},
	} {
		if err := Send(context.Background(), o); err == nil {
			t.Errorf("%s: Send succeeded", name)
		}
	}
}

// BenchmarkSendServe: one entity per connection, Send against a Serve
// without --once, as the matrix runs a pair (handshake, conversation,
// payload verified into ID.bin). -benchmem shows that memory does not grow
// with the payload: it is streamed, never held whole.
func BenchmarkSendServe(b *testing.B) {
	for _, size := range []int{4 << 10, 8 << 20} {
		b.Run(itoa(size>>10)+"KiB", func(b *testing.B) {
			p := newPKI(b)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dir := b.TempDir()
			ready := filepath.Join(dir, "ready")
			done := make(chan error, 1)
			go func() {
				done <- Serve(ctx, ServeOptions{Bind: "127.0.0.1:0", CertFile: p.cert, KeyFile: p.key, OutputDir: filepath.Join(dir, "out"), ReadyFile: ready})
			}()
			var addr string
			for addr == "" {
				if bs, err := os.ReadFile(ready); err == nil && len(bs) > 0 {
					addr = strings.TrimSpace(string(bs))
				}
				time.Sleep(5 * time.Millisecond)
			}
			input := filepath.Join(dir, "payload.bin")
			if err := os.WriteFile(input, bytes.Repeat([]byte("pipestream"), size/10+1)[:size], 0o600); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := Send(ctx, SendOptions{Connect: addr, CAFile: p.ca, ServerName: "localhost", EntityID: uint32(i%1000 + 1), InputFile: input}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cancel()
			<-done
		})
	}
}

// rawStream0 dials addr, optionally completes the CAPABILITIES exchange,
// writes b on stream 0 and returns how the server closed the connection.
func rawStream0(t *testing.T, p pki, addr string, caps bool, b []byte) error {
	t.Helper()
	pem, _ := os.ReadFile(p.ca)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}, quicConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	ctl, _ := conn.OpenStreamSync(ctx)
	c := newControl(ctl)
	if caps {
		_ = c.writeCapabilities(offer())
		if f, err := c.next("caps"); err != nil || f.Type != wire.FrameCapabilities {
			t.Fatalf("server CAPABILITIES: %v %v", f.Type, err)
		}
	}
	_, _ = ctl.Write(b)
	select {
	case <-conn.Context().Done():
		return context.Cause(conn.Context())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestServeRefusesBadControl: stream 0 that breaks the conversation is
// refused with the reference's code, from the declared length where there
// is one (nothing read or allocated from it), and nothing is written.
func TestServeRefusesBadControl(t *testing.T) {
	p := newPKI(t)
	d04 := func(f wire.StatusFrame) []byte { return wire.AppendDraft04(nil, f.Append(nil)) }
	noL0 := func() []byte {
		w, ka := uint64(1024), uint64(30_000)
		b, _ := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(&wire.Capabilities{Layer0Core: false, MaxWindowSize: &w, KeepaliveTimeoutMs: &ka})
		return wire.AppendVariable(nil, wire.FrameCapabilities, b)
	}
	d02Pending := wire.StatusFrame{Status: wire.StatusPending, EntityID: 7}
	cases := []struct {
		name string
		caps bool
		b    []byte
		code wire.ErrorCode
	}{
		{"first frame not CAPABILITIES", false, d04(wire.StatusFrame{Status: wire.StatusPending, EntityID: 7}), wire.CodeFrameError},
		{"CAPABILITIES declaring 16 MiB", false, []byte{byte(wire.FrameCapabilities), 0x01, 0, 0, 0}, wire.CodeEntityTooLarge},
		{"layer0-core false", false, noL0(), wire.CodeLayerUnsupported},
		{"draft-02 framed PENDING", true, d02Pending.Append(nil), wire.CodeEntityTooLarge},
		{"PENDING with a scope", true, d04(wire.StatusFrame{Status: wire.StatusPending, EntityID: 7, ScopeID: 5}), wire.CodeLayerUnsupported},
		{"COMPLETE instead of PENDING", true, d04(wire.StatusFrame{Status: wire.StatusComplete, EntityID: 7}), wire.CodeEntityInvalid},
		{"Layer 2 status", true, d04(wire.StatusFrame{Status: wire.StatusAbandoned, EntityID: 7}), wire.CodeLayerUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := startServe(t, p, true, nil)
			cerr := rawStream0(t, p, s.addr, c.caps, c.b)
			err := s.wait(t)
			if wire.CodeOf(err) != c.code {
				t.Errorf("Serve --once returned %v, want code %s", err, c.code)
			}
			if code, ok := closeCode(cerr); !ok || code != uint64(c.code) {
				t.Errorf("the client saw %v, want a close with %s", cerr, c.code)
			}
			assertOnly(t, s.out)
		})
	}
}

// TestServeTimesOutSilentClient: a client that connects and says nothing
// holds the server for --timeout, not forever.
func TestServeTimesOutSilentClient(t *testing.T) {
	p := newPKI(t)
	s := startServe(t, p, true, func(o *ServeOptions) { o.Timeout = 300 * time.Millisecond })
	cerr := rawStream0(t, p, s.addr, true, nil) // CAPABILITIES, then silence
	if err := s.wait(t); err == nil || !strings.Contains(err.Error(), "--timeout") {
		t.Errorf("Serve --once returned %v for a silent client, want the error naming --timeout", err)
	}
	if code, ok := closeCode(cerr); !ok || code != uint64(wire.CodeInternalError) {
		t.Errorf("the client saw %v, want a close with PIPESTREAM_INTERNAL_ERROR naming the timeout", cerr)
	}
	assertOnly(t, s.out)
}
