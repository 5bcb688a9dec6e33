package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// `gateway conformance serve|send`: the standalone command contract of the
// reference suite (ai-pipestream/pipestream-quic-protocol-rfc,
// conformance/README.md), run the way its process driver runs a Layer 0
// pair (conformance/src/main.rs `one_pair`): a CA and a server certificate
// for localhost, `serve --bind 127.0.0.1:0 ... --once`, readiness = a
// non-empty ready file holding the address, then `send ... --parent-id 42`,
// both exit 0, and the driver compares ID.bin byte for byte and the
// trimmed ID.parent with "42". Our send against our serve, and each
// against the independent draft-04 partners of interop_partner_d04_test.go
// (the reference's conversation, as strict as its decoder).

// conformancePKI is the driver's certificates(): a CA and a server
// certificate for localhost (and 127.0.0.1, the address the partner
// client verifies) signed by it.
type conformancePKI struct{ dir, ca, cert, key string }

func newConformancePKI(t *testing.T) conformancePKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "PipeStream-Conformance-CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := conformancePKI{dir: dir, ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "server.crt"), key: filepath.Join(dir, "server.key")}
	for path, blk := range map[string]*pem.Block{p.ca: {Type: "CERTIFICATE", Bytes: caDER},
		p.cert: {Type: "CERTIFICATE", Bytes: der}, p.key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// interopPayload is the driver's payload: "PipeStream interop\0" and 17
// rounds of the octets 0..255 (4371 octets).
func interopPayload() []byte {
	b := []byte("PipeStream interop\x00")
	for range 17 {
		for i := range 256 {
			b = append(b, byte(i))
		}
	}
	return b
}

// conformanceServe is a running `gateway conformance serve --once`.
type conformanceServe struct {
	p    *proc
	addr string
	out  string // --output-dir
}

// startConformanceServe starts serve as the driver's start_server does and
// waits for its readiness boundary: a non-empty ready file.
func startConformanceServe(t *testing.T, pk conformancePKI) *conformanceServe {
	t.Helper()
	root := t.TempDir()
	out, ready := filepath.Join(root, "received"), filepath.Join(root, "ready")
	p := startProc(t, "conformance-serve", root, "conformance", "serve", "--bind", "127.0.0.1:0",
		"--cert", pk.cert, "--key", pk.key, "--output-dir", out, "--ready-file", ready, "--once")
	t.Cleanup(p.stop)
	attachLog(t, p)
	var addr string
	waitFor(t, "the ready file", startTimeout, func() bool {
		if p.exited() {
			t.Fatalf("serve exited before readiness: %v", p.waitErr)
		}
		b, err := os.ReadFile(ready)
		addr = strings.TrimSpace(string(b))
		return err == nil && len(b) > 0
	})
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "0" {
		t.Fatalf("ready file holds %q, want the bound HOST:PORT", addr)
	}
	return &conformanceServe{p: p, addr: addr, out: out}
}

// exitCode waits for serve --once to exit (the driver allows 30 s).
func (s *conformanceServe) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-s.p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve --once did not exit within 30 s of its connection")
	}
	return s.p.cmd.ProcessState.ExitCode()
}

// files lists the output directory.
func (s *conformanceServe) files() []string {
	ents, _ := os.ReadDir(s.out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// runConformanceSend runs `gateway conformance send` and returns its
// exit code, stdout and stderr.
func runConformanceSend(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // the driver's client timeout
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), append([]string{"conformance", "send"}, args...)...)
	cmd.Env = append(os.Environ(), "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("run send: %v", err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func writePayload(t *testing.T, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkStored is the driver's check: ID.bin is the payload; ID.parent,
// trimmed, is the parent (or absent without one); nothing else is left.
func checkStored(t *testing.T, s *conformanceServe, id uint32, payload []byte, parent string) {
	t.Helper()
	bin := fmt.Sprintf("%d.bin", id)
	if got, err := os.ReadFile(filepath.Join(s.out, bin)); err != nil || !bytes.Equal(got, payload) {
		t.Errorf("%s: %d octets (%v), want the %d payload octets byte for byte", bin, len(got), err, len(payload))
	}
	want := []string{bin}
	if parent != "" {
		pf := fmt.Sprintf("%d.parent", id)
		if got, err := os.ReadFile(filepath.Join(s.out, pf)); err != nil || strings.TrimSpace(string(got)) != parent {
			t.Errorf("%s = %q (%v), want %q", pf, got, err, parent)
		}
		want = append(want, pf)
	}
	if got := s.files(); !slices.Equal(got, want) {
		t.Errorf("output directory holds %v, want exactly %v", got, want)
	}
}

// TestConformanceCommand: the Layer 0 matrix cells this binary takes part
// in, and the refusal of a corrupted entity.
func TestConformanceCommand(t *testing.T) {
	t.Parallel()
	payload := interopPayload()
	input := writePayload(t, payload)
	t.Run("send to serve", func(t *testing.T) { testSendToServe(t, payload, input) })
	t.Run("send to partner server", func(t *testing.T) { testSendToPartnerServer(t, payload, input) })
	t.Run("partner client to serve", func(t *testing.T) { testPartnerClientToServe(t, payload) })
	t.Run("partner client corrupted checksum", func(t *testing.T) { testPartnerClientCorrupted(t, payload) })
	t.Run("send to gateway peer", func(t *testing.T) { testSendToGatewayPeer(t, input) })
	t.Run("bad flags", func(t *testing.T) { testSendBadFlags(t, input) })
}

// testSendToServe: our send against our serve --once, with and without a
// parent-id.
func testSendToServe(t *testing.T, payload []byte, input string) {
	pk := newConformancePKI(t)
	for _, c := range []struct {
		id     uint32
		parent string
	}{{100, "42"}, {101, ""}} {
		s := startConformanceServe(t, pk)
		args := []string{"--connect", s.addr, "--ca", pk.ca, "--server-name", "localhost",
			"--entity-id", fmt.Sprint(c.id), "--input", input, "--content-type", "application/octet-stream"}
		if c.parent != "" {
			args = append(args, "--parent-id", c.parent)
		}
		code, stdout, stderr := runConformanceSend(t, args...)
		if code != 0 {
			t.Fatalf("send (entity %d): exit %d\nstdout: %s\nstderr: %s", c.id, code, stdout, stderr)
		}
		if want := fmt.Sprintf("SENT %d %d", c.id, len(payload)); !strings.Contains(stdout, want) {
			t.Errorf("send stdout %q, want %q", stdout, want)
		}
		if code := s.exitCode(t); code != 0 {
			t.Fatalf("serve --once: exit %d after a complete conversation, want 0", code)
		}
		checkStored(t, s, c.id, payload, c.parent)
	}
}

// testSendToPartnerServer: our send against the reference server
// conversation (strict decoders): the partner got the exact payload and
// parent-id in a header of the reference's members, then the CHECKPOINT
// and cursor update for ID+1.
func testSendToPartnerServer(t *testing.T, payload []byte, input string) {
	srv := startD04Server(t)
	code, stdout, stderr := runConformanceSend(t, "--connect", srv.addr, "--ca", srv.caPEM, "--server-name", "localhost",
		"--entity-id", "102", "--parent-id", "42", "--input", input, "--content-type", "application/octet-stream")
	if _, errs, _ := srv.snapshot(); code != 0 {
		t.Fatalf("send against the reference server conversation: exit %d\nstdout: %s\nstderr: %s\npartner errors: %s", code, stdout, stderr, errorsText(errs))
	}
	if err := srv.wait(ctxT(t, 10*time.Second), "the partner's session", func() bool { return len(srv.sessions) == 1 }); err != nil {
		t.Fatal(err)
	}
	sess, errs, conns := srv.snapshot()
	s := sess[0]
	e := s.entity
	switch {
	case conns != 1 || len(errs) != 0:
		t.Errorf("partner: %d connections, errors %s; want one clean session", conns, errorsText(errs))
	case s.pending != 102 || e.hdr.EntityID != 102:
		t.Errorf("PENDING %d, entity %d; want 102", s.pending, e.hdr.EntityID)
	case e.hdr.ParentID == nil || *e.hdr.ParentID != 42:
		t.Errorf("parent-id %v, want 42", e.hdr.ParentID)
	case !bytes.Equal(e.payload, payload):
		t.Errorf("payload: %d octets, want the %d input octets", len(e.payload), len(payload))
	case e.hdr.ContentType != "application/octet-stream":
		t.Errorf("content-type %q", e.hdr.ContentType)
	case s.checkpoint == nil || s.checkpoint.EntityID != 103 || s.cursor != 103:
		t.Errorf("checkpoint %+v, cursor %d; want CHECKPOINT and cursor update for 103", s.checkpoint, s.cursor)
	case !capsEqual(s.clientCaps, referenceCaps()):
		t.Errorf("send offered %x, want the reference default %x", mustCBOR(s.clientCaps), mustCBOR(referenceCaps()))
	}
	for _, k := range e.keys {
		if !slices.Contains(d04HeaderMembers, k) {
			t.Errorf("entity header member %q is not one of the reference's six", k)
		}
	}
}

// testPartnerClientToServe: the reference client conversation against our
// serve --once, with parent-id 42.
func testPartnerClientToServe(t *testing.T, payload []byte) {
	pk := newConformancePKI(t)
	s := startConformanceServe(t, pk)
	parent := uint32(42)
	rep, err := runD04ClientFrame(ctxT(t, 30*time.Second), s.addr, pk.ca, 103, referenceEntity(103, &parent, payload, "application/octet-stream"))
	if err != nil {
		t.Fatalf("the reference client conversation against serve: %v (statuses %v)", err, rep.statuses)
	}
	if !capsEqual(rep.serverCaps, referenceCaps()) || rep.goaway != 103 || rep.ack.EntityID != 104 {
		t.Errorf("serve answered CAPABILITIES %x (want %x), GOAWAY %d, CHECKPOINT ack %+v", mustCBOR(rep.serverCaps), mustCBOR(referenceCaps()), rep.goaway, rep.ack)
	}
	if code := s.exitCode(t); code != 0 {
		t.Fatalf("serve --once: exit %d, want 0", code)
	}
	checkStored(t, s, 103, payload, "42")
}

// testPartnerClientCorrupted: the reference client conversation with one
// payload octet flipped: serve closes with 0x04, exits 1 naming the
// error, and leaves the output directory empty.
func testPartnerClientCorrupted(t *testing.T, payload []byte) {
	pk := newConformancePKI(t)
	s := startConformanceServe(t, pk)
	parent := uint32(42)
	frame := referenceEntity(104, &parent, payload, "application/octet-stream")
	frame[len(frame)-1] ^= 0xFF // the last payload octet: the header's SHA-256 no longer matches
	_, err := runD04ClientFrame(ctxT(t, 30*time.Second), s.addr, pk.ca, 104, frame)
	if code, remote := closeCode(err); code != errIntegrity || !remote {
		t.Errorf("the client's conversation ended with %v, want the server's close with PIPESTREAM_INTEGRITY_ERROR (0x04)", err)
	}
	if code := s.exitCode(t); code != 1 {
		t.Errorf("serve --once: exit %d after a refused entity, want 1", code)
	}
	if !s.p.logContains("PIPESTREAM_INTEGRITY_ERROR") {
		t.Errorf("serve's stderr does not name PIPESTREAM_INTEGRITY_ERROR")
	}
	if got := s.files(); len(got) != 0 {
		t.Errorf("output directory holds %v after a corrupted entity, want nothing (no ID.bin, no ID.parent, no partial file)", got)
	}
}

// testSendBadFlags: a missing or reserved ID is a usage error (exit 2).
func testSendBadFlags(t *testing.T, input string) {
	for _, args := range [][]string{
		{"--connect", "127.0.0.1:1", "--ca", input, "--input", input},                     // no --entity-id
		{"--connect", "127.0.0.1:1", "--ca", input, "--input", input, "--entity-id", "0"}, // reserved
		{"--connect", "127.0.0.1:1", "--ca", input, "--input", input, "--entity-id", "1", "--parent-id", "4294967295"},
	} {
		if code, _, stderr := runConformanceSend(t, args...); code != 2 || stderr == "" {
			t.Errorf("send %v: exit %d (%q), want 2 with a message", args, code, stderr)
		}
	}
}

// capsEqual compares two capabilities by their canonical CBOR.
func capsEqual(a, b capsD04) bool { return bytes.Equal(mustCBOR(a), mustCBOR(b)) }

// runD04ClientFrame runs the reference client conversation (runD04Client)
// with frame as the entity stream's bytes, for entities the reference's
// own encoder would never produce (a corrupted checksum). On an error it
// returns how the connection ended when the server closed it.
func runD04ClientFrame(ctx context.Context, addr, caPEM string, id uint32, frame []byte) (d04ClientReport, error) {
	conn, err := dialPartnerConfig(ctx, addr, caPEM, quinnLikeConfig())
	if err != nil {
		return d04ClientReport{}, err
	}
	c := &d04Client{conn: conn}
	if err := c.converseFrame(ctx, id, frame); err != nil {
		select { // the server's close, when it closed
		case <-conn.Context().Done():
			err = context.Cause(conn.Context())
		case <-time.After(5 * time.Second):
		}
		closeFor(conn, err)
		return c.rep, err
	}
	_ = conn.CloseWithError(errNoError, "complete")
	return c.rep, nil
}

func (c *d04Client) converseFrame(ctx context.Context, id uint32, frame []byte) error {
	if err := c.capabilities(ctx); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if _, err := c.ctl.Write(encodeStatus(framingD04, connLevel, stUnspecified, nil)); err != nil {
		return err
	}
	if _, err := c.ctl.Write(encodeStatus(framingD04, id, stPending, nil)); err != nil {
		return err
	}
	s, err := c.conn.OpenUniStreamSync(ctx)
	if err != nil {
		return err
	}
	if _, err := s.Write(frame); err != nil {
		return err
	}
	if err := s.Close(); err != nil {
		return err
	}
	for _, want := range []uint8{stProcessing, stComplete} {
		st, err := readStatusD04(c.ctl, "entity status")
		if err != nil {
			return err
		}
		if st.entity != id || st.stat != want {
			return perr(errEntityInvalid, "unexpected status response %v, want STATUS(%d %s)", st, id, statusName(want))
		}
		c.rep.statuses = append(c.rep.statuses, st)
	}
	return c.finish(id)
}

// testSendToGatewayPeer: our send against `gateway peer` (default and
// draft-04 framing): the peer answers the negotiated set (issue 20 item
// 2), so the whole reference conversation completes.
func testSendToGatewayPeer(t *testing.T, input string) {
	for _, args := range [][]string{nil, {"--framing", "draft-04"}} {
		addr, cert, _ := startPeer(t, args...)
		code, stdout, stderr := runConformanceSend(t, "--connect", addr, "--ca", cert, "--server-name", "localhost",
			"--entity-id", "7", "--parent-id", "42", "--input", input)
		if code != 0 {
			t.Errorf("send against gateway peer %v: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
		}
	}
}
