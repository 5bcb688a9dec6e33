package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

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
	// Admission before the body: a tenant at its upload cap or out of
	// rate gets its 429 now, not after a chunk of the body was read; the
	// disk check likewise. The connection is closed, not drained.
	tenant, _ := tenantFrom(r.Context())
	if err := s.limits.wouldRefuse(uploadMethod, tenant); err != nil {
		w.Header().Set("Connection", "close")
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	if err := s.admitDocument(); err != nil {
		w.Header().Set("Connection", "close")
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ctx, err = runtime.AnnotateContext(ctx, s.gwMux, r, uploadMethod, runtime.WithHTTPPathPattern("/v1/documents:upload"))
	if err != nil {
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
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

// parseUploadOptions reads SubmitOptions from query parameters. Names are
// the JSON field paths (lowerCamelCase; snake_case is accepted too):
// contentType (default: the request's Content-Type), requestId,
// displayName, split.strategy, split.chunkBytes, split.maxDepth,
// split.processor, completionPolicy.mode, completionPolicy.maxRetries,
// completionPolicy.retryDelayMs, completionPolicy.timeoutMs,
// completionPolicy.minSuccessRatio, completionPolicy.onFailure,
// completionPolicy.onTimeout, and metadata.<key>=<value>. Enums take their
// names (SPLIT_LINES, or short: lines) or numbers. Unknown parameters are an
// error, so that typos do not silently fall back to defaults.
func parseUploadOptions(q url.Values, contentType string) (*gatewayv1.SubmitOptions, error) {
	opts := &gatewayv1.SubmitOptions{ContentType: contentType}
	split := &gatewayv1.SplitOptions{}
	policy := &gatewayv1.CompletionPolicy{}
	var hasSplit, hasPolicy bool
	for key, vals := range q {
		if len(vals) == 0 {
			continue
		}
		v := vals[len(vals)-1]
		if mk, ok := strings.CutPrefix(key, "metadata."); ok {
			if err := setMetadata(opts, mk, v); err != nil {
				return nil, err
			}
			continue
		}
		norm := strings.ToLower(strings.ReplaceAll(key, "_", ""))
		var known bool
		var err error
		switch {
		case strings.HasPrefix(norm, "split."):
			hasSplit = true
			known, err = setSplitOption(split, norm, v)
		case strings.HasPrefix(norm, "completionpolicy."):
			hasPolicy = true
			known, err = setPolicyOption(policy, norm, v)
		default:
			known = setTopOption(opts, norm, v)
		}
		if !known {
			return nil, invalid(fmt.Sprintf("unknown query parameter %q: known are contentType, requestId, displayName, split.strategy, split.chunkBytes, split.maxDepth, split.processor, completionPolicy.mode, completionPolicy.maxRetries, completionPolicy.retryDelayMs, completionPolicy.timeoutMs, completionPolicy.minSuccessRatio, completionPolicy.onFailure, completionPolicy.onTimeout, metadata.<key>", key))
		}
		if err != nil {
			return nil, invalid(fmt.Sprintf("query parameter %s=%q: %v", key, v, err))
		}
	}
	if opts.ContentType == "" {
		opts.ContentType = "application/octet-stream"
	}
	if hasSplit {
		opts.Split = split
	}
	if hasPolicy {
		opts.CompletionPolicy = policy
	}
	return opts, nil
}

// setMetadata sets metadata.<key>=v.
func setMetadata(opts *gatewayv1.SubmitOptions, key, v string) error {
	if key == "" {
		return invalid("metadata.<key>: the key is empty; use metadata.owner=alice")
	}
	if opts.Metadata == nil {
		opts.Metadata = map[string]string{}
	}
	opts.Metadata[key] = v
	return nil
}

// setTopOption sets a top-level option (normalized name); false: unknown.
func setTopOption(opts *gatewayv1.SubmitOptions, norm, v string) bool {
	switch norm {
	case "contenttype":
		opts.ContentType = v
	case "requestid":
		opts.RequestId = v
	case "displayname":
		opts.DisplayName = v
	default:
		return false
	}
	return true
}

// setSplitOption sets split.<name>; known is false for an unknown name.
func setSplitOption(split *gatewayv1.SplitOptions, norm, v string) (known bool, err error) {
	switch norm {
	case "split.strategy":
		var n int32
		n, err = parseEnum(v, gatewayv1.SplitStrategy(0).Descriptor(), "SPLIT_")
		split.Strategy = gatewayv1.SplitStrategy(n)
	case "split.chunkbytes":
		split.ChunkBytes, err = parseUint32(v)
	case "split.maxdepth":
		split.MaxDepth, err = parseUint32(v)
	case "split.processor":
		split.Processor = v
	default:
		return false, nil
	}
	return true, err
}

// setPolicyOption sets completionPolicy.<name>; known is false for an
// unknown name.
func setPolicyOption(policy *gatewayv1.CompletionPolicy, norm, v string) (known bool, err error) {
	switch norm {
	case "completionpolicy.mode":
		var n int32
		n, err = parseEnum(v, gatewayv1.CompletionPolicy_Mode(0).Descriptor(), "")
		policy.Mode = gatewayv1.CompletionPolicy_Mode(n)
	case "completionpolicy.maxretries":
		policy.MaxRetries, err = parseUint32(v)
	case "completionpolicy.retrydelayms":
		policy.RetryDelayMs, err = parseUint32(v)
	case "completionpolicy.timeoutms":
		policy.TimeoutMs, err = parseUint32(v)
	case "completionpolicy.minsuccessratio":
		var f float64
		f, err = strconv.ParseFloat(v, 32)
		if err == nil && (f < 0 || f > 1) {
			err = errors.New("must be between 0 and 1")
		}
		policy.MinSuccessRatio = float32(f)
	case "completionpolicy.onfailure":
		policy.OnFailure, err = parseAction(v)
	case "completionpolicy.ontimeout":
		policy.OnTimeout, err = parseAction(v)
	default:
		return false, nil
	}
	return true, err
}

func parseAction(v string) (gatewayv1.CompletionPolicy_Action, error) {
	n, err := parseEnum(v, gatewayv1.CompletionPolicy_Action(0).Descriptor(), "")
	return gatewayv1.CompletionPolicy_Action(n), err
}

func invalid(msg string) error { return status.Error(codes.InvalidArgument, msg) }

func parseUint32(v string) (uint32, error) {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, errors.New("want a non-negative integer below 2^32")
	}
	return uint32(n), nil
}

// parseEnum accepts an enum value's name (case-insensitive, with or without
// prefix) or its number.
func parseEnum(v string, ed protoreflect.EnumDescriptor, prefix string) (int32, error) {
	if n, err := strconv.ParseInt(v, 10, 32); err == nil {
		if ed.Values().ByNumber(protoreflect.EnumNumber(n)) == nil {
			return 0, fmt.Errorf("no %s value %d", ed.Name(), n)
		}
		return int32(n), nil
	}
	up := strings.ToUpper(strings.ReplaceAll(v, "-", "_"))
	for _, name := range []string{up, prefix + up} {
		if ev := ed.Values().ByName(protoreflect.Name(name)); ev != nil {
			return int32(ev.Number()), nil
		}
	}
	names := make([]string, 0, ed.Values().Len())
	for i := 0; i < ed.Values().Len(); i++ {
		if n := ed.Values().Get(i).Number(); n != 0 {
			names = append(names, string(ed.Values().Get(i).Name()))
		}
	}
	return 0, fmt.Errorf("want one of %s", strings.Join(names, ", "))
}
