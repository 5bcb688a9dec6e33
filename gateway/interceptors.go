package gateway

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
)

// The interceptor chain, outermost first (STYLE.md, OpenFGA): error shape,
// recovery, UTF-8 (utf8.go), request id, logging, metrics, auth (+
// limiter). Recovery is first below the error shape so that a panic
// anywhere below, interceptors included, becomes codes.Internal; the error
// shape (shapeError, errors.go) gives every error, a recovered panic's
// too, its ErrorInfo.

func (s *Server) unaryInterceptors() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{
		errorShapeUnary, s.recoverUnary, utf8Unary, requestIDUnary, s.logUnary, s.metrics.unary, s.authUnary,
	}
}

func (s *Server) streamInterceptors() []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{
		s.errorShapeStream, s.recoverStream, utf8Stream, requestIDStream, s.logStream, s.metrics.stream, s.authStream,
		s.watchServerStreams, // stuck.go: innermost, so logs and metrics see ConsumerTooSlow
	}
}

// wrappedStream replaces the context of a server stream.
type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }

// --- error shape ---

func errorShapeUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, shapeError(err)
}

// errorShapeStream also has the stream's request messages received
// through wireRecv, so that one that does not decode or is too large is
// answered in the house shape (wireerrors.go).
func (s *Server) errorShapeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return shapeError(h(srv, wireErrorStream{ServerStream: ss, method: info.FullMethod, limit: s.cfg.MaxRecvMsgBytes}))
}

// --- recovery ---

func (s *Server) recovered(ctx context.Context, method string, p any) error {
	s.metrics.panics.WithLabelValues(method).Inc()
	rid := incomingRequestID(ctx)
	s.log.Error("panic in gRPC handler", "method", method, "request_id", rid,
		"panic", p, "stack", string(debug.Stack()))
	return status.Errorf(codes.Internal, "internal error: the server failed while handling %s (request id %q); it was logged, please report it", method, rid)
}

func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, s.recovered(ctx, info.FullMethod, p)
		}
	}()
	return h(ctx, req)
}

func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = s.recovered(ss.Context(), info.FullMethod, p)
		}
	}()
	return h(srv, ss)
}

// --- request id ---

// incomingRequestID returns the caller's x-request-id if it is acceptable.
func incomingRequestID(ctx context.Context) string {
	for _, v := range metadata.ValueFromIncomingContext(ctx, requestIDHeader) {
		if validRequestID(v) {
			return v
		}
	}
	return ""
}

// validRequestID accepts 1..128 visible ASCII characters, so that ids are
// safe to log and echo.
func validRequestID(v string) bool {
	if v == "" || len(v) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func requestIDContext(ctx context.Context) (context.Context, string) {
	rid := incomingRequestID(ctx)
	if rid == "" {
		rid = newRequestID()
	}
	return withCallInfo(ctx, &callInfo{requestID: rid}), rid
}

// requestIDUnary sends the call's request id in the response headers and
// trailers: a call that fails before its headers (a trailers-only
// response) still carries it. A call of the gRPC listener had its id
// chosen, and put in the trailers, before its request was read
// (wireRequestID); an in-process REST call gets it here.
func requestIDUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if rid, ok := ctx.Value(wireRequestIDKey{}).(string); ok {
		ctx = withCallInfo(ctx, &callInfo{requestID: rid})
		_ = grpc.SetHeader(ctx, metadata.Pairs(requestIDHeader, rid))
		return h(ctx, req)
	}
	ctx, rid := requestIDContext(ctx)
	md := metadata.Pairs(requestIDHeader, rid)
	_ = grpc.SetHeader(ctx, md)
	_ = grpc.SetTrailer(ctx, md)
	return h(ctx, req)
}

func requestIDStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, rid := requestIDContext(ss.Context())
	md := metadata.Pairs(requestIDHeader, rid)
	_ = ss.SetHeader(md)
	ss.SetTrailer(md)
	return h(srv, &wrappedStream{ServerStream: ss, ctx: ctx})
}

// --- logging ---

func (s *Server) logCall(ctx context.Context, method string, start time.Time, err error) {
	code := status.Code(err)
	level := slog.LevelInfo
	switch code {
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		level = slog.LevelError
	}
	if skipAuth(method) && code == codes.OK {
		level = slog.LevelDebug
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", method),
		slog.String("code", code.String()),
		slog.Duration("duration", time.Since(start)),
	}
	if ci := callInfoFrom(ctx); ci != nil {
		attrs = append(attrs, slog.String("request_id", ci.requestID), slog.String("tenant", string(ci.tenant)))
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
	}
	s.log.LogAttrs(ctx, level, "grpc call", attrs...)
}

func (s *Server) logUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	s.logCall(ctx, info.FullMethod, start, err)
	return resp, err
}

func (s *Server) logStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	err := h(srv, ss)
	s.logCall(ss.Context(), info.FullMethod, start, err)
	return err
}

// --- auth (last) ---

// authenticate runs the Authenticator, then Config.Limiter and the
// per-tenant rate limit. Health and reflection skip all of it.
func (s *Server) authenticate(ctx context.Context, method string) (bridge.Tenant, error) {
	tenant, err := s.identify(ctx, method)
	if err != nil || skipAuth(method) {
		return tenant, err
	}
	if err := s.admitTenant(ctx, tenant, method); err != nil {
		return "", err
	}
	return tenant, nil
}

// identify runs the Authenticator only and records the tenant in the
// call info.
func (s *Server) identify(ctx context.Context, method string) (bridge.Tenant, error) {
	if skipAuth(method) {
		return "", nil
	}
	tenant, err := s.cfg.Authenticator.Authenticate(ctx, bearerToken(ctx))
	if err != nil {
		s.metrics.rejected.WithLabelValues("unauthenticated").Inc()
		if st, ok := status.FromError(err); ok && (st.Code() == codes.Unauthenticated || st.Code() == codes.PermissionDenied) {
			return "", err
		}
		return "", status.Errorf(codes.Unauthenticated, "authentication failed: %v", err)
	}
	if ci := callInfoFrom(ctx); ci != nil {
		ci.tenant = tenant
	}
	s.attributeH2(ctx, tenant)
	return tenant, nil
}

// admitTenant runs Config.Limiter and the per-tenant rate limit for an
// authenticated call.
func (s *Server) admitTenant(ctx context.Context, tenant bridge.Tenant, method string) error {
	if s.cfg.Limiter != nil {
		if err := s.cfg.Limiter.Allow(ctx, tenant, method); err != nil {
			s.metrics.rejected.WithLabelValues("limiter").Inc()
			if _, ok := status.FromError(err); ok {
				return err
			}
			return status.Error(codes.ResourceExhausted, err.Error())
		}
	}
	if err := s.limits.allow(tenant); err != nil {
		s.metrics.rejected.WithLabelValues("rate").Inc()
		return err
	}
	return nil
}

// preAdmitted reports whether a call was admitted by the REST side: it
// carries admittedHeader with this server's random admitNonce and came
// over the REST proxy's own connection (fromProxy). A REST client cannot
// forge it: incomingHeader never forwards the header, and the nonce is
// never sent to a client.
func (s *Server) preAdmitted(ctx context.Context) bool {
	for _, v := range metadata.ValueFromIncomingContext(ctx, admittedHeader) {
		if subtle.ConstantTimeCompare([]byte(v), []byte(s.admitNonce)) == 1 {
			return s.fromProxy(ctx)
		}
	}
	return false
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if _, err := s.authenticate(ctx, info.FullMethod); err != nil {
		if md := retryAfterMD(err); md != nil {
			_ = grpc.SetTrailer(ctx, md)
		}
		return nil, err
	}
	return h(ctx, req)
}

// authStream also holds a per-tenant concurrency slot for uploads and
// event streams while the handler runs. A call the REST side admitted
// already (preAdmitted: the upload route took its rate token and slot
// before reading the body) is authenticated only.
func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if s.preAdmitted(ss.Context()) {
		if _, err := s.identify(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return h(srv, ss)
	}
	tenant, err := s.authenticate(ss.Context(), info.FullMethod)
	if err == nil && !skipAuth(info.FullMethod) {
		var release func()
		release, err = s.limits.acquire(info.FullMethod, tenant)
		if err == nil {
			defer release()
		} else {
			s.metrics.rejected.WithLabelValues("concurrency").Inc()
		}
	}
	if err != nil {
		if md := retryAfterMD(err); md != nil {
			ss.SetTrailer(md)
		}
		return err
	}
	return h(srv, ss)
}
