package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Fault is the fault-injection processor (docs/profile.md 4.4), driven by
// pipestream.fault on the entity's header:
//
//	fail       every attempt fails
//	fail-once  the first attempt fails, retries succeed (needs on-failure RETRY)
//	yield      YIELDED with a Yield token, then the peer resumes it (Layer 2)
//	defer      DEFERRED with a claim check (Layer 2); redemption processes it
//	timeout    never finishes; the policy's timeout-ms ends it (on-timeout
//	           decides what follows). The wait holds no worker.
//	timeout-once  the first attempt never finishes, retries succeed (needs
//	           on-timeout RETRY)
//
// pipestream.fault-chunks (on the entity, else on the root) limits the
// fault to those chunk indexes. Where no fault applies, and on a redeemed
// claim, Fault behaves like Passthrough.
type Fault struct{}

// ErrInjected is the failure the fault processor injects.
var ErrInjected = errors.New("fault processor: injected failure")

// Fault actions.
const (
	FaultFail        = "fail"
	FaultFailOnce    = "fail-once"
	FaultYield       = "yield"
	FaultDefer       = "defer"
	FaultTimeout     = "timeout"
	FaultTimeoutOnce = "timeout-once"
)

// yieldReasonExternalCall is Yield Reason EXTERNAL_CALL (Section 6.6.2.1).
const yieldReasonExternalCall = 0x1

func (Fault) Process(ctx context.Context, in *Input) (*Output, error) {
	action := in.Header.Metadata[MetaFault]
	if in.Redeemed || !faultApplies(in) {
		return Passthrough{}.Process(ctx, in)
	}
	switch action {
	case "":
		return Passthrough{}.Process(ctx, in)
	case FaultFail:
		return nil, ErrInjected
	case FaultFailOnce:
		if in.Attempt == 0 {
			return nil, fmt.Errorf("%w (first attempt)", ErrInjected)
		}
		return Passthrough{}.Process(ctx, in)
	case FaultYield:
		half := uint64(len(in.Payload) / 2)
		if in.Resume == nil {
			if in.Yields > 0 { // resumed from the start after a rejected token
				return Passthrough{}.Process(ctx, in)
			}
			st := binary.BigEndian.AppendUint64(nil, half)
			return &Output{Yield: &YieldRequest{Reason: yieldReasonExternalCall, State: st}}, nil
		}
		if len(in.Resume) != 8 || binary.BigEndian.Uint64(in.Resume) != half {
			return nil, fmt.Errorf("fault processor: resume state does not match the payload")
		}
		return Passthrough{}.Process(ctx, in)
	case FaultDefer:
		ttl, err := claimTTL(in.Header.Metadata)
		if err != nil {
			return nil, err
		}
		return &Output{Defer: &DeferRequest{TTL: ttl}}, nil
	case FaultTimeout:
		return nil, errStall
	case FaultTimeoutOnce:
		if in.Attempt == 0 {
			return nil, errStall
		}
		return Passthrough{}.Process(ctx, in)
	default:
		return nil, fmt.Errorf("fault processor: unknown %s %q: use fail, fail-once, yield, defer, timeout or timeout-once", MetaFault, action)
	}
}

func (Fault) Rehydrate(ctx context.Context, parts []*Output) (*Output, error) {
	return Passthrough{}.Rehydrate(ctx, parts)
}

// ConcatType makes Fault a Concatenator like Passthrough.
func (Fault) ConcatType(first *Output) (string, uint8) { return Passthrough{}.ConcatType(first) }

func claimTTL(md map[string]string) (time.Duration, error) {
	s := md[MetaClaimTTL]
	if s == "" {
		return 0, nil
	}
	ms, err := strconv.ParseUint(s, 10, 32)
	if err != nil || ms == 0 {
		return 0, fmt.Errorf("%s %q: want a positive integer of milliseconds", MetaClaimTTL, s)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// faultApplies reports whether pipestream.fault-chunks selects this entity.
// Roots and entities without chunk-info are always selected.
func faultApplies(in *Input) bool {
	list := in.Header.Metadata[MetaFaultChunks]
	if list == "" && in.RootMeta != nil {
		list = in.RootMeta[MetaFaultChunks]
	}
	if list == "" || in.ChunkIndex < 0 {
		return true
	}
	for f := range strings.SplitSeq(list, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n == in.ChunkIndex {
			return true
		}
	}
	return false
}
