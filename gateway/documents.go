package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/api/httpbody"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// documentService implements gatewayv1.DocumentServiceServer over
// bridge.Service. Handlers validate what the transport can check, call the
// bridge with the caller's tenant and map bridge errors with toStatus.
type documentService struct {
	gatewayv1.UnimplementedDocumentServiceServer
	s *Server
}

func requireID(field, v string) error {
	if v == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required: put it in the request (REST: in the URL path)", field)
	}
	return nil
}

func (d *documentService) SubmitDocument(ctx context.Context, req *gatewayv1.SubmitDocumentRequest) (*gatewayv1.Document, error) {
	if len(req.GetContent()) == 0 {
		return nil, status.Error(codes.InvalidArgument,
			`content is required: send the document bytes base64-encoded in "content" (or stream raw bytes to POST /v1/documents:upload)`)
	}
	if int64(len(req.GetContent())) > d.s.cfg.MaxUploadBytes {
		return nil, tooLarge(d.s.cfg.MaxUploadBytes)
	}
	if err := d.s.admitDocument(int64(len(req.GetContent()))); err != nil {
		return nil, err
	}
	doc, err := d.s.cfg.Bridge.Submit(ctx, TenantFromContext(ctx), req)
	return doc, toStatus(err)
}

func tooLarge(limit int64) error {
	return statusError(codes.InvalidArgument, ReasonTooLarge,
		fmt.Sprintf("document exceeds the upload limit of %d bytes: send a smaller document or ask the operator to raise --max-upload-bytes", limit))
}

// UploadDocument reads the options from the first message and pipes every
// chunk into bridge.Upload as it arrives: memory per upload is one message,
// never the whole document. A client that sends nothing for
// Config.UploadIdleTimeout is cut with DeadlineExceeded, reason
// UPLOAD_STALLED.
func (d *documentService) UploadDocument(stream grpc.ClientStreamingServer[gatewayv1.UploadDocumentRequest, gatewayv1.Document]) error {
	ctx := stream.Context()
	if d.s.draining.Load() {
		return shutdownUploadError(-1)
	}
	if err := d.s.admitDocument(0); err != nil {
		return err
	}
	idle := d.s.cfg.UploadIdleTimeout
	if isLocalStream(ctx) {
		idle = 0 // the REST route's read deadline cuts a stalled body (localupload.go)
	}
	in := newIdleReceiver(stream, idle)
	defer in.stop()
	first, err := in.next()
	if errors.Is(err, io.EOF) {
		return status.Error(codes.InvalidArgument, "upload stream is empty: send a first message with options, then the content chunks")
	}
	if err != nil {
		return err
	}
	opts := first.GetOptions()
	if opts == nil {
		opts = &gatewayv1.SubmitOptions{}
	}

	pr, pw := io.Pipe()
	limit := d.s.cfg.MaxUploadBytes
	pumpDone := make(chan struct{})
	var total int64 // bytes received; read after pumpDone
	go func() {
		defer close(pumpDone)
		msg := first
		for {
			if c := msg.GetChunk(); len(c) > 0 {
				total += int64(len(c))
				if total > limit {
					pw.CloseWithError(tooLarge(limit))
					return
				}
				if err := d.s.disk.room(int64(len(c))); err != nil {
					pw.CloseWithError(diskFullError(err.Error()))
					return
				}
				_, err := pw.Write(c) // returns once the bridge copied all of c
				releaseChunk(ctx, c)
				if err != nil {
					return // reader gone: bridge.Upload returned
				}
			}
			next, err := in.next()
			if errors.Is(err, io.EOF) {
				pw.Close()
				return
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			msg = next
		}
	}()
	uctx, stopCut := d.s.uploadContext(ctx, func() { pr.CloseWithError(errUploadCut) })
	doc, err := d.s.cfg.Bridge.Upload(uctx, TenantFromContext(ctx), opts, pr)
	stopCut()
	// Unblock the pump if the bridge stopped reading early.
	pr.CloseWithError(errors.New("upload ended"))
	in.stop()
	<-pumpDone
	if err != nil {
		if d.s.uploadWasCut() {
			return shutdownUploadError(total)
		}
		if in.stalled() {
			return uploadStalled(d.s.cfg.UploadIdleTimeout)
		}
		return toStatus(err)
	}
	return stream.SendAndClose(doc)
}

// idleReceiver receives upload messages on its own goroutine so that a
// stalled client can be cut: grpc-go's Recv cannot be interrupted by the
// handler, only by the handler returning.
type idleReceiver struct {
	msgs     chan recvResult
	done     chan struct{}
	stopOnce sync.Once
	idle     time.Duration
	timer    *time.Timer
	timedOut atomic.Bool
}

type recvResult struct {
	m   *gatewayv1.UploadDocumentRequest
	err error
}

func newIdleReceiver(stream grpc.ClientStreamingServer[gatewayv1.UploadDocumentRequest, gatewayv1.Document], idle time.Duration) *idleReceiver {
	r := &idleReceiver{msgs: make(chan recvResult), done: make(chan struct{}), idle: idle}
	if idle > 0 {
		r.timer = time.NewTimer(idle)
	}
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case r.msgs <- recvResult{m, err}:
			case <-r.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return r
}

// next returns the next message, io.EOF at the end, or UPLOAD_STALLED when
// none arrived within idle (never with idle 0).
func (r *idleReceiver) next() (*gatewayv1.UploadDocumentRequest, error) {
	var expired <-chan time.Time
	if r.timer != nil {
		r.timer.Reset(r.idle)
		expired = r.timer.C
	}
	select {
	case res := <-r.msgs:
		return res.m, res.err
	case <-expired:
		r.timedOut.Store(true)
		return nil, uploadStalled(r.idle)
	case <-r.done:
		return nil, errors.New("upload ended")
	}
}

func (r *idleReceiver) stalled() bool { return r.timedOut.Load() }

// stop releases the receiving goroutine (it exits once Recv returns, which
// happens when the handler returns).
func (r *idleReceiver) stop() { r.stopOnce.Do(func() { close(r.done) }) }

func (d *documentService) GetDocument(ctx context.Context, req *gatewayv1.GetDocumentRequest) (*gatewayv1.Document, error) {
	if err := requireID("id", req.GetId()); err != nil {
		return nil, err
	}
	doc, err := d.s.cfg.Bridge.GetDocument(ctx, TenantFromContext(ctx), req.GetId(), req.GetIncludeEntities())
	return doc, toStatus(err)
}

func (d *documentService) ListDocuments(ctx context.Context, req *gatewayv1.ListDocumentsRequest) (*gatewayv1.ListDocumentsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, status.Error(codes.InvalidArgument, "pageSize must be between 0 and 1000 (0 means the default, 50)")
	}
	resp, err := d.s.cfg.Bridge.ListDocuments(ctx, TenantFromContext(ctx), req)
	return resp, toStatus(err)
}

func (d *documentService) WatchDocument(req *gatewayv1.WatchDocumentRequest, stream grpc.ServerStreamingServer[gatewayv1.WatchDocumentResponse]) error {
	if err := requireID("id", req.GetId()); err != nil {
		return err
	}
	ctx, cancel := d.s.streamContext(stream.Context())
	defer cancel()
	ctx = startedHeaders(ctx, stream)
	var last uint64
	err := d.s.cfg.Bridge.Watch(ctx, TenantFromContext(ctx), req.GetId(), req.GetCursor(), func(r *gatewayv1.WatchDocumentResponse) error {
		if seq := r.GetEvent().GetSeq(); seq > 0 {
			last = seq
		}
		return stream.Send(r)
	})
	if err != nil && d.s.shuttingDown() {
		return status.Errorf(codes.Unavailable, "server is shutting down: watch again with cursor=%d to resume", last+1)
	}
	return toStatus(err)
}

// GetDocumentResult streams the rehydrated result from bridge.Result in
// resultChunkBytes messages, so a result of any size passes without being
// held whole: the first message carries the content type (and may be empty
// for an empty result), the header resultSizeHeader the total size when the
// bridge knows it. A read error ends the stream with the error status.
func (d *documentService) GetDocumentResult(req *gatewayv1.GetDocumentResultRequest, stream grpc.ServerStreamingServer[httpbody.HttpBody]) error {
	if err := requireID("id", req.GetId()); err != nil {
		return err
	}
	ctx := stream.Context()
	ct, size, rc, err := d.s.cfg.Bridge.Result(ctx, TenantFromContext(ctx), req.GetId())
	if err != nil {
		return toStatus(err)
	}
	defer rc.Close()
	if ct == "" {
		ct = "application/octet-stream"
	}
	if size >= 0 {
		_ = stream.SetHeader(metadata.Pairs(resultSizeHeader, strconv.FormatInt(size, 10)))
	}
	var sent int64
	for first := true; ; first = false {
		// A fresh buffer per message: grpc-go forbids touching a message
		// after SendMsg (stats handlers may read it later).
		buf := make([]byte, resultChunkBytes)
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 || first {
			msg := &httpbody.HttpBody{Data: buf[:n]}
			if first {
				msg.ContentType = ct
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
			sent += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return toStatus(fmt.Errorf("read result of document %s after %d bytes: %w", req.GetId(), sent, rerr))
		}
	}
	if size >= 0 && sent != size {
		return status.Errorf(codes.DataLoss, "result of document %s: sent %d bytes, the stored result has %d; fetch it again", req.GetId(), sent, size)
	}
	return nil
}

func (d *documentService) CancelDocument(ctx context.Context, req *gatewayv1.CancelDocumentRequest) (*gatewayv1.Document, error) {
	if err := requireID("id", req.GetId()); err != nil {
		return nil, err
	}
	doc, err := d.s.cfg.Bridge.Cancel(ctx, TenantFromContext(ctx), req.GetId())
	return doc, toStatus(err)
}

func (d *documentService) GetClaimCheck(ctx context.Context, req *gatewayv1.GetClaimCheckRequest) (*gatewayv1.ClaimCheck, error) {
	if err := requireID("claimId", req.GetClaimId()); err != nil {
		return nil, err
	}
	c, err := d.s.cfg.Bridge.GetClaim(ctx, TenantFromContext(ctx), req.GetClaimId())
	return c, toStatus(err)
}

func (d *documentService) RedeemClaimCheck(ctx context.Context, req *gatewayv1.RedeemClaimCheckRequest) (*gatewayv1.ClaimCheck, error) {
	if err := requireID("claimId", req.GetClaimId()); err != nil {
		return nil, err
	}
	c, err := d.s.cfg.Bridge.Redeem(ctx, TenantFromContext(ctx), req.GetClaimId())
	return c, toStatus(err)
}
