package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestLoadDraft04Peer (issue 20 item 7): 100 small documents onto a
// draft-04 peer that serves one connection at a time (the reference server
// conversation, one entity per connection) finish SUCCEEDED within 10 s
// on the 2-core CI machine: the gateway keeps up to --peer-draft04-conns
// connections open so the next handshakes overlap the running
// conversation, and once the peer has shown it returns no result it no
// longer waits a second per document for one. It runs in the quiet shard
// (the TestLoad prefix) because it measures time.
func TestLoadDraft04Peer(t *testing.T) {
	const target = 10 * time.Second
	one := loadDraft04(t, "1")
	def := loadDraft04(t, "")
	t.Logf("100 documents: %v with --peer-draft04-conns 1, %v with the default 4 (%.1fx)", one.Round(time.Millisecond), def.Round(time.Millisecond), one.Seconds()/def.Seconds())
	if def > target {
		t.Errorf("100 documents took %v, want under %v (issue 20 item 7)", def, target)
	}
}

// loadDraft04 sends 100 small documents to a fresh reference server
// through a fresh gateway (--peer-draft04-conns conns, "" for the
// default) and returns how long they took from the first submission to
// the last terminal state.
func loadDraft04(t *testing.T, conns string) time.Duration {
	const docs = 100
	s := startD04Server(t)
	args := plainPeerArgs(s.addr, s.caPEM, "--peer-framing", "draft-04")
	if conns != "" {
		args = append(args, "--peer-draft04-conns", conns)
	}
	g := startInteropGateway(t, args...)
	start := time.Now()
	ids := make([]string, docs)
	for i := range ids {
		ids[i] = submitDoc(t, g, map[string]any{"content": b64([]byte(fmt.Sprintf("small document %d for a draft-04 peer\n", i))), "contentType": "text/plain"})
	}
	for _, id := range ids {
		d := awaitTerminalDoc(t, g, id, 120*time.Second)
		if d.str("state") != "SUCCEEDED" {
			t.Errorf("document %s: %v", id, d)
		}
	}
	took := time.Since(start)
	sess, errs, nconns := s.snapshot()
	t.Logf("conns %q: %d documents onto a draft-04 peer serving one connection at a time: %v (%.1f documents/s); server: %d connections, %d sessions, refused: %s",
		conns, docs, took.Round(time.Millisecond), float64(docs)/took.Seconds(), nconns, len(sess), errorsText(errs))
	if len(sess) != docs {
		t.Errorf("the peer completed %d conversations, want %d", len(sess), docs)
	}
	return took
}
