package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const subscribeMethod = "/pipestream.gateway.v1.EventService/SubscribeEvents"

// handleEventsWS serves GET /v1/events/ws?cursor=N[&kinds=#status][&documentId=ID]:
// the event log over WebSocket as draft-holmgren-at-synchronization-00
// frames it ("WebSocket Transport"). It is a client of SubscribeEvents over
// the REST proxy's gRPC connection, so cursor rules, tenancy and auth are
// exactly those of gRPC and NDJSON subscribers:
//
//   - every event is one binary frame: CBOR {op: 1, t: kind} + CBOR payload;
//   - FutureCursor and ConsumerTooSlow are an error frame {op: -1} +
//     {error, message}, then close ("Error Frames");
//   - OutdatedCursor is an "#info" message frame;
//   - requests rejected before the upgrade (bad cursor, auth) get an HTTP
//     status with a JSON {error, message} body ("Pre-Upgrade HTTP Errors").
//
// Client messages are read and ignored; pings keep the connection alive.
func (s *Server) handleEventsWS(w http.ResponseWriter, r *http.Request) {
	req := &gatewayv1.SubscribeEventsRequest{
		Kinds:      r.URL.Query()["kinds"],
		DocumentId: r.URL.Query().Get("documentId"),
	}
	if v := r.URL.Query().Get("cursor"); v != "" {
		c, err := strconv.ParseUint(v, 10, 64)
		if err != nil || c >= 1<<53 {
			preUpgradeError(w, http.StatusBadRequest, "InvalidRequest",
				fmt.Sprintf("cursor=%q is not a sequence number: use an integer in [0, 2^53), or omit it for live events only", v))
			return
		}
		req.Cursor = &c
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ctx, err := runtime.AnnotateContext(ctx, s.gwMux, r, subscribeMethod, runtime.WithHTTPPathPattern("/v1/events/ws"))
	if err != nil {
		preUpgradeError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	stream, err := gatewayv1.NewEventServiceClient(s.conn).SubscribeEvents(ctx, req)
	if err == nil {
		// SubscribeEvents sends headers once auth and the limits passed and
		// the subscription starts, marked with subscribedHeader; a call
		// rejected before that is a trailers-only response (Header returns
		// the trailers without an error, Recv the status). Either is a
		// pre-upgrade rejection.
		var md metadata.MD
		if md, err = stream.Header(); err == nil && len(md.Get(subscribedHeader)) == 0 {
			if _, err = stream.Recv(); err == nil || errors.Is(err, io.EOF) {
				err = status.Error(codes.Internal, "the event subscription ended before it started")
			}
		}
	}
	if err != nil && errorReason(err) == ReasonFutureCursor {
		// "Error Frames": a future cursor is an error frame after the
		// upgrade, then close (the subscription refused it before start).
		if c, aerr := websocket.Accept(w, r, s.wsAcceptOptions()); aerr == nil {
			s.closeWithErrorFrame(c, ReasonFutureCursor, status.Convert(err).Message())
			_ = c.CloseNow()
		}
		return
	}
	if err != nil {
		st := status.Convert(err)
		errorHeaders(w.Header(), err) // WWW-Authenticate, Retry-After
		preUpgradeError(w, runtime.HTTPStatusFromCode(st.Code()), wsErrorName(err), st.Message())
		return
	}

	c, err := websocket.Accept(w, r, s.wsAcceptOptions())
	if err != nil {
		return // Accept wrote the HTTP error
	}
	s.ws.Add(1)
	defer s.ws.Done()
	defer c.CloseNow()
	c.SetReadLimit(64 << 10)

	// Reader: discards client messages, processes pongs and close frames.
	go func() {
		defer cancel()
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	}()
	// Keepalive.
	go func() {
		t := time.NewTicker(wsPingInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				pctx, pcancel := context.WithTimeout(ctx, wsPongTimeout)
				err := c.Ping(pctx)
				pcancel()
				if err != nil {
					cancel()
					return
				}
			}
		}
	}()

	var frame []byte
	for {
		ev, err := stream.Recv()
		if err != nil {
			s.closeWS(ctx, c, err)
			return
		}
		frame, err = appendEventFrame(frame[:0], ev)
		if err != nil {
			s.log.Warn("dropping oversized WebSocket event frame", "seq", ev.GetSeq(), "error", err)
			continue
		}
		wctx, wcancel := context.WithTimeout(ctx, s.cfg.StreamWriteTimeout)
		err = c.Write(wctx, websocket.MessageBinary, frame)
		wcancel()
		if err != nil {
			if ctx.Err() == nil { // not the consumer leaving: it could not keep up
				s.closeWithErrorFrame(c, ReasonConsumerTooSlow, "the consumer did not accept a frame in time; reconnect with cursor="+strconv.FormatUint(ev.GetSeq(), 10))
			}
			return
		}
	}
}

// closeWS ends the connection after the subscription ended with err.
func (s *Server) closeWS(ctx context.Context, c *websocket.Conn, err error) {
	if ctx.Err() != nil && status.Code(err) == codes.Canceled {
		return // the consumer went away
	}
	if errors.Is(err, io.EOF) {
		_ = c.Close(websocket.StatusNormalClosure, "")
		return
	}
	st := status.Convert(err)
	if st.Code() == codes.Unavailable {
		_ = c.Close(websocket.StatusGoingAway, truncateReason(st.Message()))
		return
	}
	s.closeWithErrorFrame(c, wsErrorName(err), st.Message())
}

// closeWithErrorFrame sends an error frame then closes, as "Error Frames"
// requires.
func (s *Server) closeWithErrorFrame(c *websocket.Conn, name, msg string) {
	frame, err := appendErrorFrame(nil, name, msg)
	if err == nil {
		wctx, cancel := context.WithTimeout(context.Background(), wsPongTimeout)
		_ = c.Write(wctx, websocket.MessageBinary, frame)
		cancel()
	}
	_ = c.Close(websocket.StatusPolicyViolation, truncateReason(name))
}

// wsErrorName is the error frame's machine-readable name: the ErrorInfo
// reason when there is one (FutureCursor, ConsumerTooSlow, ...), else the
// gRPC code name.
func wsErrorName(err error) string {
	if r := errorReason(err); r != "" {
		return r
	}
	return status.Code(err).String()
}

// truncateReason keeps a close reason within the 123 bytes a close frame
// allows.
func truncateReason(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}

// preUpgradeError answers a rejected upgrade with a JSON {error, message}.
func preUpgradeError(w http.ResponseWriter, code int, name, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": name, "message": msg})
}
