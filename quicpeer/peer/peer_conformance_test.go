package peer_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestPipeDocEntityIDMismatchRejected: Section 7, a PipeDoc's entity_id
// MUST match the entity-id of the enclosing EntityHeader. A root whose
// envelope names another entity is FAILED without processing (no result,
// never COMPLETE), for a document sent whole (profile 4.1) and for the root
// envelope of a dehydrated one (profile 4.2); the session stays usable.
func TestPipeDocEntityIDMismatchRejected(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)

		// Whole: header entity-id = id, envelope entity-id = id+1000.
		whole := c.assign(t)
		h := &wire.EntityHeader{EntityID: whole, ContentType: "text/plain"}
		if err := c.send(t, h, c.envelope(t, whole+1000, []byte("mismatched"))); err != nil {
			t.Fatal(err)
		}
		c.rec.waitStatus(t, whole, wire.StatusFailed)

		// Dehydrated: one child, then DEHYDRATING and a root envelope that
		// names another entity.
		root, child := c.assign(t), c.assign(t)
		p := root
		if err := c.send(t, &wire.EntityHeader{EntityID: child, ParentID: &p, ContentType: "text/plain",
			ChunkInfo: &wire.ChunkInfo{TotalChunks: 1}}, []byte("chunk")); err != nil {
			t.Fatal(err)
		}
		if err := c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root}); err != nil {
			t.Fatal(err)
		}
		rh := &wire.EntityHeader{EntityID: root, ContentType: "text/plain", Metadata: map[string]string{peer.MetaTotalChunks: "1"}}
		if err := c.send(t, rh, c.envelope(t, root+1000, nil)); err != nil {
			t.Fatal(err)
		}
		c.rec.waitStatus(t, root, wire.StatusFailed)

		// A correct document on the same session completes; by then any
		// result of the rejected roots would have arrived.
		ok := c.sendWhole(t, "fine", nil, nil)
		if res := c.rec.waitResult(t, ok); string(res.data) != "fine" {
			t.Fatalf("result %q", res.data)
		}
		c.rec.waitStatus(t, ok, wire.StatusComplete)
		c.rec.mu.Lock()
		defer c.rec.mu.Unlock()
		for _, id := range []uint32{whole, root} {
			if _, got := c.rec.results[id]; got {
				t.Errorf("entity %d: result sent for a PipeDoc whose entity_id does not match", id)
			}
			if slices.Contains(c.rec.historyLocked(0, id), wire.StatusComplete) {
				t.Errorf("entity %d: COMPLETE for a mismatched PipeDoc: %v", id, c.rec.historyLocked(0, id))
			}
		}
	})
}

// TestNestedScopeIDs: Section 9.4. The peer's child scopes are never the
// root scope 0 (L1265), a scope ID is not reused while the scope is live,
// that is between BARRIER(S, waiting) and BARRIER(S, released) which
// brackets its SCOPE_DIGEST (L1267), and no status frame references a scope
// outside that bracket (L1271: every entity of S is terminal before S can
// be recycled). Several nested documents run concurrently on one session.
func TestNestedScopeIDs(t *testing.T) {
	srv := startPeer(t, peer.Options{Workers: 4})
	c := dial(t, srv, wire.FormatCBOR, nil)
	const docs = 8
	ids := make([]uint32, docs)
	for i := range ids {
		ids[i] = c.sendWhole(t, strings.Repeat(fmt.Sprintf("Doc %d says hello. ", i), 3+i),
			map[string]string{peer.MetaProcessor: "sentences"}, nil)
	}
	for _, id := range ids {
		c.rec.waitStatus(t, id, wire.StatusComplete)
	}
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	open := map[uint32]bool{}
	scopes := map[uint32]int{}
	for _, line := range c.rec.control {
		var s, e uint32
		var what string
		switch {
		case strings.HasPrefix(line, "BARRIER "):
			if _, err := fmt.Sscanf(line, "BARRIER %d %d %s", &s, &e, &what); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if s == 0 {
				t.Fatalf("%q: scope 0 used as a child scope", line)
			}
			if what == "waiting" {
				if open[s] {
					t.Fatalf("%q: scope %d reused while still live", line, s)
				}
				open[s] = true
				scopes[s]++
			} else {
				if !open[s] {
					t.Fatalf("%q: release of a scope that is not live", line)
				}
				delete(open, s)
			}
		case strings.HasPrefix(line, "DIGEST "):
			fmt.Sscanf(line, "DIGEST %d", &s)
			if !open[s] {
				t.Fatalf("%q: SCOPE_DIGEST outside its scope's barriers", line)
			}
		case strings.HasPrefix(line, "STATUS "):
			var st string
			if _, err := fmt.Sscanf(line, "STATUS %s %d@%d", &st, &e, &s); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if s != 0 && !open[s] {
				t.Fatalf("%q: status references scope %d outside its live bracket", line, s)
			}
		}
	}
	if len(open) != 0 || len(scopes) == 0 {
		t.Fatalf("scopes still open %v, scopes seen %v", open, scopes)
	}
	if n := len(c.rec.digests); n != docs {
		t.Fatalf("%d scope digests, want one per document (%d)", n, docs)
	}
}
