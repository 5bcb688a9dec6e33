package peer

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// statusSink is the engine's conn for tests of branches a correct session
// cannot reach: it records the statuses the engine reports.
type statusSink struct {
	mu       sync.Mutex
	statuses []wire.StatusFrame
}

func (s *statusSink) ID() string { return "sink" }
func (s *statusSink) SendStatus(f wire.StatusFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statuses = append(s.statuses, f)
	return nil
}
func (s *statusSink) SendScopeDigest(wire.ScopeDigestFrame) error { return nil }
func (s *statusSink) SendBarrier(wire.BarrierFrame) error         { return nil }
func (s *statusSink) SendEntity(context.Context, *wire.EntityHeader, io.Reader) error {
	return nil
}
func (s *statusSink) SetDetached(uint32, uint32, bool) error { return nil }

// A child beyond max-entities-per-scope is refused with
// PIPESTREAM_ENTITY_TOO_LARGE (0x06), the code the session uses for the
// same limit (docs/conformance.md decisions), and reported FAILED. Through
// a real session the session's own per-scope check fires first, so the
// engine is driven directly.
func TestChildBeyondMaxEntitiesPerScope(t *testing.T) {
	co := &core{work: t.TempDir(), lim: resolvedLimits{orphanDocs: 8, orphanChildren: 64}, log: quiet, now: time.Now}
	sink := &statusSink{}
	g := newEngine(context.Background(), co, sink, negotiation{maxPerScope: 2}, quiet)
	defer g.close(errSessionGone)
	const root = 10
	g.mu.Lock()
	d := g.docFor(root)
	d.children[0], d.children[1] = &childState{}, &childState{}
	g.mu.Unlock()

	parent := uint32(root)
	got := wire.ErrorCode(0xFF)
	g.child(&wire.EntityHeader{EntityID: 13, ParentID: &parent, ChunkInfo: &wire.ChunkInfo{ChunkIndex: 2}, Metadata: map[string]string{MetaProfile: ProfileVersion}},
		nil, func(c wire.ErrorCode) { got = c })
	if got != wire.CodeEntityTooLarge {
		t.Errorf("third child with max-entities-per-scope 2: aborted with %v, want PIPESTREAM_ENTITY_TOO_LARGE (0x06)", got)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.statuses) != 1 || sink.statuses[0].EntityID != 13 || sink.statuses[0].Status != wire.StatusFailed {
		t.Errorf("statuses reported: %v, want one FAILED for entity 13", sink.statuses)
	}
}

// groupSubs keeps every byte in order, never splits a sub-entity, and
// makes at most n groups, each but the last at least ceil(total/n) bytes.
func TestGroupSubs(t *testing.T) {
	cases := []struct {
		subs []string
		n    uint64
	}{
		{[]string{"a\n", "b\n", "c\n", "d\n", "e\n"}, 2},
		{[]string{"a\n", "b\n", "c\n"}, 3},
		{[]string{"a\n", "b\n", "c\n"}, 1},
		{[]string{"long sentence here\n", "b\n", "c\n", "d\n"}, 3},
		{[]string{"", "", ""}, 2},
	}
	for _, tc := range cases {
		subs := make([][]byte, len(tc.subs))
		total := 0
		for i, s := range tc.subs {
			subs[i] = []byte(s)
			total += len(s)
		}
		got := groupSubs(subs, tc.n)
		if uint64(len(got)) > tc.n || len(got) == 0 {
			t.Errorf("%q into %d: %d groups", tc.subs, tc.n, len(got))
		}
		if j, w := string(bytes.Join(got, nil)), strings.Join(tc.subs, ""); j != w {
			t.Errorf("%q into %d: joined %q, want %q", tc.subs, tc.n, j, w)
		}
		target := max(1, (total+int(tc.n)-1)/int(tc.n))
		k := 0 // every group ends on a sub-entity boundary
		for gi, g := range got {
			rest := string(g)
			for rest != "" && k < len(tc.subs) {
				if !strings.HasPrefix(rest, tc.subs[k]) {
					t.Fatalf("%q into %d: group %d %q splits sub-entity %q", tc.subs, tc.n, gi, g, tc.subs[k])
				}
				rest = rest[len(tc.subs[k]):]
				k++
			}
			if gi < len(got)-1 && len(g) < target {
				t.Errorf("%q into %d: group %d has %d bytes, want at least %d", tc.subs, tc.n, gi, len(g), target)
			}
		}
	}
}
