package main_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestHashToken: the verb reads the token from stdin and prints a line the
// token file accepts; --generate makes one.
func TestHashToken(t *testing.T) {
	cmd := exec.Command(bin, "hash-token", "acme")
	cmd.Stdin = strings.NewReader("s3cret\n")
	out, err := cmd.Output()
	sum := sha256.Sum256([]byte("s3cret"))
	if want := "sha256:" + hex.EncodeToString(sum[:]) + " acme\n"; err != nil || string(out) != want {
		t.Fatalf("hash-token: %q %v", out, err)
	}
	cmd = exec.Command(bin, "hash-token", "acme")
	cmd.Stdin = strings.NewReader("s3cret")
	out2, _ := cmd.Output()
	if !bytes.Equal(out, out2) {
		t.Errorf("with and without a trailing newline: %q vs %q", out, out2)
	}
	cmd = exec.Command(bin, "hash-token", "--generate", "globex")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil || !strings.HasSuffix(string(out), " globex\n") || !strings.Contains(stderr.String(), "shown once") {
		t.Errorf("--generate: %q %q %v", out, stderr.String(), err)
	}
	cmd = exec.Command(bin, "hash-token", "acme")
	cmd.Stdin = strings.NewReader("")
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), "no token on stdin") {
		t.Errorf("empty stdin: %q %v", b, err)
	}
	cmd = exec.Command(bin, "hash-token", "bad/tenant")
	cmd.Stdin = strings.NewReader("x")
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), "only letters") {
		t.Errorf("bad tenant: %q %v", b, err)
	}
}

// TestServeRefusesNonLoopbackWithoutAuth: docs/architecture.md, "Security and limits", checked
// before anything starts.
func TestServeRefusesNonLoopbackWithoutAuth(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--grpc-addr", "0.0.0.0:0"},
		{"--http-addr", ":0"},
	} {
		_, stderr, code := run(t, nil, append([]string{"serve", "--data-dir", dir}, args...)...)
		if code != 1 || !strings.Contains(stderr, "--insecure-no-auth") || !strings.Contains(stderr, "--auth-tokens") {
			t.Errorf("serve %v: exit %d %s, want 1 naming --auth-tokens and --insecure-no-auth", args, code, stderr)
		}
	}
}

// certs for mutual TLS: a CA and a client certificate it issued.
func writeClientCerts(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gateways CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "gateway-1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	for f, b := range map[string][]byte{
		caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// proc is a started binary whose stderr is collected.
type proc struct {
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan error
}

type lockedBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func newLockedBuffer() *lockedBuffer { return &lockedBuffer{mu: make(chan struct{}, 1)} }

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.b.String()
}

func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), logs: newLockedBuffer(), exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

func healthz(base string) int {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(base + "/healthz")
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// TestClaimIsolationOverMutualTLS runs a standalone peer that requires
// client certificates (real QUIC): a gateway with --peer-cert/--peer-key
// gets a session, one without never does. Over the working gateway, with
// two token-file tenants, a claim check issued to one tenant's document
// answers NotFound to the other (gRPC and REST) and is redeemed by its
// owner.
func TestClaimIsolationOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeClientCerts(t, dir)
	udp := freeUDP(t)
	peerDir := filepath.Join(dir, "peer")
	peer := startProc(t, "peer", "--listen", udp, "--data-dir", peerDir, "--client-ca", caFile)
	pin := filepath.Join(peerDir, "peer-cert.pem")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(peer.logs.String(), "peer listening (QUIC)") {
		if time.Now().After(deadline) {
			t.Fatalf("peer did not start:\n%s", peer.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	tokens := writeTwoTenantTokens(t, dir)

	grpcAddr, httpAddr := freePort(t), freePort(t)
	gw := startProc(t, "serve", "--peer", udp, "--peer-ca", pin, "--peer-cert", certFile, "--peer-key", keyFile,
		"--auth-tokens", tokens, "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--data-dir", filepath.Join(dir, "gw1"))
	badHTTP := freePort(t)
	bad := startProc(t, "serve", "--peer", udp, "--peer-ca", pin,
		"--grpc-addr", freePort(t), "--http-addr", badHTTP, "--data-dir", filepath.Join(dir, "gw2"))
	base := "http://" + httpAddr
	deadline = time.Now().Add(30 * time.Second)
	for healthz(base) != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway with a client certificate never became ready\n%s\npeer:\n%s", gw.logs.String(), peer.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	docs := gatewayv1.NewDocumentServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acme := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-acme")
	globex := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-globex")

	doc, err := docs.SubmitDocument(acme, &gatewayv1.SubmitDocumentRequest{
		Content: []byte("aaaaaaaaa\nbbbbbbbbb\nccccccccc\nddddddddd\n"), ContentType: "text/plain",
		Split:            &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 10, Processor: "fault"},
		CompletionPolicy: &gatewayv1.CompletionPolicy{Mode: gatewayv1.CompletionPolicy_STRICT},
		Metadata:         map[string]string{"pipestream.fault": "defer", "pipestream.fault-chunks": "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	claim := waitClaim(ctx, t, docs, acme, doc.Id)

	checkClaimHidden(ctx, t, docs, globex, base, claim.ClaimId)
	rc, err := docs.RedeemClaimCheck(acme, &gatewayv1.RedeemClaimCheckRequest{ClaimId: claim.ClaimId})
	if err != nil || rc.State != gatewayv1.ClaimCheck_REDEEMED {
		t.Fatalf("owner's redemption: %v %v", rc, err)
	}
	waitDocument(ctx, t, docs, acme, doc.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_SUCCEEDED },
		"document after redemption")

	// The gateway without a client certificate has had the whole test to
	// connect; the peer refused every handshake.
	if !strings.Contains(bad.logs.String(), "certificate required") {
		t.Errorf("the refused gateway does not log the peer's TLS refusal (certificate required):\n%s", bad.logs.String())
	}
	if code := healthz("http://" + badHTTP); code != 503 {
		t.Errorf("a gateway without a client certificate: /healthz %d, want 503 (no session with a --client-ca peer)\n%s", code, bad.logs.String())
	}
}

// writeTwoTenantTokens writes a token file ('gateway hash-token' lines)
// mapping tok-acme to tenant acme and tok-globex to globex.
func writeTwoTenantTokens(t *testing.T, dir string) string {
	t.Helper()
	tokens := filepath.Join(dir, "tokens")
	var lines []string
	for tok, tenant := range map[string]string{"tok-acme": "acme", "tok-globex": "globex"} {
		cmd := exec.Command(bin, "hash-token", tenant)
		cmd.Stdin = strings.NewReader(tok)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(out))
	}
	if err := os.WriteFile(tokens, []byte("# two tenants\n"+strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	return tokens
}

// waitClaim polls document id until it lists a claim check and returns
// the first.
func waitClaim(ctx context.Context, t *testing.T, docs gatewayv1.DocumentServiceClient, as context.Context, id string) *gatewayv1.ClaimCheck {
	t.Helper()
	d := waitDocument(ctx, t, docs, as, id, func(d *gatewayv1.Document) bool { return len(d.ClaimChecks) > 0 }, "no claim check issued")
	return d.ClaimChecks[0]
}

// waitDocument polls document id as the caller of context as until done
// holds for it, failing with what and the document when ctx ends.
func waitDocument(ctx context.Context, t *testing.T, docs gatewayv1.DocumentServiceClient, as context.Context, id string, done func(*gatewayv1.Document) bool, what string) *gatewayv1.Document {
	t.Helper()
	for {
		d, err := docs.GetDocument(as, &gatewayv1.GetDocumentRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		if done(d) {
			return d
		}
		if ctx.Err() != nil {
			t.Fatalf("%s; document %v", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkClaimHidden checks that claim answers NotFound to tenant globex
// (as over gRPC, its token over REST) and Unauthenticated without a token
// (ctx).
func checkClaimHidden(ctx context.Context, t *testing.T, docs gatewayv1.DocumentServiceClient, as context.Context, base, claim string) {
	t.Helper()
	if _, err := docs.GetClaimCheck(as, &gatewayv1.GetClaimCheckRequest{ClaimId: claim}); status.Code(err) != codes.NotFound {
		t.Errorf("GetClaimCheck of another tenant's claim: %v, want NotFound", err)
	}
	if _, err := docs.RedeemClaimCheck(as, &gatewayv1.RedeemClaimCheckRequest{ClaimId: claim}); status.Code(err) != codes.NotFound {
		t.Errorf("RedeemClaimCheck of another tenant's claim: %v, want NotFound", err)
	}
	for _, r := range []struct{ method, path string }{{"GET", "/v1/claims/" + claim}, {"POST", "/v1/claims/" + claim + ":redeem"}} {
		req, _ := http.NewRequest(r.method, base+r.path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer tok-globex")
		c := &http.Client{Transport: &http.Transport{}}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.CloseIdleConnections()
		if resp.StatusCode != 404 {
			t.Errorf("REST %s %s as another tenant: HTTP %d %s, want 404", r.method, r.path, resp.StatusCode, b)
		}
	}
	if _, err := docs.GetClaimCheck(ctx, &gatewayv1.GetClaimCheckRequest{ClaimId: claim}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetClaimCheck without a token: %v, want Unauthenticated", err)
	}
}
