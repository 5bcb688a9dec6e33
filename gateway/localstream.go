package gateway

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Event subscriptions of the REST routes (NDJSON, SSE, pages, WebSocket)
// run in this process, straight from the event log (issue 25): the
// SubscribeEvents handler runs through the same stream interceptor chain
// as on the gRPC listener (error shape, recovery, UTF-8, request id,
// logging, metrics, authentication and the per-tenant stream limits), so
// tenants, filters, cursor rules, OutdatedCursor, ConsumerTooSlow and
// every error are those of a gRPC subscriber; but its Send hands the
// event log's shared *Event to the route's writer, with no loopback gRPC
// stream, no protobuf encoding and no copy in between. Each route encodes
// an event through the server's eventCache, once for all its subscribers.
//
//   - The WebSocket route pushes: the handler runs in the HTTP handler's
//     goroutine and each Send queues one frame (websocket.go); once the
//     subscription is caught up the event log's fan-out workers make the
//     Sends, through the same chain, while that goroutine is parked
//     (eventlog.WithPush).
//   - NDJSON (grpc-gateway's ForwardResponseStream), SSE and pages pull:
//     localEventClient.SubscribeEvents runs the handler in a goroutine
//     that hands each event over an unbuffered channel to Recv.
//
// Every write still has its deadline (Config.StreamWriteTimeout: the
// WebSocket frame context, writeDeadlines for HTTP responses); a Send
// blocked by a stalled consumer blocks only that subscriber, whose event
// log subscription ends with ConsumerTooSlow if it falls out of the tail.

// localSink receives what the SubscribeEvents handler sends.
type localSink interface {
	// start is called once with the response headers (the subscription
	// started: subscribedHeader), before the first event.
	start(md metadata.MD) error
	// send delivers an event; an error ends the subscription.
	send(ev *gatewayv1.Event) error
}

// localStreamKey marks the context of an in-process stream (fromProxy).
type localStreamKey struct{}

// isLocalStream reports whether ctx belongs to an in-process stream.
func isLocalStream(ctx context.Context) bool {
	v, _ := ctx.Value(localStreamKey{}).(bool)
	return v
}

// subscribeLocal runs SubscribeEvents for req with sink as its stream.
// ctx carries the outgoing metadata grpc-gateway annotated the HTTP
// request with (runtime.AnnotateContext), which the handler reads as
// incoming metadata, as over a connection. It returns the call's status
// as a gRPC client would see it (nil when the handler returned nil); the
// trailers a refused call set are returned too.
func (s *Server) subscribeLocal(ctx context.Context, req *gatewayv1.SubscribeEventsRequest, sink localSink) (metadata.MD, error) {
	ctx = context.WithValue(incomingFromOutgoing(ctx), localStreamKey{}, true)
	ls := &localServerStream{ctx: ctx, req: req, sink: sink}
	info := &grpc.StreamServerInfo{FullMethod: subscribeMethod, IsServerStream: true}
	srv := &eventService{s: s}
	err := runStreamChain(s.localChain, 0, srv, ls, info, func(srv any, ss grpc.ServerStream) error {
		return srv.(*eventService).SubscribeEvents(req, &grpc.GenericServerStream[gatewayv1.SubscribeEventsRequest, gatewayv1.Event]{ServerStream: ss})
	})
	if err != nil {
		err = callStatus(ctx, err)
	}
	return ls.trailer, err
}

// runStreamChain runs ics[i:] around h, the first outermost, as
// grpc.ChainStreamInterceptor does on the server.
func runStreamChain(ics []grpc.StreamServerInterceptor, i int, srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if i == len(ics) {
		return h(srv, ss)
	}
	return ics[i](srv, ss, info, func(srv any, ss grpc.ServerStream) error {
		return runStreamChain(ics, i+1, srv, ss, info, h)
	})
}

// localServerStream is the grpc.ServerStream of an in-process
// subscription: headers go to sink.start, messages to sink.send. Only the
// handler's goroutine uses it.
type localServerStream struct {
	ctx     context.Context
	req     proto.Message
	sink    localSink
	header  metadata.MD
	trailer metadata.MD
	started bool
}

func (l *localServerStream) Context() context.Context { return l.ctx }

func (l *localServerStream) SetHeader(md metadata.MD) error {
	if l.started {
		return errors.New("gateway: SetHeader after the headers were sent")
	}
	l.header = metadata.Join(l.header, md)
	return nil
}

func (l *localServerStream) SendHeader(md metadata.MD) error {
	if l.started {
		return errors.New("gateway: headers sent twice")
	}
	l.header = metadata.Join(l.header, md)
	l.started = true
	return l.sink.start(l.header)
}

func (l *localServerStream) SetTrailer(md metadata.MD) { l.trailer = metadata.Join(l.trailer, md) }

func (l *localServerStream) SendMsg(m any) error {
	ev, ok := m.(*gatewayv1.Event)
	if !ok {
		return status.Errorf(codes.Internal, "in-process subscription: message %T is not an event", m)
	}
	if !l.started {
		if err := l.SendHeader(nil); err != nil { // as gRPC sends headers with the first message
			return err
		}
	}
	return l.sink.send(ev)
}

// RecvMsg is never called: the request is passed to the handler directly.
func (l *localServerStream) RecvMsg(any) error { return io.EOF }

// localEventClient is the EventService client of the REST routes:
// SubscribeEvents runs in this process (localEventStream); the unary
// methods go to the in-process unary client as before.
type localEventClient struct {
	gatewayv1.EventServiceClient
	s *Server
}

// SubscribeEvents starts the handler in a goroutine and returns once it
// is running; Header waits for the subscription to start or be refused.
func (c localEventClient) SubscribeEvents(ctx context.Context, in *gatewayv1.SubscribeEventsRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[gatewayv1.Event], error) {
	ctx, cancel := context.WithCancel(ctx)
	st := &localEventStream{ctx: ctx, cancel: cancel, started: make(chan struct{}), events: make(chan *gatewayv1.Event), done: make(chan struct{})}
	setFlushHint(ctx, st.eventWaiting)
	go st.run(c.s, in)
	return st, nil
}

// localEventStream is the client side of an in-process subscription: the
// handler's goroutine (run) hands events to Recv one at a time.
type localEventStream struct {
	ctx    context.Context
	cancel context.CancelFunc

	startOnce sync.Once
	started   chan struct{} // closed once header is set: started or ended
	header    metadata.MD

	events chan *gatewayv1.Event // unbuffered: the handler waits for Recv
	// offered counts events send offers that Recv has not taken (0 or
	// 1): the handler's send adds one before it offers, Recv takes it
	// off with the event (or send, when the stream ends instead).
	offered atomic.Int32
	done    chan struct{} // closed when the handler returned, after err
	err     error
	ctxErr  error // the caller's context's error when the handler returned
	trail   metadata.MD
}

var _ grpc.ServerStreamingClient[gatewayv1.Event] = (*localEventStream)(nil)

func (st *localEventStream) run(s *Server, in *gatewayv1.SubscribeEventsRequest) {
	defer st.cancel()
	trail, err := s.subscribeLocal(st.ctx, in, st)
	st.trail, st.err, st.ctxErr = trail, err, st.ctx.Err()
	st.startOnce.Do(func() { st.header = trail; close(st.started) }) // refused: a trailers-only answer
	close(st.done)
}

func (st *localEventStream) start(md metadata.MD) error {
	st.startOnce.Do(func() { st.header = md; close(st.started) })
	return nil
}

func (st *localEventStream) send(ev *gatewayv1.Event) error {
	st.offered.Add(1)
	select {
	case st.events <- ev:
		return nil // Recv took offered back
	case <-st.ctx.Done():
		st.offered.Add(-1)
		return st.ctx.Err()
	}
}

// eventWaiting reports whether the handler is offering the next event
// already (the NDJSON writer then skips a flush: streamFraming).
func (st *localEventStream) eventWaiting() bool { return st.offered.Load() > 0 }

// Header waits until the subscription started (the headers, with
// subscribedHeader) or ended before it (the trailers, and a nil error, as
// grpc-go answers a trailers-only response).
func (st *localEventStream) Header() (metadata.MD, error) {
	<-st.started
	return st.header, nil
}

// Recv returns the next event, shared with other subscribers: the caller
// must not modify it. The stream's end is io.EOF or its status error.
func (st *localEventStream) Recv() (*gatewayv1.Event, error) {
	select {
	case ev := <-st.events:
		st.offered.Add(-1)
		return ev, nil
	case <-st.done:
	}
	if st.ctxErr != nil && st.err != nil {
		return nil, status.FromContextError(st.ctxErr).Err() // as grpc-go ends a cancelled call
	}
	if st.err == nil {
		return nil, io.EOF
	}
	return nil, st.err
}

// recvShared is Recv as a proto.Message (recvAll: SSE and pages).
func (st *localEventStream) recvShared() (proto.Message, error) { return st.Recv() }

// RecvMsg copies the next event into m (for callers of the generic
// grpc.ClientStream interface; Recv shares it instead).
func (st *localEventStream) RecvMsg(m any) error {
	ev, err := st.Recv()
	if err != nil {
		return err
	}
	dst, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "in-process subscription: %T is not a proto message", m)
	}
	proto.Reset(dst)
	proto.Merge(dst, ev)
	return nil
}

func (st *localEventStream) Trailer() metadata.MD {
	select {
	case <-st.done:
		return st.trail
	default:
		return nil
	}
}

func (st *localEventStream) CloseSend() error         { return nil }
func (st *localEventStream) Context() context.Context { return st.ctx }
func (st *localEventStream) SendMsg(any) error {
	return status.Error(codes.Internal, "in-process subscription: SendMsg on a server stream")
}

// localEvents is the EventService client of the REST routes.
func (s *Server) localEvents() gatewayv1.EventServiceClient {
	return localEventClient{EventServiceClient: gatewayv1.NewEventServiceClient(s.rest), s: s}
}
