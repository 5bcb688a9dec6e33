package gateway

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
)

// ErrorInfo reasons this API returns (google.rpc.ErrorInfo.reason, domain
// "pipestream.gateway.v1"). Clients switch on these, not on messages.
const (
	ReasonClaimAlreadyRedeemed = "CLAIM_ALREADY_REDEEMED"
	ReasonClaimExpired         = "CLAIM_EXPIRED"
	ReasonTooLarge             = "TOO_LARGE"
	ReasonFailedPrecondition   = "FAILED_PRECONDITION"
	// ReasonResultAbsent: the document SUCCEEDED without a result (a peer
	// without the profile returned none).
	ReasonResultAbsent = "RESULT_ABSENT"
	// ReasonPeerUnavailable: a claim's entity waits at a peer that is
	// gone and the document runs nowhere else yet (docs/scale-out.md).
	ReasonPeerUnavailable = "PEER_UNAVAILABLE"
	// ReasonStoreUnavailable: the database (pgstore) is restarting or out
	// of reach; the call did not complete; retry. The message names no
	// database URL, user, host or port (storeUnavailableMessage).
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"
	// ReasonFutureCursor and ReasonConsumerTooSlow use the AT sync draft's
	// error names verbatim (draft-holmgren-at-synchronization-00, Error Frames).
	ReasonFutureCursor    = "FutureCursor"
	ReasonConsumerTooSlow = "ConsumerTooSlow"
)

// errorMapping lists, in match order, which bridge error becomes which gRPC
// code and ErrorInfo reason ("" = no ErrorInfo).
var errorMapping = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{bridge.ErrClaimRedeemed, codes.FailedPrecondition, ReasonClaimAlreadyRedeemed},
	{bridge.ErrClaimExpired, codes.FailedPrecondition, ReasonClaimExpired},
	{bridge.ErrFutureCursor, codes.OutOfRange, ReasonFutureCursor},
	{bridge.ErrConsumerTooSlow, codes.ResourceExhausted, ReasonConsumerTooSlow},
	{bridge.ErrResultAbsent, codes.NotFound, ReasonResultAbsent},
	{bridge.ErrNotFound, codes.NotFound, ""},
	{bridge.ErrInvalid, codes.InvalidArgument, ""},
	{bridge.ErrConflict, codes.AlreadyExists, ""},
	{bridge.ErrFailedPrecondition, codes.FailedPrecondition, ReasonFailedPrecondition},
	// The database is restarting or unreachable (pgstore): nothing was
	// accepted; retry (docs/scale-out.md, Failures).
	{store.ErrUnavailable, codes.Unavailable, ReasonStoreUnavailable},
	{bridge.ErrTooLarge, codes.InvalidArgument, ReasonTooLarge},
	{bridge.ErrPeerUnavailable, codes.Unavailable, ReasonPeerUnavailable},
	{bridge.ErrUnavailable, codes.Unavailable, ""},
	{bridge.ErrResourceExhausted, codes.ResourceExhausted, ""},
}

// toStatus converts an error from the bridge (or the gateway itself) into a
// gRPC status error. Errors that already carry a status pass through; the
// bridge's message, which says what to fix, is kept verbatim.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if st, ok := diskStatus(err); ok {
		return st
	}
	if storeUnreachable(err) {
		// The driver's error names the database's address and user: it
		// stays in the server's log, never in an answer.
		return statusError(codes.Unavailable, ReasonStoreUnavailable, storeUnavailableMessage)
	}
	for _, m := range errorMapping {
		if errors.Is(err, m.err) {
			return statusError(m.code, m.reason, err.Error())
		}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// statusError builds a status with an optional ErrorInfo detail.
func statusError(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	if reason == "" {
		return st.Err()
	}
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// errorReason returns the ErrorInfo reason of a status error, or "".
func errorReason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// storeUnavailableMessage is the whole message of a STORE_UNAVAILABLE error.
const storeUnavailableMessage = "the gateway's database is restarting or out of reach; this call did not complete: retry in a few seconds"

// storeUnreachable reports whether err means the database could not be
// reached: store.ErrUnavailable, or a driver's connection error that a
// store path returned without classifying it (its text names the
// database's user, host and port, pgconn's "failed to connect to").
func storeUnreachable(err error) bool {
	return errors.Is(err, store.ErrUnavailable) || strings.Contains(err.Error(), "failed to connect to `")
}
