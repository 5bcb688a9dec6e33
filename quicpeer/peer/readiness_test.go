package peer_test

import (
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestManyDocumentsRehydrateAfterLastChild: 24 dehydrated documents in
// flight on one session, children sent in reverse chunk order, roots first
// or last, some with a failing chunk under LENIENT. Each root's readiness
// goes through the session's Assembly Manifest tracker (Section 9.6): on
// stream 0, STATUS(R, REHYDRATING) comes exactly once per document and only
// after the terminal status of every one of its children, and each result
// is its own children's outputs in chunk order.
func TestManyDocumentsRehydrateAfterLastChild(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	type docWant struct {
		root   uint32
		kids   []uint32
		result string
		failed int // chunk index that fails, -1 for none
	}
	var docs []docWant
	for i := range 24 {
		n := 3 + i%4
		chunks := make([]string, n)
		for k := range chunks {
			chunks[k] = "d" + itoa(uint32(i)) + "c" + itoa(uint32(k)) + "\n"
		}
		var md map[string]string
		var pol *wire.CompletionPolicy
		failed := -1
		if i%3 == 0 {
			failed = 1
			md = fault("fail")
			md[peer.MetaFaultChunks] = "1"
			pol = modePolicy(wire.ModeLenient)
		}
		// A failing child waits for its root's policy, so those roots go first.
		root, kids := c.sendDehydrated(t, chunks, md, pol, i%2 == 0 || failed >= 0)
		want := ""
		for k, ch := range chunks {
			if k != failed {
				want += ch
			}
		}
		docs = append(docs, docWant{root, kids, want, failed})
	}
	for _, d := range docs {
		c.rec.waitStatus(t, d.root, wire.StatusComplete)
		if res := c.rec.waitResult(t, d.root); string(res.data) != d.result {
			t.Errorf("document %d: result %q, want %q", d.root, res.data, d.result)
		}
	}
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	at := func(line string) []int {
		var idx []int
		for i, l := range c.rec.control {
			if l == line {
				idx = append(idx, i)
			}
		}
		return idx
	}
	for _, d := range docs {
		re := at("STATUS REHYDRATING " + itoa(d.root) + "@0")
		if len(re) != 1 {
			t.Errorf("document %d: %d REHYDRATING statuses, want 1", d.root, len(re))
			continue
		}
		for k, kid := range d.kids {
			final := "COMPLETE"
			if k == d.failed {
				final = "FAILED"
			}
			term := at("STATUS " + final + " " + itoa(kid) + "@0")
			if len(term) != 1 || term[0] > re[0] {
				t.Errorf("document %d: child %d (chunk %d) %s at %v, REHYDRATING at %d: rehydrated before its last child resolved\n%s",
					d.root, kid, k, final, term, re[0], strings.Join(c.rec.control, "\n"))
			}
		}
	}
}
