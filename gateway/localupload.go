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

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The REST raw-body upload (POST /v1/documents:upload) runs the
// UploadDocument handler in this process (issue 25), through the same
// stream interceptor chain as the gRPC listener (error shape, recovery,
// request id, logging, metrics, authentication, the stuck watchdog), as
// the REST routes' event subscriptions do (localstream.go). The
// handler's RecvMsg reads the HTTP request body itself, uploadChunkBytes
// at a time: no loopback gRPC stream, no protobuf encoding and decoding of
// every chunk, no HTTP/2 flow control between the body and the bridge.
//
// What the body's reader finds wrong (too large, stalled, too slow, cut
// by shutdown, a broken connection) is kept as bodyErr and answered by
// the route with its own HTTP status (handleUpload), as before; the
// handler sees an error from RecvMsg and abandons the upload. A stalled
// body is cut by the route's read deadline (rateReader), so the handler
// runs no idle timer of its own for a local upload (documents.go).

// localUploadStream is the grpc.ServerStream of an in-process upload:
// the first RecvMsg returns the options, each later one the next chunk
// of body, then io.EOF; SendMsg keeps the handler's answer.
type localUploadStream struct {
	ctx  context.Context
	opts *gatewayv1.SubmitOptions
	body io.Reader
	// bodyDone is called once when the body was read to its end (the
	// route clears its read deadline then).
	bodyDone func()

	// mu serializes RecvMsg (the handler's receiving goroutine) with
	// finish (the route, after the handler returned): the route reads
	// the body's state only once no read is in flight.
	mu       sync.Mutex
	ending   atomic.Bool // set by finish before it unblocks a read
	sentOpts bool
	eof      bool
	finished bool
	bodyErr  error // what reading the body failed with (not io.EOF)

	// Written by the handler's goroutine; read after it returned.
	header, trailer metadata.MD
	doc             *gatewayv1.Document
}

var _ grpc.ServerStream = (*localUploadStream)(nil)

func (l *localUploadStream) Context() context.Context { return l.ctx }

// SetHeader and SendHeader collect the response headers; the route
// writes them with the answer (an upload has one message back).
func (l *localUploadStream) SetHeader(md metadata.MD) error {
	l.header = metadata.Join(l.header, md)
	return nil
}

func (l *localUploadStream) SendHeader(md metadata.MD) error { return l.SetHeader(md) }

func (l *localUploadStream) SetTrailer(md metadata.MD) { l.trailer = metadata.Join(l.trailer, md) }

// SendMsg keeps the handler's one answer.
func (l *localUploadStream) SendMsg(m any) error {
	doc, ok := m.(*gatewayv1.Document)
	if !ok {
		return status.Errorf(codes.Internal, "in-process upload: answer %T is not a document", m)
	}
	if l.doc != nil {
		return status.Error(codes.Internal, "in-process upload: a second answer")
	}
	l.doc = doc
	return nil
}

// errUploadEnded is what RecvMsg returns once the route finished the
// call (the handler returned); the handler never sees it.
var errUploadEnded = status.Error(codes.Canceled, "upload ended")

// uploadChunks holds the chunk buffers of local uploads (*[]byte of
// uploadChunkBytes): a 256 MiB upload would otherwise allocate a thousand
// 256 KiB buffers, each zeroed, and leave the collector behind the
// reader.
var uploadChunks = sync.Pool{New: func() any {
	b := make([]byte, uploadChunkBytes)
	return &b
}}

// chunkReleaseKey marks the context of a local upload: its handler
// returns each chunk with releaseChunk once it wrote it on.
type chunkReleaseKey struct{}

// releaseChunk gives c back for the next RecvMsg of a local upload once
// the handler is done with it (documents.go: after the pump's Write
// returned, which io.Pipe does only once the bridge copied all of it). A
// chunk of any other stream is left alone.
func releaseChunk(ctx context.Context, c []byte) {
	if ctx.Value(chunkReleaseKey{}) == nil || cap(c) != uploadChunkBytes {
		return
	}
	c = c[:uploadChunkBytes]
	uploadChunks.Put(&c)
}

// RecvMsg fills m with the options first, then with each chunk of body.
// A chunk is a buffer of uploadChunkBytes from uploadChunks, held by the
// handler until it releases it (releaseChunk); its size is fixed here,
// never by the client.
func (l *localUploadStream) RecvMsg(m any) error {
	if p, ok := m.(*pendingRequest); ok {
		m = p.into // errorShapeStream's wrapper: nothing here fails to decode
	}
	req, ok := m.(*gatewayv1.UploadDocumentRequest)
	if !ok {
		return status.Errorf(codes.Internal, "in-process upload: request %T is not an upload message", m)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.finished:
		return errUploadEnded
	case !l.sentOpts:
		l.sentOpts = true
		req.Reset()
		req.Options = l.opts
		return nil
	case l.bodyErr != nil:
		return l.bodyErr
	case l.eof:
		return io.EOF
	}
	return l.readChunkLocked(req)
}

// readChunkLocked reads the next chunk into req; a failed read is kept
// as bodyErr and the chunk it cut short is dropped (the upload fails).
func (l *localUploadStream) readChunkLocked(req *gatewayv1.UploadDocumentRequest) error {
	buf := *uploadChunks.Get().(*[]byte)
	n, err := io.ReadFull(l.body, buf)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		l.eof = true
		l.bodyDone()
		if n == 0 {
			uploadChunks.Put(&buf)
			return io.EOF
		}
	case l.ending.Load():
		uploadChunks.Put(&buf)
		return errUploadEnded // finish cut this read: not the body's fault
	default:
		uploadChunks.Put(&buf)
		l.bodyErr = err
		return status.Errorf(codes.Canceled, "reading the request body failed: %v", err)
	}
	req.Reset()
	req.Chunk = buf[:n]
	return nil
}

// finish ends the body's use by the handler (its receiving goroutine
// may still be in RecvMsg; unblock, a function that makes a pending read
// return, is called first) and returns what reading it failed with.
func (l *localUploadStream) finish(unblock func()) error {
	l.ending.Store(true)
	if !l.mu.TryLock() {
		unblock() // a read is in flight: the handler has ended, end it too
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	l.finished = true
	return l.bodyErr
}

// uploadLocal runs UploadDocument for the route: ctx carries the
// outgoing metadata grpc-gateway annotated the request with, which the
// handler reads as incoming metadata. It returns the handler's answer or
// its status as a gRPC client would see it, and the body's own error
// (nil unless reading the body failed). unblock must make a read of body
// in progress return (the route sets the read deadline to now).
func (s *Server) uploadLocal(ctx context.Context, ls *localUploadStream, unblock func()) (doc *gatewayv1.Document, err, bodyErr error) {
	ls.ctx = context.WithValue(incomingFromOutgoing(ctx), localStreamKey{}, true)
	ls.ctx = context.WithValue(ls.ctx, chunkReleaseKey{}, true)
	info := &grpc.StreamServerInfo{FullMethod: uploadMethod, IsClientStream: true}
	srv := &documentService{s: s}
	err = runStreamChain(s.localChain, 0, srv, ls, info, func(srv any, ss grpc.ServerStream) error {
		return srv.(*documentService).UploadDocument(&grpc.GenericServerStream[gatewayv1.UploadDocumentRequest, gatewayv1.Document]{ServerStream: ss})
	})
	bodyErr = ls.finish(unblock)
	if err != nil {
		return nil, callStatus(ctx, err), bodyErr
	}
	if ls.doc == nil {
		return nil, status.Error(codes.Internal, "in-process upload: the handler returned no document"), bodyErr
	}
	return ls.doc, nil, bodyErr
}
