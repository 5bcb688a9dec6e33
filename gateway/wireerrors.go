package gateway

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
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
// wireRecv answers with a status of the house shape. Unary methods
// receive through recvUnary (wireErrorsDesc serves them as streams, and
// the interceptors then run as for any call: request id, log, metric),
// streams through wireErrorStream (in errorShapeStream). grpc-go's own
// size check stays as a hard stop at --max-recv-msg-bytes + recvSlack, so
// a message far over the limit is still refused before it is read whole,
// by grpc-go, with its message (and the request id in the trailers).
// docs/errors.md lists what grpc-go still answers itself and why.
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
	if p.into != nil { // nil: a message that only has to be counted
		p.err = c.proto.Unmarshal(data, p.into)
	}
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
	return received(&p, method, limit)
}

// received answers a request message recvCodec could not decode, or one
// over limit, in the house shape; nil when p was decoded.
func received(p *pendingRequest, method string, limit int) error {
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

// ReasonCardinalityViolation: a unary gRPC call that carried no request
// message, or more than one (code InvalidArgument).
const ReasonCardinalityViolation = "CARDINALITY_VIOLATION"

// wireErrorsDesc returns a copy of desc whose unary methods are registered
// as client streams whose handler (unaryOverStream) receives the request
// itself. On the wire the two are the same (HTTP/2 framing does not tell a
// unary call from a client stream; reflection and grpcurl read the .proto
// descriptors, which still say unary); but grpc-go's unary path writes
// the status of a call without a request message, or with two, itself
// ("cardinality violation", no details) before any handler runs, while a
// client stream's RecvMsg returns io.EOF plainly. The listener's stream
// interceptor (listenerStream) skips the stream chain for these methods:
// unaryOverStream runs the unary chain, once per call, as grpc-go would.
func (s *Server) wireErrorsDesc(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = nil
	d.Streams = slices.Clone(desc.Streams)
	for _, m := range desc.Methods {
		name := "/" + desc.ServiceName + "/" + m.MethodName
		s.unaryMethods[name] = struct{}{}
		d.Streams = append(d.Streams, grpc.StreamDesc{
			StreamName:    m.MethodName,
			Handler:       s.unaryOverStream(name, m.Handler),
			ClientStreams: true,
		})
	}
	return &d
}

// listenerStream is the gRPC listener's stream interceptor: the stream
// chain (streamInterceptors) for streams, none for the unary methods
// wireErrorsDesc registered as streams (their handler runs the unary
// chain).
func (s *Server) listenerStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if _, unary := s.unaryMethods[info.FullMethod]; unary {
		return h(srv, ss)
	}
	return runStreamChain(s.streamChain, 0, srv, ss, info, h)
}

// unaryOverStream is the stream handler of unary method h: it receives
// the one request message through recvUnary, runs the generated handler
// with the unary interceptor chain and sends the response. A request that
// cannot be received is answered by running the chain over a handler
// that returns the error (the generated handler decodes the request
// before it calls the interceptors): the answer then has the request id
// in its trailers and is logged and counted like any other call.
func (s *Server) unaryOverStream(method string, h grpc.MethodHandler) grpc.StreamHandler {
	return func(srv any, ss grpc.ServerStream) error {
		// The request id goes into the trailers before the request is
		// read: a message past grpc-go's hard stop is answered by grpc-go
		// while it is read, with the trailers set so far.
		ctx := wireRequestID(ss.Context())
		var decErr error
		resp, err := h(srv, ctx, func(m any) error {
			decErr = recvUnary(ss, m, method, s.cfg.MaxRecvMsgBytes)
			return decErr
		}, s.unaryChain)
		if decErr != nil {
			fail := func(context.Context, any) (any, error) { return nil, decErr }
			_, err = s.unaryChain(ctx, nil, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, fail)
			return err
		}
		if err != nil {
			return err
		}
		return ss.SendMsg(resp)
	}
}

// recvUnary receives the one request message of a unary call into m
// (through recvCodec, as wireRecv) and makes sure the client then
// half-closes: no message, or a second one, is the caller's mistake,
// answered CARDINALITY_VIOLATION as grpc-go's unary path would refuse it.
// The second message is received but not decoded.
func recvUnary(ss grpc.ServerStream, m any, method string, limit int) error {
	p := pendingRequest{into: m}
	if err := ss.RecvMsg(&p); err == io.EOF {
		return statusError(codes.InvalidArgument, ReasonCardinalityViolation, fmt.Sprintf(
			"%s is a unary method: the call must carry exactly one request message, and this one ended without any: send the request (an empty one is a message too)", method))
	} else if err != nil {
		return err
	}
	if err := received(&p, method, limit); err != nil {
		return err
	}
	p = pendingRequest{} // no into: recvCodec records only that it came
	if err := ss.RecvMsg(&p); err == io.EOF {
		return nil
	} else if err != nil {
		return err
	}
	return statusError(codes.InvalidArgument, ReasonCardinalityViolation, fmt.Sprintf(
		"%s is a unary method: the call must carry exactly one request message, and this one sent a second: use one call per request", method))
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

// ReasonMalformedMethodName: a gRPC request whose :path is not
// /service/method (code Unimplemented).
const ReasonMalformedMethodName = "MALFORMED_METHOD_NAME"

// tapRequest is the listener's grpc.InTapHandle. It refuses, in the
// house shape, two requests grpc-go would refuse right after it with a
// status of no details: a :path grpc-go's handleStream refuses as a
// malformed method name, and a call whose deadline (grpc-timeout) had
// passed when it arrived (http2Server.operateHeaders, "context deadline
// exceeded"). grpc-go runs it on the connection's reader goroutine, under
// the transport's lock, for every new stream: on a good request it only
// looks at the string and the context. Its error is sent as a
// trailers-only answer that cannot carry other trailers, so the request
// id goes into the status's details (a google.rpc.RequestInfo) instead of
// an x-request-id trailer.
func (s *Server) tapRequest(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !wellFormedMethodName(info.FullMethodName) {
		return ctx, s.refuseInTap(info, codes.Unimplemented, ReasonMalformedMethodName, "malformed method name %q: a gRPC call's :path is /package.Service/Method, such as /pipestream.gateway.v1.DocumentService/GetDocument (list them with grpcurl ... list)")
	}
	if ctx.Err() != nil {
		return ctx, s.refuseInTap(info, codes.DeadlineExceeded, "", "the deadline of the call of %q had passed when the server received it (its grpc-timeout was too short): allow it more time")
	}
	return ctx, nil
}

// wellFormedMethodName is grpc-go's test (server.go handleStream): a
// leading slash and another one after it.
func wellFormedMethodName(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	return ok && strings.IndexByte(rest, '/') >= 0
}

// refuseInTap is the error tapRequest returns: code, reason (the code's
// generic one if "") and format's message with the method name quoted,
// the request id (the client's, or a new one) in a RequestInfo; the
// refusal is counted and logged with it.
func (s *Server) refuseInTap(info *tap.Info, code codes.Code, reason, format string) error {
	rid := ""
	for _, v := range info.Header.Get(requestIDHeader) {
		if validRequestID(v) {
			rid = v
			break
		}
	}
	if rid == "" {
		rid = newRequestID()
	}
	m := info.FullMethodName
	if len(m) > 200 {
		m = m[:200] + "..."
	}
	if reason == "" {
		reason = codeReasons[code]
	}
	s.metrics.rejected.WithLabelValues(strings.ToLower(reason)).Inc()
	s.log.Info("grpc refused", "reason", reason, "method", m, "request_id", rid)
	return statusError(code, reason, fmt.Sprintf(format, m), &errdetails.RequestInfo{RequestId: rid})
}
