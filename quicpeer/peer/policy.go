package peer

import (
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// policy is a completion policy with the draft-02 Section 8.3 defaults
// applied (docs/profile.md 5): what the engine needs to run an entity
// (retries, delay, timeout, actions). The completion mode is evaluated by
// the document's assembly.Manifest (QUORUM's default ratio lives there).
type policy struct {
	mode       wire.CompletionMode
	maxRetries int
	retryDelay time.Duration
	timeout    time.Duration
	onTimeout  wire.FailureAction
	onFailure  wire.FailureAction
}

func effectivePolicy(p *wire.CompletionPolicy) policy {
	out := policy{mode: wire.ModeStrict, maxRetries: defaultMaxRetries, retryDelay: defaultRetryDelay,
		timeout: defaultPolicyTimeout, onTimeout: wire.ActionFail, onFailure: wire.ActionFail}
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

// status is the final status the outcome records in the document's
// Assembly Manifest, whose Evaluate applies the completion mode
// (docs/profile.md 5): a SKIP action makes the child SKIPPED there whatever
// was sent on the wire (FAILED or ABANDONED), so it leaves STRICT's
// denominator.
func (o childOutcome) status() wire.Status {
	switch o {
	case outcomeSucceeded:
		return wire.StatusComplete
	case outcomeSkipped:
		return wire.StatusSkipped
	case outcomeAbandoned:
		return wire.StatusAbandoned
	default:
		return wire.StatusFailed
	}
}
