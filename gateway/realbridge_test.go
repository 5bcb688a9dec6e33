package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
)

// selfSignedPEM makes a certificate to pin; nothing listens behind it.
func selfSignedPEM(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nobody"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestRealBridgeWithoutPeer runs the gateway over the real bridge (SQLite
// store, event log) whose peer is unreachable: submissions are durable and
// PENDING, reads and cancels work, the event stream carries real events, and
// health reports why it is not ready. (Tests with a live peer run through
// the binary in cmd/gateway: this package may not import quicpeer.)
func TestRealBridgeWithoutPeer(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   t.TempDir(),
		PeerAddr:  "127.0.0.1:9", // discard port: nothing answers QUIC there
		PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b })

	code, _, body := h.do("GET", "/healthz", nil)
	if code != 503 || !strings.Contains(string(body), "reason") {
		t.Errorf("/healthz without a peer: HTTP %d %s, want 503 with a reason", code, body)
	}

	code, _, body = h.do("POST", "/v1/documents", strings.NewReader(`{"content":"aGVsbG8gd29ybGQ=","contentType":"text/plain","displayName":"hello.txt"}`))
	if code != 200 {
		t.Fatalf("submit: HTTP %d %s", code, body)
	}
	var doc struct{ Id, State, SizeBytes string }
	if err := json.Unmarshal(body, &doc); err != nil || doc.Id == "" || doc.State != "PENDING" || doc.SizeBytes != "11" {
		t.Fatalf("submit answered %s, want a PENDING 11-byte document", body)
	}
	if code, _, body = h.do("GET", "/v1/documents/"+doc.Id, nil); code != 200 {
		t.Errorf("get: HTTP %d %s", code, body)
	}
	if code, _, body = h.do("GET", "/v1/documents/0000", nil); code != 404 {
		t.Errorf("get unknown: HTTP %d %s, want 404", code, body)
	} else {
		decodeStatus(t, body)
	}
	if code, _, body = h.do("GET", "/v1/documents/"+doc.Id+"/result", nil); code != 400 {
		t.Errorf("result of a PENDING document: HTTP %d %s, want 400 FAILED_PRECONDITION", code, body)
	}
	if code, _, body = h.do("POST", "/v1/documents/"+doc.Id+":cancel", strings.NewReader("{}")); code != 200 || !strings.Contains(string(body), "CANCELLED") {
		t.Errorf("cancel: HTTP %d %s", code, body)
	}
	code, _, body = h.do("POST", "/v1/documents/"+doc.Id+":cancel", strings.NewReader("{}"))
	if st := decodeStatus(t, body); code != 400 || st.Code != 9 {
		t.Errorf("cancel a cancelled document: HTTP %d %s, want 400 FAILED_PRECONDITION", code, body)
	}

	// The event log replays the document's events over the WebSocket.
	c := dialWS(t, h, "?cursor=0")
	f, err := readFrame(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if f.Op != 1 || f.Payload["seq"] != int64(1) || f.Payload["documentId"] != doc.Id {
		t.Errorf("first frame %v %v, want seq 1 of %s", f.Header, f.Payload, doc.Id)
	}
	c2 := dialWS(t, h, "?cursor=100000")
	if f, err := readFrame(t, c2); err != nil || f.Op != -1 || f.Payload["error"] != "FutureCursor" {
		t.Errorf("future cursor: %v %v %v, want a FutureCursor error frame", f.Header, f.Payload, err)
	}
}
