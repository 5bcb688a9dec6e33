package bridge

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pipestream/gateway/quicpeer"
)

// TestRepeatedFailureKeepsTheWaitReason: a peer that keeps failing the
// same way keeps the wait reason its queued documents show ("... (since
// the failure began)"), so the supervisor writes no new wait reason event
// per redial; a different failure, or one after the peer worked again,
// starts a new reason.
func TestRepeatedFailureKeepsTheWaitReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &Bridge{}
		pc := &peerConn{addr: "127.0.0.1:1", mode: quicpeer.FramingDraft02, framing: quicpeer.FramingDraft02}
		refused := errors.New("dial: connection refused")
		b.noteDialLocked(pc, pc.framing, refused)
		first := pc.waitReasonLocked()
		if !strings.Contains(first, "connection refused") || !strings.Contains(first, "(since ") {
			t.Fatalf("wait reason %q, want the error and when it began", first)
		}
		for range 5 {
			time.Sleep(3 * time.Second) // the backoff between dials
			b.noteDialLocked(pc, pc.framing, refused)
			if got := pc.waitReasonLocked(); got != first {
				t.Fatalf("the same failure again changed the wait reason:\n%s\n%s", first, got)
			}
		}
		time.Sleep(3 * time.Second)
		b.noteDialLocked(pc, pc.framing, errors.New("dial: no route to host"))
		other := pc.waitReasonLocked()
		if other == first || !strings.Contains(other, "no route to host") || !strings.Contains(other, pc.errAt.UTC().Format(time.RFC3339)) {
			t.Fatalf("a different failure: wait reason %q, want the new error since now", other)
		}
		since := pc.errAt
		time.Sleep(3 * time.Second)
		b.noteDialLocked(pc, pc.framing, nil) // the peer answers again...
		b.noteDialLocked(pc, pc.framing, errors.New("dial: no route to host"))
		if !pc.errAt.After(since) {
			t.Fatalf("a failure after a dial that worked kept the old streak's start %v", since)
		}
	})
}
