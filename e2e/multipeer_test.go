package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Many peers (docs/scale-out.md, "Many peers"): `gateway serve --peer A
// --peer B --peer-ca certA --peer-ca certB` over two `gateway peer`
// processes. Peer A is SIGKILLed mid-run: every document still succeeds
// with its own bytes as the result (the ones in flight at A run again on
// B once the gateway sees A's session gone: QUIC's idle timeout,
// --peer-idle-timeout, 3 s by default; TestFairness asserts the 5 s
// re-dispatch), /healthz lists both peers with A down, and
// /metrics has the per-peer series.

// healthPeer is one peer of /healthz.
type healthPeer struct {
	Addr      string
	State     string
	InFlight  int
	LastError string
}

func healthPeers(t *testing.T, g *gatewayProc) (status string, peers map[string]healthPeer) {
	t.Helper()
	_, b, err := doJSON(context.Background(), "GET", g.baseURL()+"/healthz", nil, "")
	var h struct {
		Status string
		Peers  []healthPeer
	}
	if err != nil || json.Unmarshal(b, &h) != nil {
		t.Fatalf("/healthz: %v %s", err, b)
	}
	peers = map[string]healthPeer{}
	for _, p := range h.Peers {
		peers[p.Addr] = p
	}
	if len(h.Peers) != 2 || len(peers) != 2 {
		t.Fatalf("/healthz lists %d peers (%s), want the two of --peer", len(h.Peers), b)
	}
	return h.Status, peers
}

func TestManyPeersOneKilled(t *testing.T) {
	t.Parallel()
	addrA, certA, pa := startPeer(t)
	addrB, certB, _ := startPeer(t)
	g := startGateway(t, gwOpts{args: []string{"--peer", addrA, "--peer", addrB, "--peer-ca", certA, "--peer-ca", certB}})
	if g.proc.logContains("embedded peer listening") {
		t.Fatalf("gateway started its embedded peer despite --peer")
	}
	waitFor(t, "both peers connected", 20*time.Second, func() bool {
		_, ps := healthPeers(t, g)
		return ps[addrA].State == "connected" && ps[addrB].State == "connected"
	})

	// A deferred document first: equal (empty) peers take turns, so it
	// waits on its claim at A, the first peer: A surely has work in flight
	// when it dies.
	din := []byte("deferred at the peer that is killed")
	dd := submitREST(t, g, deferredDoc(din, time.Minute, nil, nil))
	first := awaitClaims(t, g, dd.GetId(), 1).GetClaimChecks()[0].GetClaimId()
	if _, ps := healthPeers(t, g); ps[addrA].InFlight != 1 || ps[addrB].InFlight != 0 {
		t.Fatalf("deferred document placed %+v, want on %s (the first of two idle peers)", ps, addrA)
	}

	ins := map[string][]byte{}
	for i := range 40 {
		in := binaryData(96<<10+i*1000, uint64(500+i))
		st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents:upload?split.strategy=fixed_bytes&split.chunkBytes=16384", in, "application/octet-stream")
		var d docJSON
		if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("upload %d: %d %v %s", i, st, err, b)
		}
		ins[d.Id] = in
		if i == 20 {
			pa.kill()
			t.Logf("SIGKILLed peer A (%s) after 21 of 40 documents", addrA)
		}
	}

	// The deferred document runs again at B, which defers it again; the
	// first claim resumes it through the new one.
	start := time.Now()
	awaitClaims(t, g, dd.GetId(), 2)
	t.Logf("the deferred document was deferred again at B %v after the kill", time.Since(start).Round(time.Millisecond))
	wantOK(t, "redeem the claim issued by the dead peer", curlJSON(t, "POST", redeemURL(g, first), "{}"))
	ins[dd.GetId()] = din
	for id, in := range ins {
		if d := awaitTerminalHTTP(t, g, id, 40*time.Second); d.State != "SUCCEEDED" {
			t.Fatalf("document %s ended %s (%s), want SUCCEEDED via the surviving peer", id, d.State, d.Error)
		}
		wantResult(t, g, id, in)
	}

	t.Logf("all %d documents SUCCEEDED %v after the kill", len(ins), time.Since(start).Round(time.Millisecond))
	status, ps := healthPeers(t, g)
	if status != "SERVING" || ps[addrA].State != "down" || ps[addrA].LastError == "" || ps[addrB].State != "connected" {
		t.Errorf("/healthz after the kill: %s %+v, want SERVING, %s down with its error, %s connected", status, ps, addrA, addrB)
	}
	metrics := string(curl(t, "GET", g.baseURL()+"/metrics", nil).body)
	for _, want := range []string{
		fmt.Sprintf("pipestream_bridge_peer_up{peer=%q} 0", addrA),
		fmt.Sprintf("pipestream_bridge_peer_up{peer=%q} 1", addrB),
		fmt.Sprintf("pipestream_bridge_session_connects_total{peer=%q}", addrA),
		fmt.Sprintf("pipestream_bridge_session_connects_total{peer=%q}", addrB),
		fmt.Sprintf("pipestream_bridge_peer_documents_in_flight{peer=%q} 0", addrB),
		fmt.Sprintf("pipestream_bridge_peer_attempts_aborted_total{peer=%q}", addrA),
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	if bytes.Contains([]byte(metrics), []byte(fmt.Sprintf("pipestream_bridge_peer_attempts_aborted_total{peer=%q} 0", addrA))) {
		t.Errorf("/metrics: no attempt aborted at the killed peer %s", addrA)
	}
}
