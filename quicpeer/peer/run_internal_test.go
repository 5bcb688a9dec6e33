package peer

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// The completion-policy timeouts of a session's attempts run on one timer
// (watch.go), set to the earliest deadline and moved when an earlier one
// arrives or it fires: three stalled entities registered with timeout-ms
// 30, 10 and 20 each end ABANDONED (Layer 2, on-timeout FAIL: draft-02
// Section 8.3) at their own deadline, not before, and none is lost. The
// default policy lets the first attempt share the entity's context: the
// timeout that cancels it must still be reported, not taken for the
// entity's end.
func TestPolicyTimeoutsOnOneTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, c := newPlainRig(t)
		start := time.Now()
		timeouts := map[uint32]time.Duration{1: 30 * time.Millisecond, 2: 10 * time.Millisecond, 3: 20 * time.Millisecond}
		for _, id := range []uint32{1, 2, 3} {
			ms := uint32(timeouts[id].Milliseconds())
			h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain", CompletionPolicy: &wire.CompletionPolicy{TimeoutMs: &ms},
				Metadata: map[string]string{MetaProcessor: "fault", MetaFault: FaultTimeout}}
			go plainEntityTo(g, h, "stalls")
			synctest.Wait() // registered in this order: 30, then the earlier 10, then 20
		}
		ended := func(id uint32) bool { return slices.Contains(c.of(id), "ABANDONED "+u32s(id)) }
		for _, step := range []struct {
			at   time.Duration
			want []uint32
		}{{9 * time.Millisecond, nil}, {10 * time.Millisecond, []uint32{2}}, {19 * time.Millisecond, []uint32{2}},
			{20 * time.Millisecond, []uint32{2, 3}}, {29 * time.Millisecond, []uint32{2, 3}}, {30 * time.Millisecond, []uint32{1, 2, 3}}} {
			time.Sleep(time.Until(start.Add(step.at)))
			synctest.Wait()
			var got []uint32
			for _, id := range []uint32{1, 2, 3} {
				if ended(id) {
					got = append(got, id)
				}
			}
			if !slices.Equal(got, step.want) {
				t.Fatalf("at %v: ABANDONED %v, want %v (events %v)", step.at, got, step.want, c.snapshot())
			}
		}
		for _, id := range []uint32{1, 2, 3} {
			if got, want := c.of(id), []string{"PROCESSING " + u32s(id), "ABANDONED " + u32s(id)}; !slices.Equal(got, want) {
				t.Fatalf("entity %d: %v, want %v", id, got, want)
			}
		}
	})
}

func u32s(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// finishedLog records the "entity finished" lines an engine logs.
type finishedLog struct {
	mu    sync.Mutex
	level slog.Level
	lines []slog.Level
}

func (h *finishedLog) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *finishedLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "entity finished" {
		h.mu.Lock()
		h.lines = append(h.lines, r.Level)
		h.mu.Unlock()
	}
	return nil
}
func (h *finishedLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *finishedLog) WithGroup(string) slog.Handler      { return h }

// A whole document that completes logs "entity finished" at Debug (one
// line per document cost ~3% of a small document's CPU at Info); one
// that fails still logs it at Info.
func TestEntityFinishedLevels(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		g, _ := newPlainRig(t)
		h := &finishedLog{level: level}
		g.log = slog.New(h)
		plainEntityTo(g, &wire.EntityHeader{EntityID: 1, ContentType: "text/plain"}, "fine")
		plainEntityTo(g, &wire.EntityHeader{EntityID: 2, ContentType: "text/plain", Metadata: map[string]string{MetaProcessor: "fault", MetaFault: FaultFail}}, "fails")
		want := []slog.Level{slog.LevelInfo} // the failure
		if level == slog.LevelDebug {
			want = []slog.Level{slog.LevelDebug, slog.LevelInfo}
		}
		h.mu.Lock()
		got := slices.Clone(h.lines)
		h.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("logger at %v: \"entity finished\" at %v, want %v", level, got, want)
		}
	}
}

// A timeout that passes while a yielded entity waits to resume: with the
// default policy (on-timeout FAIL: nothing follows a timeout but a
// terminal status) the attempt shares the entity's context, so the
// timeout ends the wait and the entity goes YIELDED -> ABANDONED at its
// deadline (a valid transition, draft-02 Section 6.2.3). With on-timeout
// RETRY the attempt has a context of its own and the retry follows as
// before: the wait ends at the resume delay, then FAILED, RETRYING and a
// new attempt.
func TestTimeoutWhileYielded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, c := newPlainRig(t)
		ms := uint32(yieldResumeDelay.Milliseconds() / 2)
		h := &wire.EntityHeader{EntityID: 1, ContentType: "text/plain", CompletionPolicy: &wire.CompletionPolicy{TimeoutMs: &ms},
			Metadata: map[string]string{MetaProcessor: "fault", MetaFault: FaultYield}}
		start := time.Now()
		plainEntityTo(g, h, "yields")
		if got, want := c.of(1), []string{"PROCESSING 1", "YIELDED 1", "ABANDONED 1"}; !slices.Equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		if took := time.Since(start); took != time.Duration(ms)*time.Millisecond {
			t.Fatalf("ABANDONED after %v, want at the %d ms deadline", took, ms)
		}

		retry, one, delay := wire.ActionRetry, uint32(1), uint32(0)
		h = &wire.EntityHeader{EntityID: 2, ContentType: "text/plain", Metadata: map[string]string{MetaProcessor: "fault", MetaFault: FaultYield},
			CompletionPolicy: &wire.CompletionPolicy{TimeoutMs: &ms, OnTimeout: &retry, MaxRetries: &one, RetryDelayMs: &delay}}
		plainEntityTo(g, h, "yields")
		got := c.of(2)
		if want := []string{"PROCESSING 2", "YIELDED 2", "PROCESSING 2", "FAILED 2", "RETRYING 2", "PROCESSING 2"}; len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Fatalf("statuses with on-timeout RETRY %v, want them to start %v", got, want)
		}
	})
}
