package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// startPeer runs `gateway peer` as its own process on a free UDP port and
// returns its address and the certificate file to pin.
func startPeer(t testing.TB, extra ...string) (addr, cert string, p *proc) {
	t.Helper()
	return startPeerAt(t, freeUDPAddr(t), extra...)
}

// startPeerAt starts `gateway peer` on addr with a data dir (and so a
// self-signed certificate) of its own.
func startPeerAt(t testing.TB, addr string, extra ...string) (_, cert string, p *proc) {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"peer", "--listen", addr, "--data-dir", dir}, extra...)
	p = startProc(t, "peer", t.TempDir(), args...)
	t.Cleanup(p.stop)
	attachLog(t, p)
	cert = filepath.Join(dir, "peer-cert.pem")
	waitFor(t, "the peer to listen and write "+cert, startTimeout, func() bool {
		if p.exited() {
			t.Fatalf("gateway peer exited early: %v\n%s", p.waitErr, p.tail(logTailLines))
		}
		_, err := os.Stat(cert)
		return err == nil && p.logContains("peer listening")
	})
	return addr, cert, p
}

// TestExternalPeer runs the processing peer as a separate process (`gateway
// peer`) and points the gateway at it with --peer/--peer-ca, once per
// serialization format, and checks Layer 0, 1 and 2 work across it.
func TestExternalPeer(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"cbor", nil},
		{"protobuf", []string{"--prefer-protobuf"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			addr, cert, pp := startPeer(t, mode.args...)
			g := startGateway(t, gwOpts{args: append([]string{"--peer", addr, "--peer-ca", cert}, mode.args...)})
			if g.proc.logContains("embedded peer listening") {
				t.Fatalf("gateway started its embedded peer despite --peer")
			}

			// Layer 0, dehydrated: passthrough of 4 MiB in 256 KiB chunks.
			in := binaryData(4<<20, 21)
			d := docOf(t, "upload", curl(t, "POST", g.baseURL()+"/v1/documents:upload?split.strategy=fixed_bytes&split.chunkBytes=262144", in))
			if fin := awaitREST(t, g, d.GetId()); fin.GetState() != gatewayv1.State_SUCCEEDED {
				t.Fatalf("passthrough via the external peer: %v (%s)", fin.GetState(), fin.GetError())
			}
			if out := resultREST(t, g, d.GetId()).body; !bytes.Equal(out, in) {
				t.Errorf("passthrough result via the external peer differs: %d bytes, want %d", len(out), len(in))
			}

			// Layer 1: sentences nest one scope; the digest is verified.
			s := submitREST(t, g, map[string]any{"content": b64([]byte("One. Two! Three?")), "contentType": "text/plain",
				"split": map[string]any{"processor": "sentences", "maxDepth": 1}})
			fin := awaitREST(t, g, s.GetId())
			if got := string(resultREST(t, g, s.GetId()).body); fin.GetState() != gatewayv1.State_SUCCEEDED || got != "One.\nTwo!\nThree?\n" {
				t.Errorf("sentences via the external peer: %v, result %q", fin.GetState(), got)
			}
			if len(fin.GetDigests()) == 0 {
				t.Errorf("no scope digest recorded for a Layer 1 document")
			}
			for _, dg := range fin.GetDigests() {
				if !dg.GetVerified() {
					t.Errorf("scope digest not verified: %v", dg)
				}
			}

			// Layer 2: a claim check issued by the external peer, redeemed.
			cin := []byte("claim via the external peer")
			cd := submitREST(t, g, deferredDoc(cin, time.Minute, nil, nil))
			claim := awaitClaims(t, g, cd.GetId(), 1).GetClaimChecks()[0].GetClaimId()
			wantOK(t, "redeem", curlJSON(t, "POST", redeemURL(g, claim), "{}"))
			if fin := awaitREST(t, g, cd.GetId()); fin.GetState() != gatewayv1.State_SUCCEEDED || !bytes.Equal(resultREST(t, g, cd.GetId()).body, cin) {
				t.Errorf("redeemed document via the external peer: %v", fin.GetState())
			}

			if !pp.logContains(d.GetId()) && !pp.logContains("entity received") {
				t.Errorf("the external peer's log shows no work: was it used?")
			}
			if mode.name == "protobuf" && !strings.Contains(readFile(t, g.proc.logPath), "format=protobuf") {
				t.Errorf("gateway log does not report format=protobuf with --prefer-protobuf on both sides")
			}
		})
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
