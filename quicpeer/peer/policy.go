package peer

import (
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// policy is a completion policy with the draft-02 Section 8.2 defaults
// applied (docs/profile.md 5).
type policy struct {
	mode       wire.CompletionMode
	maxRetries int
	retryDelay time.Duration
	timeout    time.Duration
	minRatio   float64
	onTimeout  wire.FailureAction
	onFailure  wire.FailureAction
}

func effectivePolicy(p *wire.CompletionPolicy) policy {
	out := policy{mode: wire.ModeStrict, maxRetries: defaultMaxRetries, retryDelay: defaultRetryDelay,
		timeout: defaultPolicyTimeout, minRatio: defaultQuorumRatio, onTimeout: wire.ActionFail, onFailure: wire.ActionFail}
	if p == nil {
		return out
	}
	if p.Mode != nil && *p.Mode != wire.ModeUnspecified && *p.Mode <= wire.ModeQuorum {
		out.mode = *p.Mode
	}
	if p.MaxRetries != nil {
		out.maxRetries = int(min(*p.MaxRetries, 100))
	}
	if p.RetryDelayMs != nil {
		out.retryDelay = min(time.Duration(*p.RetryDelayMs)*time.Millisecond, maxRetryDelay)
	}
	if p.TimeoutMs != nil && *p.TimeoutMs > 0 {
		out.timeout = time.Duration(*p.TimeoutMs) * time.Millisecond
	}
	if p.MinSuccessRatio != nil && *p.MinSuccessRatio >= 0 && *p.MinSuccessRatio <= 1 {
		out.minRatio = float64(*p.MinSuccessRatio)
	}
	if p.OnTimeout != nil && *p.OnTimeout != wire.ActionUnspecified && *p.OnTimeout <= wire.ActionDefer {
		out.onTimeout = *p.OnTimeout
	}
	if p.OnFailure != nil && *p.OnFailure != wire.ActionUnspecified && *p.OnFailure <= wire.ActionDefer {
		out.onFailure = *p.OnFailure
	}
	return out
}

// childOutcome is how one child of a dehydrated parent ended.
type childOutcome uint8

const (
	outcomeSucceeded childOutcome = iota // COMPLETE
	outcomeFailed                        // FAILED (no retry left), integrity error
	outcomeSkipped                       // failed or timed out, excluded by on-failure/on-timeout SKIP
	outcomeAbandoned                     // ABANDONED (timeout, expired claim)
)

// verdict is the result of evaluating a completion policy.
type verdict struct {
	complete  bool
	succeeded int
	total     int
}

// evaluate applies the completion mode (Section 8.2, docs/profile.md 5) to
// the outcomes of all N children. Skipped children leave the denominator
// of STRICT; every other mode counts them as not succeeded.
func (p policy) evaluate(outcomes []childOutcome) verdict {
	v := verdict{total: len(outcomes)}
	skipped, bad := 0, 0
	for _, o := range outcomes {
		switch o {
		case outcomeSucceeded:
			v.succeeded++
		case outcomeSkipped:
			skipped++
		default:
			bad++
		}
	}
	switch p.mode {
	case wire.ModeLenient:
		v.complete = v.succeeded >= 1
	case wire.ModeBestEffort:
		v.complete = true
	case wire.ModeQuorum:
		v.complete = v.total == 0 || float64(v.succeeded)/float64(v.total) >= p.minRatio
	default: // STRICT, UNSPECIFIED
		v.complete = bad == 0
	}
	return v
}
