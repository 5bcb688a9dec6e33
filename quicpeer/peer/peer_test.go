package peer_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func statuses(s ...wire.Status) []wire.Status { return s }

func TestWholePassthrough(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		content := strings.Repeat("hello pipestream ", 1000)
		id := c.sendWhole(t, content, nil, nil)
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		if string(res.data) != content || res.h.Layer != 0 || res.h.ContentType != "text/plain" {
			t.Fatalf("result %q (layer %d, %q)", res.data[:20], res.h.Layer, res.h.ContentType)
		}
		if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
			t.Fatalf("statuses %v", got)
		}
	})
}

func TestWholeTextStats(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "A cat. A dog!\nA bird?\n", map[string]string{peer.MetaProcessor: "textstats"}, nil)
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		var st peer.TextStatsResult
		if err := json.Unmarshal(res.data, &st); err != nil {
			t.Fatal(err)
		}
		if res.h.Layer != 2 || st.Words != 6 || st.Sentences != 3 || st.Lines != 2 || st.TopWords[0] != (peer.WordCount{Word: "a", Count: 3}) {
			t.Fatalf("layer %d stats %+v", res.h.Layer, st)
		}
	})
}

func TestUnknownProcessorFails(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendWhole(t, "x", map[string]string{peer.MetaProcessor: "nope"}, nil)
	c.rec.waitStatus(t, id, wire.StatusFailed)
}

// Children arrive before STATUS(R, DEHYDRATING) and the root envelope, in
// reverse order; the result is rehydrated in chunk-index order.
func TestDehydratedOrphansFirst(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		chunks := []string{"one\n", "two\n", "three\n", "four\n"}
		root, kids := c.sendDehydrated(t, chunks, nil, nil, false)
		res := c.rec.waitResult(t, root)
		c.rec.waitStatus(t, root, wire.StatusComplete)
		if string(res.data) != strings.Join(chunks, "") {
			t.Fatalf("rehydrated %q", res.data)
		}
		if res.h.Metadata[peer.MetaChildrenComplete] != "4" || res.h.Metadata[peer.MetaChildrenTotal] != "4" {
			t.Fatalf("result metadata %v", res.h.Metadata)
		}
		for _, k := range kids {
			if got := c.rec.history(0, k); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
				t.Fatalf("child %d statuses %v", k, got)
			}
		}
		if got := c.rec.history(0, root); !slices.Equal(got, statuses(wire.StatusRehydrating, wire.StatusComplete)) {
			t.Fatalf("root statuses %v", got)
		}
	})
}

func TestDehydratedTextStatsMerge(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	chunks := []string{"The cat sat.\n", "The dog ran.\n", "The end\n"}
	root, _ := c.sendDehydrated(t, chunks, map[string]string{peer.MetaProcessor: "textstats"}, nil, true)
	res := c.rec.waitResult(t, root)
	var st peer.TextStatsResult
	if err := json.Unmarshal(res.data, &st); err != nil {
		t.Fatal(err)
	}
	if st.Words != 8 || st.Lines != 3 || st.Sentences != 3 || st.TopWords[0] != (peer.WordCount{Word: "the", Count: 3}) {
		t.Fatalf("merged stats %+v", st)
	}
}

// Layer 1: sentences dehydrates into a peer scope, reports depth 1
// sub-entities, a SCOPE_DIGEST whose Merkle root matches the statuses
// observed, then REHYDRATING and COMPLETE.
func TestSentencesLayer1(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "First one. Second one! Third?", map[string]string{peer.MetaProcessor: "sentences"}, nil)
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		if string(res.data) != "First one.\nSecond one!\nThird?\n" {
			t.Fatalf("result %q", res.data)
		}
		if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusDehydrating, wire.StatusRehydrating, wire.StatusComplete)) {
			t.Fatalf("parent statuses %v", got)
		}
		c.rec.mu.Lock()
		defer c.rec.mu.Unlock()
		if len(c.rec.digests) != 1 {
			t.Fatalf("%d digests", len(c.rec.digests))
		}
		d := c.rec.digests[0]
		final := map[uint32]wire.Status{}
		for _, f := range c.rec.statuses {
			if f.ScopeID == d.ScopeID {
				if f.Depth != 1 {
					t.Fatalf("sub-entity %d depth %d, want 1", f.EntityID, f.Depth)
				}
				final[f.EntityID] = f.Status
			}
		}
		var leaves []wire.Leaf
		for id, st := range final {
			leaves = append(leaves, wire.Leaf{EntityID: id, Status: st})
		}
		if d.ScopeID == 0 || len(leaves) != 3 || d.Processed != 3 || d.Succeeded != 3 || d.MerkleRoot != wire.MerkleRoot(leaves) {
			t.Fatalf("digest %+v does not match observed statuses %v", d, final)
		}
		// Profile 6: DEHYDRATING(E) then BARRIER(S, E, waiting) adjacent,
		// the scope's statuses, SCOPE_DIGEST(S), BARRIER(S, E, released),
		// REHYDRATING(E) -- in this order on stream 0.
		s := d.ScopeID
		want := []string{
			fmt.Sprintf("STATUS DEHYDRATING %d@0", id), fmt.Sprintf("BARRIER %d %d waiting", s, id),
			fmt.Sprintf("STATUS PROCESSING 1@%d", s), fmt.Sprintf("STATUS COMPLETE 1@%d", s),
			fmt.Sprintf("STATUS PROCESSING 2@%d", s), fmt.Sprintf("STATUS COMPLETE 2@%d", s),
			fmt.Sprintf("STATUS PROCESSING 3@%d", s), fmt.Sprintf("STATUS COMPLETE 3@%d", s),
			fmt.Sprintf("DIGEST %d", s), fmt.Sprintf("BARRIER %d %d released", s, id),
			fmt.Sprintf("STATUS REHYDRATING %d@0", id),
		}
		start := slices.Index(c.rec.control, want[0])
		if start < 0 || len(c.rec.control) < start+len(want) || !slices.Equal(c.rec.control[start:start+len(want)], want) {
			t.Fatalf("stream 0 frames %q, want the run %q", c.rec.control, want)
		}
	})
}

func TestSentencesMaxDepthZeroStaysFlat(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendWhole(t, "One. Two.", map[string]string{peer.MetaProcessor: "sentences", peer.MetaMaxDepth: "0"}, nil)
	res := c.rec.waitResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if string(res.data) != "One.\nTwo.\n" || len(c.rec.digests) != 0 {
		t.Fatalf("result %q, %d digests", res.data, len(c.rec.digests))
	}
}

// Without Layer 1 the sentences processor cannot nest: flat output.
func TestSentencesWithoutLayer1(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, &wire.Capabilities{Layer0Core: true})
	id := c.sendWhole(t, "One. Two.", map[string]string{peer.MetaProcessor: "sentences"}, nil)
	res := c.rec.waitResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if string(res.data) != "One.\nTwo.\n" || slices.Contains(c.rec.history(0, id), wire.StatusDehydrating) {
		t.Fatalf("result %q statuses %v", res.data, c.rec.history(0, id))
	}
}

// Amplification: more sentences than the children-per-MB ratio allows
// are grouped, whole and in order, into as many sub-entities as it allows
// (issue 23 item 8): the entity nests and completes instead of failing.
func TestSentencesAmplificationGroups(t *testing.T) {
	srv := startPeer(t, peer.Options{Limits: quicpeerLimits(2)})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendWhole(t, "A. B. C. D. E.", map[string]string{peer.MetaProcessor: "sentences"}, nil)
	res := c.rec.waitResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if string(res.data) != "A.\nB.\nC.\nD.\nE.\n" {
		t.Fatalf("result %q, want every sentence on its line in order", res.data)
	}
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	if len(c.rec.digests) != 1 || c.rec.digests[0].Processed != 2 || c.rec.digests[0].Succeeded != 2 {
		t.Fatalf("digests %+v, want one scope of 2 sub-entities (2 children per MB)", c.rec.digests)
	}
}

// A 1 MiB document of short sentences (about 100,000) with the default
// limits: it nests into at most 1,000 sub-entities (the children-per-MB
// ratio), each whole sentences of about 1 KiB, and its result is every
// sentence on its own line. Before issue 23 it FAILED with
// PIPESTREAM_ENTITY_TOO_LARGE.
func TestSentencesScaleWithInput(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	var text, want strings.Builder
	for i := 0; text.Len() < 1<<20-64; i++ {
		fmt.Fprintf(&text, "Go %d. ", i%1000)
		fmt.Fprintf(&want, "Go %d.\n", i%1000)
	}
	id := c.sendWhole(t, text.String(), map[string]string{peer.MetaProcessor: "sentences"}, nil)
	res := c.rec.waitResult(t, id)
	c.rec.waitStatus(t, id, wire.StatusComplete)
	if string(res.data) != want.String() {
		t.Fatalf("result: %d bytes, want %d (every sentence on its line, in order)", len(res.data), want.Len())
	}
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	if len(c.rec.digests) != 1 {
		t.Fatalf("%d scope digests, want 1", len(c.rec.digests))
	}
	if n := c.rec.digests[0].Processed; n < 900 || n > 1000 {
		t.Fatalf("the scope has %d sub-entities, want at most 1,000 (1,000 children per MB) and close to it", n)
	}
}
