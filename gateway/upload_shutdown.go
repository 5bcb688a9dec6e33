package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Uploads at shutdown. Shutdown lets uploads in progress finish while it
// can (the bridge waits for them), but an upload still running shortly
// before the shutdown deadline is cut by the gateway itself, so that its
// client gets a status that says what happened (Unavailable, reason
// SHUTTING_DOWN, RetryInfo; REST 503 with Retry-After) rather than a
// connection torn down at the deadline (a bare EOF). An upload that starts
// while the server drains is refused the same way.

// ReasonShuttingDown is the ErrorInfo reason of an upload refused or cut
// because the server is shutting down.
const ReasonShuttingDown = "SHUTTING_DOWN"

// uploadCutGrace is how long before the shutdown deadline uploads are
// cut (at most half the shutdown budget), leaving time to send their
// status before the listeners close.
const uploadCutGrace = 2 * time.Second

// uploadRetryAfter is the RetryInfo of a cut upload: a restart's time.
const uploadRetryAfter = 5 * time.Second

var errUploadCut = errors.New("the server is shutting down")

// shutdownUploadError is the status of an upload refused (received < 0)
// or cut after received bytes because the server is shutting down.
func shutdownUploadError(received int64) error {
	msg := "the server is shutting down and accepts no new uploads: nothing was stored; retry the upload once the server is back"
	if received >= 0 {
		msg = fmt.Sprintf("the server is shutting down: this upload was cut after %d bytes and nothing was stored; retry the upload (with the same requestId, if any) once the server is back", received)
	}
	return statusError(codes.Unavailable, ReasonShuttingDown, msg, &errdetails.RetryInfo{RetryDelay: durationpb.New(uploadRetryAfter)})
}

// scheduleUploadCut cuts the uploads still running uploadCutGrace (or
// half the budget, if less) before ctx's deadline, or when ctx ends if it
// has none; the returned func cancels the schedule.
func (s *Server) scheduleUploadCut(ctx context.Context) func() {
	dl, ok := ctx.Deadline()
	if !ok {
		stop := context.AfterFunc(ctx, s.cutUploads)
		return func() { stop() }
	}
	budget := time.Until(dl)
	t := time.AfterFunc(budget-min(uploadCutGrace, budget/2), s.cutUploads)
	return func() { t.Stop() }
}

// uploadContext derives the context of bridge.Upload: it ends, and
// onCut runs (closing the upload's pipe), when uploads are cut.
func (s *Server) uploadContext(ctx context.Context, onCut func()) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.uploadsCut, func() { onCut(); cancel() })
	return ctx, func() { stop(); cancel() }
}

// uploadWasCut reports whether uploads were cut by shutdown.
func (s *Server) uploadWasCut() bool { return s.uploadsCut.Err() != nil }
