package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Stuck consumers. A client that keeps its connection open but stops
// reading fills the flow-control windows and socket buffers between it and
// the server; after that every write to it blocks. Memory stays bounded by
// those windows, but the goroutines behind the stream (the handler, its
// event-log subscription, the REST proxy's call) would wait until the client
// disconnects. Config.StreamWriteTimeout bounds each blocked write instead:
//
//   - gRPC server streams: sendWatchdog (grpc-go's Send has no deadline);
//   - REST responses: writeDeadlineWriter (per-write connection deadline);
//   - WebSocket frames: a per-frame write context (websocket.go).
//
// Only a write that is pending counts: a stream with nothing to send may be
// idle for as long as the client likes.

// watchServerStreams is the innermost stream interceptor: every
// server-streaming call (SubscribeEvents, WatchDocument, GetDocumentResult)
// runs its sends under a sendWatchdog. When a Send stays blocked for
// Config.StreamWriteTimeout the call ends with ResourceExhausted, ErrorInfo
// reason ConsumerTooSlow (the AT sync draft's name, also used by the event
// log), whatever the handler returns once its Send is released.
//
// Streams of the REST proxy's own connection are left alone: their
// consumer is the HTTP client, whose writes writeDeadlines bounds per
// piece; when one fails the proxy cancels the call. Watching them too
// would cut an HTTP client that reads slowly but steadily whenever one
// message (a 256 KiB result chunk) takes it longer than the timeout.
func (s *Server) watchServerStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !info.IsServerStream || s.fromProxy(ss.Context()) {
		return h(srv, ss)
	}
	w := newSendWatchdog(ss, s.cfg.StreamWriteTimeout)
	err := h(srv, w)
	if w.stop() {
		s.log.Warn("stream consumer too slow: a send blocked past --stream-write-timeout; stream ended",
			"method", info.FullMethod, "request_id", requestIDOf(ss.Context()), "timeout", s.cfg.StreamWriteTimeout, "handler_error", status.Convert(err).Message())
		return w.tooSlowErr()
	}
	return err
}

// fromProxy reports whether the call came from the REST side: over the
// REST proxy's own connection (Server.conn), identified by its TCP
// address, which a remote client cannot present, or in-process
// (isLocalStream).
func (s *Server) fromProxy(ctx context.Context) bool {
	if isLocalStream(ctx) {
		return true // an in-process stream of a REST route (localstream.go)
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	_, ok = s.proxyConns.Load(p.Addr.String())
	return ok
}

// dialProxyConn dials the gRPC listener for Server.conn and records the
// connection's local address in proxyConns until it closes.
func (s *Server) dialProxyConn(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	key := c.LocalAddr().String()
	s.proxyConns.Store(key, struct{}{})
	return &proxyConn{Conn: c, forget: func() { s.proxyConns.Delete(key) }}, nil
}

type proxyConn struct {
	net.Conn
	once   sync.Once
	forget func()
}

func (c *proxyConn) Close() error {
	c.once.Do(c.forget)
	return c.Conn.Close()
}

// transportStatusWriter is the part of grpc-go's server transport stream
// (grpc.ServerTransportStreamFromContext) that ends a stream: it writes the
// status trailers and cancels the stream's context, which releases a Send
// blocked on flow control. grpc-go calls it itself when a SendMsg fails.
type transportStatusWriter interface {
	WriteStatus(*status.Status) error
}

// sendWatchdog is a grpc.ServerStream whose SendMsg may block for at most
// timeout. It records when the pending SendMsg began; one timer per stream
// (not per message) checks it and re-arms itself, so a send costs two
// atomic stores and a clock read. When a send has been pending for timeout
// the watchdog writes the ConsumerTooSlow status on the transport stream,
// which cancels the stream's context: the blocked SendMsg returns, the
// handler's event-log subscription ends with the context, and the handler
// returns. The status trailers queue behind the data the client never read;
// it sees them if it reads again. One goroutine at a time calls SendMsg,
// as grpc-go requires: the handler's, or, for an in-process WebSocket
// subscription that is caught up, an event-log fan-out worker while the
// handler's goroutine is parked (eventlog.Push).
type sendWatchdog struct {
	grpc.ServerStream
	timeout time.Duration
	base    time.Time    // monotonic origin of pending
	pending atomic.Int64 // time.Since(base)+1 when the current SendMsg began; 0: none
	fired   atomic.Bool

	mu    sync.Mutex // timer and done; taken by the timer, start and stop only
	timer *time.Timer
	done  bool
}

func newSendWatchdog(ss grpc.ServerStream, timeout time.Duration) *sendWatchdog {
	w := &sendWatchdog{ServerStream: ss, timeout: timeout, base: time.Now()}
	w.mu.Lock()
	w.timer = time.AfterFunc(timeout, w.check)
	w.mu.Unlock()
	return w
}

// SendMsg sends m; see sendWatchdog.
func (w *sendWatchdog) SendMsg(m any) error {
	w.pending.Store(int64(time.Since(w.base)) + 1)
	err := w.ServerStream.SendMsg(m)
	w.pending.Store(0)
	if err != nil && w.fired.Load() {
		return w.tooSlowErr()
	}
	return err
}

// check runs on the timer: it cuts the stream if the pending send began
// timeout ago or earlier, else re-arms for when it would.
func (w *sendWatchdog) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	next := w.timeout
	if began := w.pending.Load(); began != 0 {
		blocked := time.Since(w.base) - time.Duration(began-1)
		if blocked >= w.timeout {
			w.cut()
			return
		}
		next = w.timeout - blocked
	}
	w.timer.Reset(next)
}

func (w *sendWatchdog) cut() {
	w.fired.Store(true)
	st := status.Convert(w.tooSlowErr())
	if ts, ok := grpc.ServerTransportStreamFromContext(w.Context()).(transportStatusWriter); ok {
		_ = ts.WriteStatus(st)
	}
	// Without a transport stream that can end the call (a grpc-go that no
	// longer exposes it) the handler is released when the client reads or
	// leaves; TestGRPCStuckConsumerIsCut catches that.
}

// stop ends the watchdog when the handler returned and reports whether it
// cut the stream.
func (w *sendWatchdog) stop() bool {
	w.mu.Lock()
	w.done = true
	w.timer.Stop()
	w.mu.Unlock()
	return w.fired.Load()
}

func (w *sendWatchdog) tooSlowErr() error {
	return statusError(codes.ResourceExhausted, ReasonConsumerTooSlow, fmt.Sprintf(
		"ConsumerTooSlow: the client did not read a message for %v (--stream-write-timeout); read faster, then resume with the cursor after the last event you processed",
		w.timeout))
}

// writeDeadlines bounds every write and flush of a REST response by
// timeout (writeDeadlineWriter). For HTTP/1 it first clears a deadline a
// previous response on the same keep-alive connection left behind. The
// WebSocket route is passed through unwrapped: the connection is hijacked
// and frames carry their own deadline.
func writeDeadlines(h http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.ProtoMajor == 1 {
			_ = rc.SetWriteDeadline(time.Time{})
		}
		if r.URL.Path == "/v1/events/ws" {
			h.ServeHTTP(w, r)
			return
		}
		dw := &writeDeadlineWriter{ResponseWriter: w, rc: rc, timeout: timeout, http1: r.ProtoMajor == 1}
		if r.ProtoMajor == 1 {
			// net/http writes the rest of the body (buffered bytes, the
			// chunked terminator) after the handler returns: bound that too.
			defer dw.arm()
		}
		h.ServeHTTP(dw, r)
	})
}

// writeDeadlineWriter sets the connection's (HTTP/1) or stream's (HTTP/2)
// write deadline to now+timeout before each Write and flush and clears it
// after, so a client that stops reading fails the write within timeout
// (the connection is then closed and the handler returns, cancelling its
// internal gRPC call) while an idle stream with nothing to write is never
// cut: HTTP/2 resets a stream when its deadline passes even without a
// pending write.
type writeDeadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	// http1: net/http's HTTP/1 response buffers what the handler writes
	// (2 KiB, then the connection's 4 KiB) and reaches the socket only
	// when that overflows or on a flush. unflushed counts what was
	// written since the last flush; a write that keeps it within
	// http1BufferedBytes cannot reach the socket, so it needs no
	// deadline (two deadline changes less per small write: an NDJSON
	// event is two writes and a flush).
	http1     bool
	unflushed int
}

// http1BufferedBytes is how much a handler may write after a flush with
// every byte still in net/http's HTTP/1 response buffer (its
// bufferBeforeChunkingSize is 2,048 octets; half of it, for margin).
const http1BufferedBytes = 1024

func (w *writeDeadlineWriter) arm()    { _ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) }
func (w *writeDeadlineWriter) disarm() { _ = w.rc.SetWriteDeadline(time.Time{}) }

// Write writes p in pieces of at most deadlineWriteBytes, each under its
// own deadline: a client must take deadlineWriteBytes per timeout, however
// large the message.
func (w *writeDeadlineWriter) Write(p []byte) (int, error) {
	if w.http1 && w.unflushed+len(p) <= http1BufferedBytes {
		w.unflushed += len(p)
		return w.ResponseWriter.Write(p) // stays in the buffer: see http1
	}
	w.unflushed = http1BufferedBytes // unknown until the next flush
	n := 0
	for first := true; first || n < len(p); first = false {
		k := min(len(p)-n, deadlineWriteBytes)
		w.arm()
		m, err := w.ResponseWriter.Write(p[n : n+k])
		n += m
		if err != nil {
			w.disarm()
			return n, err
		}
	}
	w.disarm()
	return n, nil
}

// FlushError flushes within the deadline and reports a failed flush
// (http.ResponseController.Flush prefers it over Flush).
func (w *writeDeadlineWriter) FlushError() error {
	w.arm()
	err := w.rc.Flush()
	w.disarm()
	w.unflushed = 0
	return err
}

// Flush implements http.Flusher for handlers that assert it.
func (w *writeDeadlineWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection.
func (w *writeDeadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
