package gateway

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
)

// A gRPC request message that does not decode as the method's request
// type, or that is over --max-recv-msg-bytes, is the caller's mistake and
// is answered in the one error shape with a reason of its own.
//
// grpc-go cannot be asked to do so: when its codec or its size check fails
// while a handler receives, its serverStream.RecvMsg writes the call's
// status itself (Internal "grpc: failed to unmarshal the received
// message", ResourceExhausted "grpc: received message larger than max"),
// with no details and, for a unary call, before any interceptor has run;
// what the handler returns afterwards is dropped. So the listener's codec
// (recvCodec) never fails a message received through wireRecv: it records
// the decoding error or the size in the pendingRequest and returns nil, and
// wireRecv answers with a status of the house shape. Unary handlers receive
// through wireErrorsDesc (and the interceptors then run as for any call:
// request id, log, metric), streams through wireErrorStream (in
// errorShapeStream). grpc-go's own size check stays as a hard stop at
// --max-recv-msg-bytes + recvSlack, so a message far over the limit is
// still refused before it is read whole, by grpc-go, with its message (and
// the request id in the trailers).
const (
	// ReasonMalformedMessage: a gRPC request message that does not decode
	// as the method's request type (code InvalidArgument).
	ReasonMalformedMessage = "MALFORMED_MESSAGE"
	// ReasonMessageTooLarge: a gRPC request message over the server's
	// --max-recv-msg-bytes (code ResourceExhausted).
	ReasonMessageTooLarge = "MESSAGE_TOO_LARGE"
)

// recvSlack is how far past --max-recv-msg-bytes grpc-go's own size check
// sits: a message up to that much over the limit is read and answered
// MESSAGE_TOO_LARGE; beyond it grpc-go refuses it unread.
const recvSlack = 1 << 20

// pendingRequest is what wireRecv asks grpc-go to receive: recvCodec
// decodes the message into into, or records why it could not.
type pendingRequest struct {
	into any
	err  error // the decoding error, or nil
	size int   // the message's size when it is over the limit, else 0
}

// recvCodec is the gRPC listener's codec (grpc.ForceServerCodecV2): the
// proto codec, except that a pendingRequest never fails in grpc-go.
type recvCodec struct {
	proto encoding.CodecV2
	limit int
}

func newRecvCodec(limit int) recvCodec {
	return recvCodec{proto: encoding.GetCodecV2("proto"), limit: limit}
}

func (c recvCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c recvCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*pendingRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	if n := data.Len(); n > c.limit {
		p.size = n
		return nil
	}
	p.err = c.proto.Unmarshal(data, p.into)
	return nil
}

func (recvCodec) Name() string { return "proto" }

// wireRecv receives one request message of method into m through recv
// (a server stream's RecvMsg), answering a message recvCodec could not
// decode, or one over limit, in the house shape.
func wireRecv(recv func(any) error, m any, method string, limit int) error {
	p := pendingRequest{into: m}
	if err := recv(&p); err != nil {
		return err
	}
	if p.size > 0 {
		return messageTooLarge(method, p.size, limit)
	}
	if p.err != nil {
		return statusError(codes.InvalidArgument, ReasonMalformedMessage, fmt.Sprintf(
			"the request message of %s does not decode as the method's request type (%v): send the message its .proto declares, in the protobuf binary encoding (grpcurl ... describe shows it)", method, p.err))
	}
	return nil
}

// messageTooLarge is the error of a request message of n bytes over limit.
func messageTooLarge(method string, n, limit int) error {
	return statusError(codes.ResourceExhausted, ReasonMessageTooLarge, fmt.Sprintf(
		"a request message of %s is %d bytes, over this server's limit of %d (--max-recv-msg-bytes): stream big content with DocumentService/UploadDocument, which sends it in chunks, or ask the operator to raise the limit", method, n, limit))
}

// wireErrorsDesc returns a copy of desc whose unary handlers receive
// through wireRecv. The generated handler decodes the request before it
// calls the interceptors, so a request that does not decode is answered
// by running them over a handler that returns the error: the answer then
// has the request id in its trailers and is logged and counted like any
// other call.
func (s *Server) wireErrorsDesc(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	for i := range d.Methods {
		d.Methods[i].Handler = s.wireErrorsUnary("/"+desc.ServiceName+"/"+d.Methods[i].MethodName, d.Methods[i].Handler)
	}
	return &d
}

func (s *Server) wireErrorsUnary(method string, h grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, chain grpc.UnaryServerInterceptor) (any, error) {
		// The request id goes into the trailers before the request is
		// read: a message past grpc-go's hard stop is answered by grpc-go
		// while it is read, with the trailers set so far.
		ctx = wireRequestID(ctx)
		var decErr error
		resp, err := h(srv, ctx, func(m any) error {
			decErr = wireRecv(dec, m, method, s.cfg.MaxRecvMsgBytes)
			return decErr
		}, chain)
		if decErr == nil || chain == nil {
			return resp, err
		}
		fail := func(context.Context, any) (any, error) { return nil, decErr }
		return chain(ctx, nil, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, fail)
	}
}

// wireRequestIDKey marks a unary call whose request id wireRequestID has
// chosen and sent in the trailers already (requestIDUnary then uses it).
type wireRequestIDKey struct{}

func wireRequestID(ctx context.Context) context.Context {
	rid := incomingRequestID(ctx)
	if rid == "" {
		rid = newRequestID()
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(requestIDHeader, rid))
	return context.WithValue(ctx, wireRequestIDKey{}, rid)
}

// wireErrorStream is a server stream whose RecvMsg receives through
// wireRecv.
type wireErrorStream struct {
	grpc.ServerStream
	method string
	limit  int
}

func (s wireErrorStream) RecvMsg(m any) error {
	return wireRecv(s.ServerStream.RecvMsg, m, s.method, s.limit)
}
