package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Peer faults (docs/profile.md 7-8): `gateway peer` runs as its own
// process; it is SIGKILLed or SIGTERMed while documents are in flight and
// restarted on the same port and data dir. The gateway reconnects with
// backoff and re-dispatches; nothing is left non-terminal, and every
// document ends as its completion policy says.

// peerAt runs `gateway peer` on addr with data dir dir (reused across
// restarts: the certificate the gateway pins and the claim store live there).
func peerAt(t *testing.T, addr, dir string, extra ...string) *proc {
	t.Helper()
	p := startProc(t, "peer", t.TempDir(), append([]string{"peer", "--listen", addr, "--data-dir", dir}, extra...)...)
	t.Cleanup(p.stop)
	attachLog(t, p)
	waitFor(t, "the peer to listen", startTimeout, func() bool {
		if p.exited() {
			t.Fatalf("gateway peer exited early: %v\n%s", p.waitErr, p.tail(logTailLines))
		}
		return p.logContains("peer listening")
	})
	return p
}

// awaitTerminalHTTP polls GET /v1/documents/{id} until it is terminal.
func awaitTerminalHTTP(t *testing.T, g *gatewayProc, id string, within time.Duration) docJSON {
	t.Helper()
	deadline := time.Now().Add(within)
	var d docJSON
	for {
		st, b, err := doJSON(context.Background(), "GET", g.baseURL()+"/v1/documents/"+id, nil, "")
		if err == nil && st == 200 && json.Unmarshal(b, &d) == nil && terminalState(d.State) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("document %s not terminal within %v after the peer fault (after a SIGKILL the gateway must notice the dead session, redial and re-dispatch; QUIC's idle timeout alone takes 3 x keepalive): %.300s", id, within, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func wantResult(t *testing.T, g *gatewayProc, id string, want []byte) {
	t.Helper()
	st, out, err := doJSON(context.Background(), "GET", g.baseURL()+"/v1/documents/"+id+"/result", nil, "")
	if err != nil || st != 200 || !bytes.Equal(out, want) {
		t.Errorf("result of %s: HTTP %d, %d bytes sha256 %s, want %d bytes sha256 %s (%v)", id, st, len(out), sha256Hex(out), len(want), sha256Hex(want), err)
	}
}

// waitEntitiesDone waits until at least n entities of id are COMPLETE: the
// document is mid-flight at the peer.
func waitEntitiesDone(t *testing.T, g *gatewayProc, id string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d entities of %s complete", n, id), time.Minute, func() bool {
		_, b, err := doJSON(context.Background(), "GET", g.baseURL()+"/v1/documents/"+id, nil, "")
		var d struct {
			State        string
			EntityCounts struct{ Complete int }
		}
		return err == nil && json.Unmarshal(b, &d) == nil && (d.EntityCounts.Complete >= n || terminalState(d.State))
	})
}

// peerFaultBound is how long a document may take to finish after the peer
// is back: the gateway redials with backoff capped at 10 s (profile 8),
// then re-dispatches; a gateway that keeps a dead session until QUIC's
// idle timeout (3 x 30 s keepalive) is too slow.
const peerFaultBound = 30 * time.Second

// peerRig is an external peer and a gateway that uses it.
type peerRig struct {
	addr, dir string
	pp        *proc
	g         *gatewayProc
}

func newPeerRig(t *testing.T) *peerRig {
	r := &peerRig{dir: t.TempDir(), addr: freeUDPAddr(t)}
	r.pp = peerAt(t, r.addr, r.dir, "--drain-timeout", "5s")
	r.g = startGateway(t, gwOpts{args: []string{"--peer", r.addr, "--peer-ca", filepath.Join(r.dir, "peer-cert.pem")}})
	return r
}

func (r *peerRig) restartPeer(t *testing.T) { r.pp = peerAt(t, r.addr, r.dir, "--drain-timeout", "5s") }

func (r *peerRig) upload(t *testing.T, in []byte, query string) string {
	t.Helper()
	st, b, err := doJSON(context.Background(), "POST", r.g.baseURL()+"/v1/documents:upload?"+query, in, "application/octet-stream")
	var d docJSON
	if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("upload: %d %v %s", st, err, b)
	}
	return d.Id
}

// nothingLeft asserts every document of the rig's gateway is terminal.
func (r *peerRig) nothingLeft(t *testing.T) {
	t.Helper()
	_, b, err := doJSON(context.Background(), "GET", r.g.baseURL()+"/v1/documents?pageSize=1000", nil, "")
	var l struct{ Documents []docJSON }
	if err != nil || json.Unmarshal(b, &l) != nil {
		t.Fatalf("list: %v %s", err, b)
	}
	for _, d := range l.Documents {
		if !terminalState(d.State) {
			t.Errorf("document %s left %s after the peer fault", d.Id, d.State)
		}
	}
}

func TestPeerFaults(t *testing.T) {
	t.Parallel()
	t.Run("SIGKILL mid-document", func(t *testing.T) {
		t.Parallel()
		rig := newPeerRig(t)
		g := rig.g
		defer rig.nothingLeft(t)
		in := binaryData(24<<20, 31)
		id := rig.upload(t, in, "split.strategy=fixed_bytes&split.chunkBytes=262144")
		waitEntitiesDone(t, g, id, 4)
		rig.pp.kill()
		t.Logf("SIGKILLed the peer with %s in flight", id)
		time.Sleep(700 * time.Millisecond)
		rig.restartPeer(t)
		d := awaitTerminalHTTP(t, g, id, peerFaultBound)
		if d.State != "SUCCEEDED" {
			t.Fatalf("document in flight at the peer's SIGKILL ended %s (%s), want SUCCEEDED after re-dispatch", d.State, d.Error)
		}
		wantResult(t, g, id, in)
	})

	t.Run("SIGTERM drains", func(t *testing.T) {
		t.Parallel()
		rig := newPeerRig(t)
		g, pp := rig.g, rig.pp
		defer rig.nothingLeft(t)
		in := binaryData(16<<20, 32)
		id := rig.upload(t, in, "split.strategy=fixed_bytes&split.chunkBytes=262144")
		waitEntitiesDone(t, g, id, 2)
		if err := pp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-pp.done:
		case <-time.After(15 * time.Second):
			t.Fatalf("peer did not exit within 15 s of SIGTERM (--drain-timeout 5s)")
		}
		if !pp.logContains("goaway") {
			t.Errorf("peer log shows no GOAWAY on SIGTERM")
		}
		rig.restartPeer(t)
		d := awaitTerminalHTTP(t, g, id, peerFaultBound)
		if d.State != "SUCCEEDED" {
			t.Fatalf("document in flight at SIGTERM ended %s (%s), want SUCCEEDED (drained or re-dispatched)", d.State, d.Error)
		}
		wantResult(t, g, id, in)
		after := []byte("submitted after the peer came back")
		st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents",
			mustJSON(t, map[string]any{"content": b64(after), "contentType": "text/plain"}), "application/json")
		var nd docJSON
		if err != nil || st != 200 || json.Unmarshal(b, &nd) != nil {
			t.Fatalf("submit after the restart: %d %v %s", st, err, b)
		}
		if d := awaitTerminalHTTP(t, g, nd.Id, 30*time.Second); d.State != "SUCCEEDED" {
			t.Errorf("new submission after the peer restart ended %s (%s)", d.State, d.Error)
		}
		wantResult(t, g, nd.Id, after)
	})

	t.Run("LENIENT skips a chunk lost to the peer's death", func(t *testing.T) {
		t.Parallel()
		rig := newPeerRig(t)
		g := rig.g
		defer rig.nothingLeft(t)
		// Chunk 0 never finishes at the peer (fault timeout); its 3 s
		// timeout with on-timeout SKIP decides it. The peer dies while it
		// waits; after re-dispatch the chunk times out again and LENIENT
		// finishes with the other chunks.
		in := binaryData(4000, 33)
		st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents", mustJSON(t, map[string]any{
			"content": b64(in), "contentType": "application/octet-stream",
			"split":            map[string]any{"strategy": "SPLIT_FIXED_BYTES", "chunkBytes": 1000, "processor": "fault"},
			"completionPolicy": map[string]any{"mode": "LENIENT", "timeoutMs": 3000, "onTimeout": "SKIP"},
			"metadata":         map[string]string{"pipestream.fault": "timeout", "pipestream.fault-chunks": "0"},
		}), "application/json")
		var d docJSON
		if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("submit: %d %v %s", st, err, b)
		}
		waitEntitiesDone(t, g, d.Id, 3)
		rig.pp.kill()
		time.Sleep(500 * time.Millisecond)
		rig.restartPeer(t)
		fin := awaitTerminalHTTP(t, g, d.Id, peerFaultBound)
		if fin.State != "PARTIALLY_SUCCEEDED" {
			t.Fatalf("LENIENT document with a lost, timed-out chunk ended %s (%s), want PARTIALLY_SUCCEEDED", fin.State, fin.Error)
		}
		wantResult(t, g, d.Id, in[1000:])
	})

}
