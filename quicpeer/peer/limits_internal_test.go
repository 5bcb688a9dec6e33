package peer

import (
	"context"
	"io"
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
