package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const uploadMethod = "/pipestream.gateway.v1.DocumentService/UploadDocument"

// handleUpload serves POST /v1/documents:upload: the raw request body is the
// document, streamed in uploadChunkBytes messages into the UploadDocument
// client stream over the REST proxy's gRPC connection (so the interceptor
// chain, auth included, applies). Options come from query parameters; see
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
	if err := s.admitDocument(); err != nil {
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

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ctx, err = runtime.AnnotateContext(ctx, s.gwMux, r, uploadMethod, runtime.WithHTTPPathPattern("/v1/documents:upload"))
	if err != nil {
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	ctx = metadata.AppendToOutgoingContext(ctx, admittedHeader, s.admitNonce)
	var header, trailer metadata.MD
	stream, err := gatewayv1.NewDocumentServiceClient(s.conn).UploadDocument(ctx, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		runtime.HTTPError(ctx, s.gwMux, outbound, w, r, err)
		return
	}
	fail := func(err error) {
		ctx := runtime.NewServerMetadataContext(ctx, runtime.ServerMetadata{HeaderMD: header, TrailerMD: trailer})
		runtime.HTTPError(ctx, s.gwMux, outbound, w, r, err)
	}

	sendErr := stream.Send(&gatewayv1.UploadDocumentRequest{Options: opts})
	body := &rateReader{r: http.MaxBytesReader(w, r.Body, limit), rc: http.NewResponseController(w),
		idle: s.cfg.UploadIdleTimeout, grace: s.rateGrace(), minRate: s.cfg.MinBodyRate}
	// Shutdown cutting uploads stops the body read at once (the gRPC
	// handler ends the stream with the same status).
	stopCut := context.AfterFunc(s.uploadsCut, func() { _ = body.rc.SetReadDeadline(time.Now()) })
	defer stopCut()
	buf := make([]byte, uploadChunkBytes)
	for sendErr == nil {
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			// SendMsg serializes before returning, so buf is reusable.
			sendErr = stream.Send(&gatewayv1.UploadDocumentRequest{Chunk: buf[:n]})
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			cancel() // abort the gRPC stream; the bridge discards the partial upload
			if s.uploadWasCut() {
				w.Header().Set("Connection", "close")
				runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, shutdownUploadError(body.n))
				return
			}
			var tooBig *http.MaxBytesError
			if errors.As(rerr, &tooBig) {
				s.writeStatus(w, r, http.StatusRequestEntityTooLarge, tooLarge(limit))
				return
			}
			if errors.Is(rerr, os.ErrDeadlineExceeded) {
				s.log.Warn("upload body stalled or too slow; cut", "idle_timeout", s.cfg.UploadIdleTimeout,
					"min_body_rate", s.cfg.MinBodyRate, "bytes", body.n, "remote", r.RemoteAddr)
				w.Header().Set("Connection", "close")
				cause := uploadStalled(s.cfg.UploadIdleTimeout)
				if body.slow {
					cause = uploadTooSlow(s.cfg.MinBodyRate, s.rateGrace())
				}
				s.writeStatus(w, r, http.StatusRequestTimeout, cause)
				return
			}
			fail(status.Errorf(codes.InvalidArgument, "reading the request body failed: %v; resend the upload", rerr))
			return
		}
	}
	// The body is read: clear the idle deadline so that it cannot fire
	// while the bridge finishes (the HTTP/1 server's background read would
	// take it for a dead client and cancel the request).
	_ = body.rc.SetReadDeadline(time.Time{})
	// io.EOF from Send means the server ended the stream; CloseAndRecv
	// returns its status.
	doc, err := stream.CloseAndRecv()
	if err != nil {
		fail(err)
		return
	}
	ctx = runtime.NewServerMetadataContext(ctx, runtime.ServerMetadata{HeaderMD: header, TrailerMD: trailer})
	runtime.ForwardResponseMessage(ctx, s.gwMux, outbound, w, r, doc)
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
