package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// eventService implements gatewayv1.EventServiceServer over bridge.EventLog.
type eventService struct {
	gatewayv1.UnimplementedEventServiceServer
	s *Server
}

// SubscribeEvents follows the event log with the AT sync cursor rules
// (bridge.EventLog.Subscribe). FutureCursor becomes OutOfRange with ErrorInfo
// reason "FutureCursor"; ConsumerTooSlow becomes ResourceExhausted with
// reason "ConsumerTooSlow"; OutdatedCursor arrives as an "#info" event.
func (e *eventService) SubscribeEvents(req *gatewayv1.SubscribeEventsRequest, stream grpc.ServerStreamingServer[gatewayv1.Event]) error {
	for _, k := range req.GetKinds() {
		if !strings.HasPrefix(k, "#") {
			return status.Errorf(codes.InvalidArgument, "kinds: %q is not an event kind; use #status, #document, #claim, #sync or #info", k)
		}
	}
	ctx, cancel := e.s.streamContext(stream.Context())
	defer cancel()
	ctx = startedHeaders(ctx, stream)
	var cursor *uint64
	if req.Cursor != nil {
		c := req.GetCursor()
		cursor = &c
	}
	filter := bridge.EventFilter{Kinds: req.GetKinds(), DocumentID: req.GetDocumentId()}
	var last uint64
	replay := cursor != nil && *cursor > 0 // the cursor's own event may come first
	err := e.s.cfg.Bridge.Events().Subscribe(ctx, TenantFromContext(ctx), e.s.clientKey(ctx), cursor, filter, func(ev *gatewayv1.Event) error {
		if seq := ev.GetSeq(); seq > 0 {
			if seq <= last {
				// Never a repeated or reordered seq on the wire: the
				// consumer's cursor rule (skip by seq) would lose events.
				return status.Errorf(codes.Internal, "event seq %d after seq %d: the stream is out of order; subscribe again with cursor=%d", seq, last, last)
			}
			if replay && last == 0 && seq < *cursor {
				return status.Errorf(codes.Internal, "event seq %d before the cursor %d; subscribe again with cursor=%d", seq, *cursor, *cursor)
			}
			last = seq
		}
		return stream.Send(ev)
	})
	if err != nil && e.s.shuttingDown() {
		if last > 0 {
			return status.Errorf(codes.Unavailable, "server is shutting down: subscribe again with cursor=%d to resume", last+1)
		}
		return status.Error(codes.Unavailable, "server is shutting down: subscribe again later")
	}
	return toStatus(err)
}

func (e *eventService) GetEventWindow(ctx context.Context, _ *gatewayv1.GetEventWindowRequest) (*gatewayv1.EventWindow, error) {
	w, err := e.s.cfg.Bridge.Events().Window(ctx)
	return w, toStatus(err)
}

// GetSnapshot answers the whole snapshot in one message, for small stores:
// past maxUnarySnapshotBytes (encoded) it stops reading and fails with
// ResourceExhausted, reason SNAPSHOT_TOO_LARGE, naming StreamSnapshot
// (docs/retention.md, "Snapshot"). It reads through the same paged store
// read as StreamSnapshot, so it never holds more than the limit plus a page.
func (e *eventService) GetSnapshot(ctx context.Context, _ *gatewayv1.GetSnapshotRequest) (*gatewayv1.Snapshot, error) {
	snap := &gatewayv1.Snapshot{}
	size := 0
	err := e.s.cfg.Bridge.Events().StreamSnapshot(ctx, TenantFromContext(ctx), 0, func(c *gatewayv1.SnapshotChunk) error {
		snap.Seq = c.GetSeq()
		for _, d := range c.GetDocuments() {
			size += proto.Size(d) + 8
		}
		if size > maxUnarySnapshotBytes {
			return errSnapshotTooLarge
		}
		snap.Documents = append(snap.Documents, c.GetDocuments()...)
		return nil
	})
	if errors.Is(err, errSnapshotTooLarge) {
		return nil, statusError(codes.ResourceExhausted, ReasonSnapshotTooLarge, fmt.Sprintf(
			"the snapshot has more than %d MiB of documents, the limit of one GetSnapshot message: stream it with StreamSnapshot (GET /v1/events:streamSnapshot), which has no size limit",
			maxUnarySnapshotBytes>>20))
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return snap, nil
}

// errSnapshotTooLarge ends GetSnapshot's read past maxUnarySnapshotBytes.
var errSnapshotTooLarge = errors.New("snapshot too large for one message")

// ReasonSnapshotTooLarge is GetSnapshot's ErrorInfo reason past
// maxUnarySnapshotBytes.
const ReasonSnapshotTooLarge = "SNAPSHOT_TOO_LARGE"

// maxUnarySnapshotBytes bounds GetSnapshot: 16 MiB of encoded documents,
// well under the 64 MiB gRPC message limit that the JSON rendering and
// proxy would otherwise hit first.
var maxUnarySnapshotBytes = 16 << 20

// StreamSnapshot streams the snapshot in chunks of page_size documents, all
// consistent with the seq every chunk carries, then a final chunk with last
// and total_documents. A stream that ends without the final chunk is
// incomplete.
func (e *eventService) StreamSnapshot(req *gatewayv1.StreamSnapshotRequest, stream grpc.ServerStreamingServer[gatewayv1.SnapshotChunk]) error {
	ctx, cancel := e.s.streamContext(stream.Context())
	defer cancel()
	// The chunks come encoded from the stored document bytes: carried as
	// the unknown fields of an empty message, the codec writes them as they
	// are (no decode, no re-encode of the documents).
	msg := &gatewayv1.SnapshotChunk{}
	err := e.s.cfg.Bridge.Events().StreamSnapshotEncoded(ctx, TenantFromContext(ctx), int(min(req.GetPageSize(), 1<<20)), bridge.SnapshotPosition{}, func(chunk []byte, _ bridge.SnapshotPosition) error {
		msg.ProtoReflect().SetUnknown(chunk)
		err := stream.Send(msg)
		msg.ProtoReflect().SetUnknown(nil)
		return err
	})
	if err != nil && e.s.shuttingDown() {
		return status.Error(codes.Unavailable, "server is shutting down: stream the snapshot again later")
	}
	return toStatus(err)
}

// startedHeaders returns ctx with a bridge start hook that sends the
// response headers, marked with subscribedHeader, once the subscription
// started (cursor accepted): the REST proxy then writes the HTTP status
// before the first event (flushStreamHeaders) and the WebSocket route
// upgrades. A call refused before that (FutureCursor, NotFound) has no
// headers and keeps its HTTP error status.
func startedHeaders(ctx context.Context, stream grpc.ServerStream) context.Context {
	return bridge.WithStartHook(ctx, func() { _ = stream.SendHeader(metadata.Pairs(subscribedHeader, "1")) })
}

// clientKey identifies a subscriber for the event log's retention tracking
// (the log hashes it with a rotating salt). It is the tenant plus the
// client's x-client-id metadata if sent (and within the tenant's bound of
// tracked ids, clientIDs), else the first X-Forwarded-For hop (set by the
// REST proxy and the WebSocket route), else the peer's IP. It is a
// retention hint, not a security boundary.
func (s *Server) clientKey(ctx context.Context) string {
	tenant := string(TenantFromContext(ctx))
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-client-id"); len(v) > 0 && v[0] != "" && s.clientIDs.admit(TenantFromContext(ctx), v[0], time.Now()) {
		return tenant + "|id:" + v[0]
	}
	if v := md.Get("x-forwarded-for"); len(v) > 0 && v[0] != "" {
		first, _, _ := strings.Cut(v[0], ",")
		return tenant + "|ip:" + strings.TrimSpace(first)
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		host, _, err := net.SplitHostPort(p.Addr.String())
		if err != nil {
			host = p.Addr.String()
		}
		return tenant + "|ip:" + host
	}
	return tenant + "|unknown"
}
