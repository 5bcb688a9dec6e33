package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// REST routes of google.longrunning.Operations (docs/operations.md). They
// are written by hand over grpc-gateway's runtime instead of generated: the
// Go types live in a foreign module (cloud.google.com/go/longrunning) and
// googleapis' operations.proto has no HTTP rule for WaitOperation. Like the
// generated handlers they call the gRPC service through the loopback
// client connection, so authentication, tenants, limits and error mapping
// are the gRPC ones. openapi/internal/fixspec adds them to the spec.
const lroService = "/google.longrunning.Operations/"

// registerOperationsREST adds the operation routes to the REST mux.
func (s *Server) registerOperationsREST(mux *runtime.ServeMux) error {
	c := longrunningpb.NewOperationsClient(s.rest)
	routes := []struct {
		method, pattern, rpc string
		call                 func(context.Context, *http.Request, map[string]string, runtime.Marshaler) (proto.Message, error)
	}{
		{"GET", "/v1/operations", "ListOperations", func(ctx context.Context, r *http.Request, _ map[string]string, _ runtime.Marshaler) (proto.Message, error) {
			req := &longrunningpb.ListOperationsRequest{Name: "operations"}
			if err := runtime.PopulateQueryParameters(req, r.URL.Query(), utilities.NewDoubleArray(nil)); err != nil {
				if _, ok := status.FromError(err); ok {
					return nil, err // the query parser's message names the parameter
				}
				return nil, status.Errorf(codes.InvalidArgument, "query: %v (known parameters: pageSize, pageToken, filter)", err)
			}
			return c.ListOperations(ctx, req)
		}},
		{"GET", "/v1/operations/{id}", "GetOperation", func(ctx context.Context, _ *http.Request, p map[string]string, _ runtime.Marshaler) (proto.Message, error) {
			return c.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: operationPrefix + p["id"]})
		}},
		{"POST", "/v1/operations/{id}:wait", "WaitOperation", func(ctx context.Context, r *http.Request, p map[string]string, in runtime.Marshaler) (proto.Message, error) {
			req := &longrunningpb.WaitOperationRequest{}
			if err := decodeBody(r, in, req); err != nil {
				return nil, err
			}
			req.Name = operationPrefix + p["id"]
			return c.WaitOperation(ctx, req)
		}},
		{"DELETE", "/v1/operations/{id}", "DeleteOperation", func(ctx context.Context, _ *http.Request, p map[string]string, _ runtime.Marshaler) (proto.Message, error) {
			return c.DeleteOperation(ctx, &longrunningpb.DeleteOperationRequest{Name: operationPrefix + p["id"]})
		}},
		{"POST", "/v1/operations/{id}:cancel", "CancelOperation", func(ctx context.Context, r *http.Request, p map[string]string, in runtime.Marshaler) (proto.Message, error) {
			req := &longrunningpb.CancelOperationRequest{}
			if err := decodeBody(r, in, req); err != nil {
				return nil, err
			}
			req.Name = operationPrefix + p["id"]
			return c.CancelOperation(ctx, req)
		}},
	}
	for _, rt := range routes {
		if err := mux.HandlePath(rt.method, rt.pattern, s.lroHandler(mux, rt.pattern, rt.rpc, rt.call)); err != nil {
			return fmt.Errorf("gateway: register %s %s: %w", rt.method, rt.pattern, err)
		}
	}
	return nil
}

func (s *Server) lroHandler(mux *runtime.ServeMux, pattern, rpc string,
	call func(context.Context, *http.Request, map[string]string, runtime.Marshaler) (proto.Message, error)) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p map[string]string) {
		in, out := runtime.MarshalerForRequest(mux, r)
		ctx, err := runtime.AnnotateContext(r.Context(), mux, r, lroService+rpc, runtime.WithHTTPPathPattern(pattern))
		if err != nil {
			runtime.HTTPError(r.Context(), mux, out, w, r, err)
			return
		}
		resp, err := call(ctx, r, p, in)
		if err != nil {
			runtime.HTTPError(ctx, mux, out, w, r, err)
			return
		}
		runtime.ForwardResponseMessage(ctx, mux, out, w, r, resp)
	}
}

// decodeBody reads an optional JSON body into m (an empty body is {}).
func decodeBody(r *http.Request, in runtime.Marshaler, m proto.Message) error {
	err := in.NewDecoder(r.Body).Decode(m)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "request body: %v (send {} or {\"timeout\": \"30s\"} for :wait)", err)
}
