package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// operationsService serves google.longrunning.Operations over documents
// (docs/operations.md): operation operations/{id} is document {id};
// metadata is the Document, response a ResultRef once it SUCCEEDED or
// PARTIALLY_SUCCEEDED, error a google.rpc.Status once it FAILED
// (INTERNAL, with the document's error) or was CANCELLED (CANCELLED).
// Every call runs as the caller's tenant, as DocumentService does.
type operationsService struct {
	longrunningpb.UnimplementedOperationsServer
	s *Server
}

const (
	operationPrefix = "operations/"
	// maxOperationWait caps WaitOperation (also without a timeout): the
	// caller gets the operation not done and waits again.
	maxOperationWait = time.Minute
)

// operationID returns the document id of an operation name.
func operationID(name string) (string, error) {
	id, ok := strings.CutPrefix(name, operationPrefix)
	if ok && strings.Contains(id, ":") {
		return "", status.Errorf(codes.InvalidArgument,
			"operation name %q has a ':': document ids have none; REST: wait and cancel are POST /v1/operations/{id}:wait and :cancel", name)
	}
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", status.Errorf(codes.InvalidArgument,
			"operation name %q is not operations/{id}: use the name an operation was returned with (the id is the document id)", name)
	}
	return id, nil
}

func (o *operationsService) GetOperation(ctx context.Context, req *longrunningpb.GetOperationRequest) (*longrunningpb.Operation, error) {
	id, err := operationID(req.GetName())
	if err != nil {
		return nil, err
	}
	t := TenantFromContext(ctx)
	doc, err := o.s.cfg.Bridge.GetDocument(ctx, t, id, false)
	if err != nil {
		return nil, toStatus(err)
	}
	return o.operation(ctx, t, doc)
}

func (o *operationsService) ListOperations(ctx context.Context, req *longrunningpb.ListOperationsRequest) (*longrunningpb.ListOperationsResponse, error) {
	if n := req.GetName(); n != "" && n != "operations" {
		return nil, status.Errorf(codes.InvalidArgument, "name %q: the only operation collection is \"operations\" (or leave name empty)", n)
	}
	if req.GetFilter() != "" {
		return nil, status.Errorf(codes.InvalidArgument, "filter %q: filters are not supported; leave filter empty (ListDocuments filters by state)", req.GetFilter())
	}
	t := TenantFromContext(ctx)
	page, err := o.s.cfg.Bridge.ListDocuments(ctx, t, &gatewayv1.ListDocumentsRequest{PageSize: req.GetPageSize(), PageToken: req.GetPageToken()})
	if err != nil {
		return nil, toStatus(err)
	}
	out := &longrunningpb.ListOperationsResponse{NextPageToken: page.GetNextPageToken()}
	for _, d := range page.GetDocuments() {
		op, err := o.operation(ctx, t, d)
		if err != nil {
			return nil, err
		}
		out.Operations = append(out.Operations, op)
	}
	return out, nil
}

// WaitOperation returns once the document is terminal or the timeout
// (at most maxOperationWait) passed, whichever is first.
func (o *operationsService) WaitOperation(ctx context.Context, req *longrunningpb.WaitOperationRequest) (*longrunningpb.Operation, error) {
	id, err := operationID(req.GetName())
	if err != nil {
		return nil, err
	}
	wait := maxOperationWait
	if to := req.GetTimeout(); to != nil {
		if err := to.CheckValid(); err != nil || to.AsDuration() < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "timeout %v is not a non-negative duration", to)
		}
		wait = min(wait, to.AsDuration())
	}
	t := TenantFromContext(ctx)
	// A wait holds a document subscription like WatchDocument: it counts
	// against the tenant's event streams (--max-subscribers-per-tenant).
	release, err := o.s.limits.acquire(watchMethod, t)
	if err != nil {
		return nil, err
	}
	defer release()
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err = o.s.cfg.Bridge.Watch(wctx, t, id, 0, func(*gatewayv1.WatchDocumentResponse) error { return nil })
	if err != nil && !(errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil) {
		return nil, toStatus(err)
	}
	doc, err := o.s.cfg.Bridge.GetDocument(ctx, t, id, false)
	if err != nil {
		return nil, toStatus(err)
	}
	return o.operation(ctx, t, doc)
}

// CancelOperation cancels the document (DocumentService.CancelDocument).
func (o *operationsService) CancelOperation(ctx context.Context, req *longrunningpb.CancelOperationRequest) (*emptypb.Empty, error) {
	id, err := operationID(req.GetName())
	if err != nil {
		return nil, err
	}
	if _, err := o.s.cfg.Bridge.Cancel(ctx, TenantFromContext(ctx), id); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// DeleteOperation is not offered: an operation is its document, which the
// gateway keeps (docs/operations.md).
func (o *operationsService) DeleteOperation(ctx context.Context, req *longrunningpb.DeleteOperationRequest) (*emptypb.Empty, error) {
	return nil, status.Errorf(codes.Unimplemented,
		"DeleteOperation is not supported: operation %s is the document of the same id, which the gateway keeps; use CancelOperation to stop it", req.GetName())
}

// operation maps a document to its operation.
func (o *operationsService) operation(ctx context.Context, t bridge.Tenant, doc *gatewayv1.Document) (*longrunningpb.Operation, error) {
	meta, err := anypb.New(doc)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode operation metadata: %v", err)
	}
	op := &longrunningpb.Operation{Name: operationPrefix + doc.GetId(), Metadata: meta}
	switch doc.GetState() {
	case gatewayv1.State_SUCCEEDED, gatewayv1.State_PARTIALLY_SUCCEEDED:
		ref, err := o.resultRef(ctx, t, doc)
		if err != nil {
			return nil, err
		}
		resp, err := anypb.New(ref)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encode operation response: %v", err)
		}
		op.Done, op.Result = true, &longrunningpb.Operation_Response{Response: resp}
	case gatewayv1.State_FAILED:
		msg := doc.GetError()
		if msg == "" {
			msg = "document " + doc.GetId() + " FAILED"
		}
		op.Done, op.Result = true, &longrunningpb.Operation_Error{Error: &rpcstatus.Status{Code: int32(code.Code_INTERNAL), Message: msg}}
	case gatewayv1.State_CANCELLED:
		op.Done, op.Result = true, &longrunningpb.Operation_Error{Error: &rpcstatus.Status{Code: int32(code.Code_CANCELLED),
			Message: "document " + doc.GetId() + " was cancelled"}}
	}
	return op, nil
}

// resultRef describes where the result of a finished document is. A
// document that SUCCEEDED without a result (a plain peer, result_absent)
// has no result path.
func (o *operationsService) resultRef(ctx context.Context, t bridge.Tenant, doc *gatewayv1.Document) (*gatewayv1.ResultRef, error) {
	ref := &gatewayv1.ResultRef{DocumentId: doc.GetId(), Document: "documents/" + doc.GetId(),
		SizeBytes: doc.GetResultSizeBytes(), State: doc.GetState()}
	if doc.GetResultAbsent() {
		return ref, nil
	}
	ct, size, rc, err := o.s.cfg.Bridge.Result(ctx, t, doc.GetId())
	if err != nil {
		return nil, toStatus(fmt.Errorf("result of document %s: %w", doc.GetId(), err))
	}
	_ = rc.Close()
	ref.ResultPath = "/v1/documents/" + doc.GetId() + "/result"
	ref.ContentType = ct
	if size >= 0 {
		ref.SizeBytes = uint64(size)
	}
	return ref, nil
}
