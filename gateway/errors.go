package gateway

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
)

// ErrorInfo reasons this API returns (google.rpc.ErrorInfo.reason, domain
// "pipestream.gateway.v1"). Clients switch on these, not on messages.
const (
	ReasonClaimAlreadyRedeemed = "CLAIM_ALREADY_REDEEMED"
	ReasonClaimExpired         = "CLAIM_EXPIRED"
	// ReasonClaimCancelled: the claim's document ended (cancelled, failed
	// or finished) while the claim was ISSUED.
	ReasonClaimCancelled     = "CLAIM_CANCELLED"
	ReasonTooLarge           = "TOO_LARGE"
	ReasonFailedPrecondition = "FAILED_PRECONDITION"
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
	// ReasonRouteNotFound: no REST route has the request's path.
	ReasonRouteNotFound = "ROUTE_NOT_FOUND"
	// ReasonMethodNotAllowed: the path exists under other methods (Allow).
	ReasonMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// ReasonWebSocketHandshake: /v1/events/ws got no valid WebSocket
	// handshake (RFC 6455), or one from a foreign Origin.
	ReasonWebSocketHandshake = "WEBSOCKET_HANDSHAKE"
	// ReasonUnknownMethod: a gRPC call of a method no service has.
	ReasonUnknownMethod = "UNKNOWN_METHOD"
)

// unknownMethod answers a gRPC call of a method no registered service has
// (grpc.UnknownServiceHandler) in the one error shape; the interceptors
// run as for any call (the metrics label it "unknown": knownMethods).
func unknownMethod(_ any, ss grpc.ServerStream) error {
	m, _ := grpc.MethodFromServerStream(ss)
	if len(m) > 200 {
		m = m[:200] + "..."
	}
	return statusError(codes.Unimplemented, ReasonUnknownMethod, fmt.Sprintf(
		"unknown method %q: this server has pipestream.gateway.v1.DocumentService, EventService, google.longrunning.Operations, grpc.health.v1.Health and reflection (list them with grpcurl ... list)", m))
}

// codeReasons are the reasons of errors that have no more specific one:
// the gRPC code's canonical name (google.rpc.Code), so every error carries
// an ErrorInfo a client can switch on (docs/errors.md).
var codeReasons = map[codes.Code]string{
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// errorMapping lists, in match order, which bridge error becomes which gRPC
// code and ErrorInfo reason ("" = no ErrorInfo).
var errorMapping = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{bridge.ErrClaimRedeemed, codes.FailedPrecondition, ReasonClaimAlreadyRedeemed},
	{bridge.ErrClaimExpired, codes.FailedPrecondition, ReasonClaimExpired},
	{bridge.ErrClaimCancelled, codes.FailedPrecondition, ReasonClaimCancelled},
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

// statusError is the one constructor of the API's errors: a status with
// code, message and an ErrorInfo{reason, domain pipestream.gateway.v1}
// detail, plus any further details (RetryInfo for limits). reason ""
// takes the code's generic reason (codeReasons). Every error any route or
// transport answers also passes through shapeError, which gives an
// ErrorInfo to errors made elsewhere (grpc-gateway, the gRPC runtime).
func statusError(code codes.Code, reason, msg string, details ...protoadapt.MessageV1) error {
	if reason == "" {
		reason = codeReasons[code]
	}
	st := status.New(code, msg)
	all := append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}}, details...)
	if withInfo, err := st.WithDetails(all...); err == nil {
		st = withInfo
	}
	return st.Err()
}

// leakedPrefix matches what wrapping a status error's Error() text in
// another status leaves in a message (grpc-gateway's generated handlers
// do so with query parser errors).
var leakedPrefix = regexp.MustCompile(`rpc error: code = [A-Za-z]+ desc = `)

// shapeError returns err as the API's one error shape: a status whose
// message has no leaked "rpc error: code = ... desc =" prefix and whose
// details hold an ErrorInfo (the code's generic reason when it had none).
// nil stays nil. It runs at every edge: the gRPC interceptors
// (errorShapeUnary, errorShapeStream) and every HTTP error writer.
func shapeError(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	if st.Code() == codes.OK {
		return err
	}
	msg := st.Message()
	if strings.Contains(msg, "rpc error: ") {
		msg = leakedPrefix.ReplaceAllString(msg, "")
	}
	if msg == st.Message() && errorReason(err) != "" {
		return st.Err()
	}
	p := st.Proto()
	p.Message = msg
	shaped := status.FromProto(p)
	if errorReason(shaped.Err()) == "" {
		if withInfo, werr := shaped.WithDetails(&errdetails.ErrorInfo{Reason: codeReasons[st.Code()], Domain: errorDomain}); werr == nil {
			shaped = withInfo
		}
	}
	return shaped.Err()
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
