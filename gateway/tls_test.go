package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a server certificate for localhost / 127.0.0.1 and its key
// to dir and returns the paths.
func (ca *testCA) issue(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "gw.pem"), filepath.Join(dir, "gw-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestTLSListeners: with a CA-issued certificate both listeners speak TLS;
// gRPC, REST (whose proxy dials the gRPC listener over TLS) and the
// WebSocket work for a client that trusts the CA; plaintext and untrusting
// clients fail.
func TestTLSListeners(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	tc, err := gateway.ServerTLSFiles(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.GRPCTLS, c.HTTPTLS, c.InternalDialTLS = tc.GRPC, tc.HTTP, tc.InternalDial })
	doc := h.fake.add(gatewayv1.State_SUCCEEDED, 3)

	clientTLS, err := gateway.ClientTLS(caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if d, err := gatewayv1.NewDocumentServiceClient(conn).GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: doc.Id}); err != nil || d.Id != doc.Id {
		t.Fatalf("gRPC over TLS: %v %v", d, err)
	}

	// A plaintext gRPC client cannot talk to the TLS listener.
	plain, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer pcancel()
	if _, err := gatewayv1.NewDocumentServiceClient(plain).GetDocument(pctx, &gatewayv1.GetDocumentRequest{Id: doc.Id}); err == nil {
		t.Error("plaintext gRPC client got an answer from the TLS listener")
	}

	tr := &http.Transport{TLSClientConfig: clientTLS.Clone()}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	resp, err := hc.Get("https://" + h.srv.HTTPAddr() + "/v1/documents/" + doc.Id)
	if err != nil {
		t.Fatalf("REST over TLS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), doc.Id) {
		t.Errorf("REST over TLS (proxy dials gRPC over TLS): HTTP %d %s", resp.StatusCode, body)
	}
	resp, err = hc.Post("https://"+h.srv.HTTPAddr()+"/v1/documents:upload", "text/plain", strings.NewReader("hello over tls"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("REST upload over TLS: HTTP %d %s", resp.StatusCode, body)
	}
	c, _, err := websocket.Dial(ctx, "wss://"+h.srv.HTTPAddr()+"/v1/events/ws?cursor=0", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("WebSocket over TLS: %v", err)
	}
	if f, err := readFrame(t, c); err != nil || f.Op != 1 {
		t.Errorf("first wss frame %v %v", f.Header, err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	// A client that does not trust the CA is refused by its own handshake.
	untrusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}}
	if _, err := untrusting.Get("https://" + h.srv.HTTPAddr() + "/healthz"); err == nil {
		t.Error("a client without the CA accepted the server certificate")
	}
	untrusting.CloseIdleConnections()
}

func TestServerTLSFilesErrors(t *testing.T) {
	if _, err := gateway.ServerTLSFiles("", "k"); err == nil || !strings.Contains(err.Error(), "--tls-cert and --tls-key") {
		t.Errorf("missing cert: %v", err)
	}
	if _, err := gateway.ServerTLSFiles(filepath.Join(t.TempDir(), "nope.pem"), "k"); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Errorf("unreadable cert: %v", err)
	}
}
