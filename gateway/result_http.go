package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const resultMethod = "/pipestream.gateway.v1.DocumentService/GetDocumentResult"

// handleResult serves GET /v1/documents/{id}/result: the GetDocumentResult
// stream, over the REST proxy's gRPC connection (so the interceptor chain,
// auth included, applies), written as the raw response body with the
// result's Content-Type and, when known, Content-Length. It replaces
// grpc-gateway's route because ForwardResponseStream writes a delimiter
// ("\n") after every HttpBody chunk and answers errors in the stream shape.
// An error before the first message answers its HTTP status with a
// google.rpc.Status body, as every unary route does; an error after the
// status line aborts the connection, so the client sees a short body (with
// Content-Length, or a chunked body without its last chunk), never a
// silently truncated result.
func (s *Server) handleResult(w http.ResponseWriter, r *http.Request) {
	_, outbound := runtime.MarshalerForRequest(s.gwMux, r)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ctx, err := runtime.AnnotateContext(ctx, s.gwMux, r, resultMethod, runtime.WithHTTPPathPattern("/v1/documents/{id}/result"))
	if err != nil {
		runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err)
		return
	}
	var header, trailer metadata.MD
	fail := func(err error) {
		ctx := runtime.NewServerMetadataContext(ctx, runtime.ServerMetadata{HeaderMD: header, TrailerMD: trailer})
		runtime.HTTPError(ctx, s.gwMux, outbound, w, r, err)
	}
	stream, err := gatewayv1.NewDocumentServiceClient(s.conn).GetDocumentResult(ctx,
		&gatewayv1.GetDocumentResultRequest{Id: r.PathValue("id")}, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		fail(err)
		return
	}
	first, err := stream.Recv()
	if err == nil {
		// grpc.Header fills header only when a stream ends.
		header, err = stream.Header()
	}
	if errors.Is(err, io.EOF) {
		err = status.Error(codes.Internal, "the result stream ended before its first message; fetch the result again")
	}
	if err != nil {
		fail(err)
		return
	}
	h := w.Header()
	for k, vs := range header {
		if k == resultSizeHeader {
			continue
		}
		if name, ok := outgoingHeader(k); ok {
			for _, v := range vs {
				h.Add(name, v)
			}
		}
	}
	ct := first.GetContentType()
	if ct == "" {
		ct = "application/octet-stream"
	}
	h.Set("Content-Type", ct)
	if v := header.Get(resultSizeHeader); len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n >= 0 {
			h.Set("Content-Length", strconv.FormatInt(n, 10))
		}
	}
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := w.Write(first.GetData()); err != nil {
		return // the client went away; cancel ends the stream
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			s.log.Warn("result download failed after the status line; aborting the connection",
				"path", r.URL.Path, "code", status.Code(err).String(), "error", status.Convert(err).Message())
			panic(http.ErrAbortHandler)
		}
		if _, err := w.Write(msg.GetData()); err != nil {
			return
		}
	}
}
