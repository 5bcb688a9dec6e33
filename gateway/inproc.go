package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// inprocConn is the REST proxy's client for unary calls: it runs the
// method's handler in the HTTP request's goroutine, through the same
// interceptor chain the gRPC listener runs (recovery, UTF-8, request id,
// logging, metrics, authentication and limits), with no connection in
// between. A REST call therefore never waits for an HTTP/2 stream slot
// or a flow-control window that other tenants' calls hold: 17 tenants
// holding 64 POST :wait each cost 1,088 goroutines, not 1,088 of one
// connection's 1,024 streams (issue 22). grpc-gateway's own in-process
// handlers (RegisterXxxHandlerServer) skip the interceptors and do not
// stream; this keeps the generated client handlers and swaps their
// connection. Event subscriptions (localstream.go) and the raw-body upload
// (localupload.go) run in-process through the stream chain; the other
// streams (watch) go over the loopback connections of connPool.
type inprocConn struct {
	methods map[string]inprocMethod // full method name -> handler
	chain   grpc.UnaryServerInterceptor
	// maxRecv and maxSend are the gRPC listener's message limits, applied
	// here as the transport would.
	maxRecv, maxSend int
	streams          grpc.ClientConnInterface // NewStream goes here
}

type inprocMethod struct {
	srv     any
	handler grpc.MethodHandler
}

var _ grpc.ClientConnInterface = (*inprocConn)(nil)

// newInprocConn builds the client; streams is set once the loopback
// connections exist (Server.Start).
func newInprocConn(chain grpc.UnaryServerInterceptor, maxRecv, maxSend int) *inprocConn {
	return &inprocConn{methods: map[string]inprocMethod{}, chain: chain, maxRecv: maxRecv, maxSend: maxSend}
}

// register adds the unary methods of a service registered on the gRPC
// server (the same desc and implementation).
func (c *inprocConn) register(desc *grpc.ServiceDesc, srv any) {
	for _, m := range desc.Methods {
		c.methods["/"+desc.ServiceName+"/"+m.MethodName] = inprocMethod{srv: srv, handler: m.Handler}
	}
}

// Invoke calls method's handler with args as its request and copies the
// response into reply; grpc.Header and grpc.Trailer call options receive
// the metadata the handler set, as over a connection.
func (c *inprocConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	m, ok := c.methods[method]
	if !ok {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	in, ok := args.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "in-process call %s: request %T is not a proto message", method, args)
	}
	inSize := proto.Size(in)
	if inSize > c.maxRecv {
		return messageTooLarge(method, inSize, c.maxRecv)
	}
	st := &inprocStream{method: method}
	sctx := grpc.NewContextWithServerTransportStream(incomingFromOutgoing(ctx), st)
	dec := func(v any) error {
		dst, ok := v.(proto.Message)
		if !ok {
			return fmt.Errorf("request %T is not a proto message", v)
		}
		handOver(dst, in, inSize)
		return nil
	}
	resp, err := m.handler(m.srv, sctx, dec, c.chain)
	st.deliver(opts)
	if err != nil {
		return callStatus(ctx, err)
	}
	out, ok := resp.(proto.Message)
	dst, ok2 := reply.(proto.Message)
	if !ok || !ok2 {
		return status.Errorf(codes.Internal, "in-process call %s: response %T is not a proto message", method, resp)
	}
	outSize := proto.Size(out)
	if outSize > c.maxSend {
		return status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d); raise --max-send-msg-bytes", outSize, c.maxSend)
	}
	handOver(dst, out, outSize)
	return nil
}

// handOverBytes is the size from which handOver shares a message's
// values instead of copying them: moveInto's reflection costs ~1 µs for a
// 4 KiB submission (a merge 2.4 µs and 4 KiB), but ~2.8 µs for a
// Document answer of a few hundred octets (a merge 0.7 µs;
// BenchmarkHandOver).
const handOverBytes = 1024

// handOver gives dst, an empty message, the fields of src (size octets
// encoded), as a call over a connection would hand over a message it
// decoded: a large one shared (moveInto), a small one merged.
func handOver(dst, src proto.Message, size int) {
	if size >= handOverBytes {
		moveInto(dst, src)
		return
	}
	proto.Merge(dst, src)
}

// moveInto gives dst, an empty message, src's fields, sharing their
// values (bytes, sub-messages, lists) instead of copying them. Each side
// gives its message away: the REST proxy's request is not used once it
// was handed to the handler, nor the handler's answer once returned. (A
// proto.Merge copied the 4 KiB content of every small REST submission.)
// Messages of different types are merged (which panics, as proto.Merge
// does: a generated client never asks for that).
func moveInto(dst, src proto.Message) {
	d, s := dst.ProtoReflect(), src.ProtoReflect()
	if d.Descriptor() != s.Descriptor() {
		proto.Merge(dst, src)
		return
	}
	s.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		d.Set(fd, v)
		return true
	})
	if u := s.GetUnknown(); len(u) > 0 {
		d.SetUnknown(u)
	}
}

// NewStream opens streams over the loopback connections.
func (c *inprocConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.streams.NewStream(ctx, desc, method, opts...)
}

// callStatus is err as a client of a gRPC server sees it: a status error
// as is, a context error as its code, anything else Unknown.
func callStatus(ctx context.Context, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return status.Convert(err).Err()
}

// incomingFromOutgoing turns the metadata grpc-gateway annotated the
// request with (outgoing) into what a server handler reads (incoming),
// with keys in lower case as HTTP/2 would carry them.
func incomingFromOutgoing(ctx context.Context) context.Context {
	out, _ := metadata.FromOutgoingContext(ctx)
	in := make(metadata.MD, len(out))
	for k, v := range out {
		k = strings.ToLower(k)
		in[k] = append(in[k], v...)
	}
	return metadata.NewIncomingContext(ctx, in)
}

// inprocStream is the grpc.ServerTransportStream of an in-process call:
// it collects the headers and trailers the handler sets.
type inprocStream struct {
	method string
	mu     sync.Mutex
	header metadata.MD
	trail  metadata.MD
}

func (s *inprocStream) Method() string { return s.method }

func (s *inprocStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	s.header = metadata.Join(s.header, md)
	s.mu.Unlock()
	return nil
}

func (s *inprocStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *inprocStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	s.trail = metadata.Join(s.trail, md)
	s.mu.Unlock()
	return nil
}

// deliver hands the collected metadata to the call's grpc.Header and
// grpc.Trailer options.
func (s *inprocStream) deliver(opts []grpc.CallOption) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			*o.HeaderAddr = s.header // the call is over: handed over, not copied
		case grpc.TrailerCallOption:
			*o.TrailerAddr = s.trail
		}
	}
}

// chainUnary makes one interceptor of several, the first outermost, as
// grpc.ChainUnaryInterceptor does on the server.
func chainUnary(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return runChain(ctx, ics, 0, req, info, h)
	}
}

func runChain(ctx context.Context, ics []grpc.UnaryServerInterceptor, i int, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if i == len(ics) {
		return h(ctx, req)
	}
	next := h // the innermost interceptor calls the handler itself
	if i < len(ics)-1 {
		next = func(ctx context.Context, req any) (any, error) {
			return runChain(ctx, ics, i+1, req, info, h)
		}
	}
	return ics[i](ctx, req, info, next)
}
