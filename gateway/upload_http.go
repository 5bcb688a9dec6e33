package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const uploadMethod = "/pipestream.gateway.v1.DocumentService/UploadDocument"

// handleUpload serves POST /v1/documents:upload: the raw request body is the
// document, read in uploadChunkBytes pieces by the UploadDocument handler
// run in this process through the stream interceptor chain (auth
// included; localupload.go). Options come from query parameters; see
// parseUploadOptions. A body above Config.MaxUploadBytes answers 413.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	_, outbound := runtime.MarshalerForRequest(s.gwMux, r)
	opts, err := parseUploadOptions(r.URL.Query(), r.Header.Get("Content-Type"))
	if err != nil {
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	limit := s.cfg.MaxUploadBytes
	if r.ContentLength > limit {
		s.writeStatus(w, r, http.StatusRequestEntityTooLarge, tooLarge(limit))
		return
	}
	// Admission before the body, decided here once (issue 22): the
	// tenant's rate token and upload slot are taken now, atomically, and
	// held until the handler returns; the gRPC call below is marked
	// admitted (preAdmitted) so the interceptor does not take them again.
	// A refused upload gets its 429 (or 503 DISK_FULL) with Retry-After
	// before one byte of its body is read; the connection is closed, not
	// drained.
	tenant, _ := tenantFrom(r.Context())
	if err := s.admitDocument(0); err != nil {
		w.Header().Set("Connection", "close")
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	release, err := s.admitCall(r.Context(), tenant, uploadMethod)
	if err != nil {
		w.Header().Set("Connection", "close")
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	defer release()

	ctx, err := runtime.AnnotateContext(r.Context(), s.gwMux, r, uploadMethod, runtime.WithHTTPPathPattern("/v1/documents:upload"))
	if err != nil {
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	ctx = metadata.AppendToOutgoingContext(ctx, admittedHeader, s.admitNonce)
	body := &rateReader{r: http.MaxBytesReader(w, r.Body, limit), rc: http.NewResponseController(w),
		idle: s.cfg.UploadIdleTimeout, grace: s.rateGrace(), minRate: s.cfg.MinBodyRate}
	// Shutdown cutting uploads stops the body read at once (the handler
	// ends the upload with the same status).
	stopCut := context.AfterFunc(s.uploadsCut, body.stop)
	defer stopCut()
	// The body read to its end: clear the idle deadline so that it cannot
	// fire while the bridge finishes (the HTTP/1 server's background read
	// would take it for a dead client and cancel the request).
	clearDeadline := func() { _ = body.rc.SetReadDeadline(time.Time{}) }
	ls := &localUploadStream{opts: opts, body: body, bodyDone: clearDeadline}
	doc, err, bodyErr := s.uploadLocal(ctx, ls, body.stop)
	if bodyErr != nil {
		s.answerBodyError(w, r, outbound, body, bodyErr, limit)
		return
	}
	if err != nil && !ls.eof {
		// The upload ended before its body did (refused, cut by
		// shutdown): answer and close the connection. net/http reads
		// what is left of an unread body (up to 256 KiB) before it
		// writes the answer and again when the handler returns; with
		// the read deadline cleared, a client that stopped sending
		// would get no answer and hold the connection (and a graceful
		// shutdown) until it hung up. With Connection: close the answer
		// goes first; the drain after it gets drainLinger to take in what
		// the client already sent, so the close is a FIN, not a reset.
		w.Header().Set("Connection", "close")
		body.stop()
		body.lingerAfterStop()
	} else {
		clearDeadline()
	}
	ctx = runtime.NewServerMetadataContext(ctx, runtime.ServerMetadata{HeaderMD: ls.header, TrailerMD: ls.trailer})
	if err != nil {
		runtime.HTTPError(ctx, s.gwMux, outbound, w, r, err)
		return
	}
	runtime.ForwardResponseMessage(ctx, s.gwMux, outbound, w, r, doc)
}

// answerBodyError answers an upload whose body could not be read: cut by
// shutdown, above the limit (413), stalled or too slow (408), or broken.
func (s *Server) answerBodyError(w http.ResponseWriter, r *http.Request, outbound runtime.Marshaler, body *rateReader, err error, limit int64) {
	if s.uploadWasCut() {
		w.Header().Set("Connection", "close")
		body.lingerAfterStop() // the answer, then a FIN (see lingerAfterStop)
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, shutdownUploadError(body.n))
		return
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		s.writeStatus(w, r, http.StatusRequestEntityTooLarge, tooLarge(limit))
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.log.Warn("upload body stalled or too slow; cut", "idle_timeout", s.cfg.UploadIdleTimeout,
			"min_body_rate", s.cfg.MinBodyRate, "bytes", body.n, "remote", r.RemoteAddr, "request_id", httpRequestID(r))
		w.Header().Set("Connection", "close")
		cause := uploadStalled(s.cfg.UploadIdleTimeout)
		if body.slow {
			cause = uploadTooSlow(s.cfg.MinBodyRate, s.rateGrace())
		}
		s.writeStatus(w, r, http.StatusRequestTimeout, cause)
		return
	}
	runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r,
		status.Errorf(codes.InvalidArgument, "reading the request body failed: %v; resend the upload", err))
}

// uploadStalled is the error of an upload whose body stopped arriving.
func uploadStalled(idle time.Duration) error {
	return statusError(codes.DeadlineExceeded, ReasonUploadStalled, fmt.Sprintf(
		"the upload body stalled: nothing arrived for %s (--upload-idle-timeout); resend the upload", idle))
}

// parseUploadOptions reads SubmitOptions from query parameters, driven
// by the SubmitOptions descriptor (upload_options.go), so a field added to
// the proto is a parameter without a change here. Names are the JSON field
// paths (lowerCamelCase; snake_case and any letter case are accepted too):
// contentType (default: the request's Content-Type), split.strategy,
// completionPolicy.mode and so on; a map field takes name.<key>=<value>
// (metadata.owner=alice); a repeated field takes the parameter once per
// value. Enums take their names (SPLIT_LINES, or short: lines) or
// numbers. Unknown parameters are an error listing the known ones, so
// that typos do not silently fall back to defaults.
func parseUploadOptions(q url.Values, contentType string) (*gatewayv1.SubmitOptions, error) {
	opts := &gatewayv1.SubmitOptions{}
	if err := setQueryOptions(opts.ProtoReflect(), q); err != nil {
		return nil, err
	}
	if opts.ContentType == "" {
		opts.ContentType = contentType
	}
	if opts.ContentType == "" {
		opts.ContentType = "application/octet-stream"
	}
	return opts, nil
}

func invalid(msg string) error { return status.Error(codes.InvalidArgument, msg) }
