package peer_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func quicpeerLimits(childrenPerMB int) quicpeer.Limits {
	return quicpeer.Limits{ChildrenPerMB: childrenPerMB}
}

func fault(action string) map[string]string {
	return map[string]string{peer.MetaProcessor: "fault", peer.MetaFault: action}
}

func retryPolicy(n, delayMs uint32) *wire.CompletionPolicy {
	a := wire.ActionRetry
	return &wire.CompletionPolicy{OnFailure: &a, MaxRetries: &n, RetryDelayMs: &delayMs}
}

func modePolicy(m wire.CompletionMode) *wire.CompletionPolicy {
	return &wire.CompletionPolicy{Mode: &m}
}

func TestFaultFail(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "x", fault("fail"), nil)
		c.rec.waitStatus(t, id, wire.StatusFailed)
		if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusFailed)) {
			t.Fatalf("statuses %v", got)
		}
	})
}

func TestFaultFailOnceRetries(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "payload", fault("fail-once"), retryPolicy(2, 10))
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		want := statuses(wire.StatusProcessing, wire.StatusFailed, wire.StatusRetrying, wire.StatusProcessing, wire.StatusComplete)
		if got := c.rec.history(0, id); !slices.Equal(got, want) || string(res.data) != "payload" {
			t.Fatalf("statuses %v, want %v", got, want)
		}
	})
}

func TestFaultFailExhaustsRetries(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	id := c.sendWhole(t, "x", fault("fail"), retryPolicy(2, 1))
	c.rec.waitFor(t, "two retries then FAILED", func() bool {
		return len(c.rec.historyLocked(0, id)) == 8
	})
	want := statuses(wire.StatusProcessing, wire.StatusFailed, wire.StatusRetrying, wire.StatusProcessing,
		wire.StatusFailed, wire.StatusRetrying, wire.StatusProcessing, wire.StatusFailed)
	if got := c.rec.history(0, id); !slices.Equal(got, want) {
		t.Fatalf("statuses %v", got)
	}
}

// STRICT fails the document when a chunk fails; LENIENT rehydrates the rest.
func TestDehydratedPolicies(t *testing.T) {
	for _, tc := range []struct {
		mode wire.CompletionMode
		want wire.Status
	}{{wire.ModeStrict, wire.StatusFailed}, {wire.ModeLenient, wire.StatusComplete}, {wire.ModeBestEffort, wire.StatusComplete}} {
		t.Run(itoa(uint32(tc.mode)), func(t *testing.T) {
			srv := startPeer(t, peer.Options{})
			c := dial(t, srv, wire.FormatCBOR, nil)
			md := fault("fail")
			md[peer.MetaFaultChunks] = "1"
			root, kids := c.sendDehydrated(t, []string{"a\n", "b\n", "c\n"}, md, modePolicy(tc.mode), true)
			c.rec.waitStatus(t, root, tc.want)
			c.rec.waitStatus(t, kids[1], wire.StatusFailed)
			if tc.want == wire.StatusComplete {
				res := c.rec.waitResult(t, root)
				if string(res.data) != "a\nc\n" || res.h.Metadata[peer.MetaChildrenComplete] != "2" {
					t.Fatalf("partial result %q %v", res.data, res.h.Metadata)
				}
			}
		})
	}
}

func TestFaultYield(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		c := dial(t, srv, format, nil)
		id := c.sendWhole(t, "yield me", fault("yield"), nil)
		res := c.rec.waitResult(t, id)
		c.rec.waitStatus(t, id, wire.StatusComplete)
		want := statuses(wire.StatusProcessing, wire.StatusYielded, wire.StatusProcessing, wire.StatusComplete)
		if got := c.rec.history(0, id); !slices.Equal(got, want) || string(res.data) != "yield me" {
			t.Fatalf("statuses %v", got)
		}
		c.rec.mu.Lock()
		defer c.rec.mu.Unlock()
		for _, f := range c.rec.statuses {
			if f.Status == wire.StatusYielded {
				y, err := f.Yield()
				if err != nil || y.Reason != 1 || len(y.Token) != 105 {
					t.Fatalf("yield extension %+v %v", y, err)
				}
			}
		}
	})
}

func TestFaultTimeoutAbandons(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	ms := uint32(100)
	id := c.sendWhole(t, "x", fault("timeout"), &wire.CompletionPolicy{TimeoutMs: &ms})
	c.rec.waitStatus(t, id, wire.StatusAbandoned)
}

// A timed-out chunk is ABANDONED; LENIENT still completes the document.
func TestChildTimeoutLenient(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	md := fault("timeout")
	md[peer.MetaFaultChunks] = "0"
	ms := uint32(150)
	pol := modePolicy(wire.ModeLenient)
	pol.TimeoutMs = &ms
	root, kids := c.sendDehydrated(t, []string{"slow\n", "fast\n"}, md, pol, true)
	c.rec.waitStatus(t, kids[0], wire.StatusAbandoned)
	res := c.rec.waitResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if string(res.data) != "fast\n" {
		t.Fatalf("result %q", res.data)
	}
}

func TestDehydratedChildRetry(t *testing.T) {
	srv := startPeer(t, peer.Options{})
	c := dial(t, srv, wire.FormatCBOR, nil)
	root, kids := c.sendDehydrated(t, []string{"x\n", "y\n"}, fault("fail-once"), retryPolicy(1, 5), true)
	res := c.rec.waitResult(t, root)
	c.rec.waitStatus(t, root, wire.StatusComplete)
	if string(res.data) != "x\ny\n" || !strings.Contains(fmtStatuses(c.rec.statuses), "RETRYING("+itoa(kids[0])+")") {
		t.Fatalf("result %q statuses %s", res.data, fmtStatuses(c.rec.statuses))
	}
}
