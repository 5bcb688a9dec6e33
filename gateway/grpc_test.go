package gateway_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func TestGRPCErrorMapping(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	done := h.fake.add(gatewayv1.State_SUCCEEDED, 1)
	tests := []struct {
		name       string
		call       func() error
		code       codes.Code
		reason     string
		msgContain string
	}{
		{"not found", func() error { _, err := h.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: "x"}); return err }, codes.NotFound, "NOT_FOUND", `"x"`},
		{"missing id", func() error { _, err := h.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{}); return err }, codes.InvalidArgument, "INVALID_ARGUMENT", "id is required"},
		{"conflict", func() error {
			_, err := h.docs.SubmitDocument(ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte("x"), RequestId: "reused"})
			return err
		}, codes.AlreadyExists, "ALREADY_EXISTS", "new requestId"},
		{"cancel terminal", func() error {
			_, err := h.docs.CancelDocument(ctx, &gatewayv1.CancelDocumentRequest{Id: done.GetId()})
			return err
		}, codes.FailedPrecondition, "FAILED_PRECONDITION", "cannot be cancelled"},
		{"redeem replay", func() error {
			_, err := h.docs.RedeemClaimCheck(ctx, &gatewayv1.RedeemClaimCheckRequest{ClaimId: "1"})
			return err
		}, codes.FailedPrecondition, "CLAIM_ALREADY_REDEEMED", "exactly once"},
		{"redeem expired", func() error {
			_, err := h.docs.RedeemClaimCheck(ctx, &gatewayv1.RedeemClaimCheckRequest{ClaimId: "2"})
			return err
		}, codes.FailedPrecondition, "CLAIM_EXPIRED", "expired"},
		{"redeem at a dead peer", func() error {
			_, err := h.docs.RedeemClaimCheck(ctx, &gatewayv1.RedeemClaimCheckRequest{ClaimId: "3"})
			return err
		}, codes.Unavailable, "PEER_UNAVAILABLE", "10.0.0.7:4433"},
		{"future cursor", func() error {
			s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{Cursor: proto.Uint64(21)})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.OutOfRange, "FutureCursor", "FutureCursor"},
		{"consumer too slow", func() error {
			h.fake.log.tooSlow.Store(true)
			defer h.fake.log.tooSlow.Store(false)
			s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.ResourceExhausted, "ConsumerTooSlow", "ConsumerTooSlow"},
		{"bad kind", func() error {
			s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{Kinds: []string{"status"}})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT", "#status"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code {
				t.Fatalf("%v, want %v", err, tc.code)
			}
			if got := reasonOf(err); got != tc.reason {
				t.Errorf("reason %q, want %q", got, tc.reason)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.msgContain) {
				t.Errorf("message %q does not say %q", status.Convert(err).Message(), tc.msgContain)
			}
		})
	}
}

func TestGRPCRequestID(t *testing.T) {
	h := start(t, nil)
	var hdr metadata.MD
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "mine-1")
	if _, err := h.docs.ListDocuments(ctx, &gatewayv1.ListDocumentsRequest{}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get("x-request-id"); len(got) != 1 || got[0] != "mine-1" {
		t.Errorf("x-request-id %v, want [mine-1]", got)
	}
	// A request id with control characters is replaced, not echoed.
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "bad id")
	if _, err := h.docs.ListDocuments(ctx, &gatewayv1.ListDocumentsRequest{}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get("x-request-id"); len(got) != 1 || len(got[0]) != 32 {
		t.Errorf("x-request-id %v, want a generated id", got)
	}
	// Streams carry it too.
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "stream-7")
	d := h.fake.add(gatewayv1.State_RUNNING, 1)
	ws, err := h.docs.WatchDocument(ctx, &gatewayv1.WatchDocumentRequest{Id: d.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err = ws.Header()
	if err != nil || hdr.Get("x-request-id")[0] != "stream-7" {
		t.Errorf("stream header %v %v, want x-request-id stream-7", hdr, err)
	}
	n := 0
	for {
		_, err := ws.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 {
		t.Errorf("watch delivered %d updates, want 3", n)
	}
}

func TestRecoveryTurnsPanicIntoInternal(t *testing.T) {
	h := start(t, nil)
	_, err := h.docs.GetDocument(context.Background(), &gatewayv1.GetDocumentRequest{Id: "panic"})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "request id") {
		t.Fatalf("%v, want Internal naming the request id", err)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "panic in gRPC handler") || !strings.Contains(logs, "fake bridge: boom") || !strings.Contains(logs, "goroutine") {
		t.Errorf("panic not logged with its value and stack:\n%s", logs)
	}
	// The server lives on; REST sees 500.
	if _, err := h.docs.ListDocuments(context.Background(), &gatewayv1.ListDocumentsRequest{}); err != nil {
		t.Fatalf("server unusable after a panic: %v", err)
	}
	if code, _, b := h.do("GET", "/v1/documents/panic", nil); code != 500 {
		t.Errorf("REST after panic: HTTP %d %s, want 500", code, b)
	}
}

func TestHealthReflectionMetrics(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	hc := healthpb.NewHealthClient(h.conn)
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v %v, want SERVING", resp, err)
	}
	if code, _, b := h.do("GET", "/healthz", nil); code != 200 || !strings.Contains(string(b), "SERVING") {
		t.Errorf("/healthz HTTP %d %s", code, b)
	}

	notReady := errors.New("no peer session: dialing 127.0.0.1:4433")
	h.fake.notReady.Store(&notReady)
	if code, _, b := h.do("GET", "/healthz", nil); code != 503 || !strings.Contains(string(b), "dialing 127.0.0.1:4433") {
		t.Errorf("/healthz not ready: HTTP %d %s, want 503 with the reason", code, b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "pipestream.gateway.v1.DocumentService"})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grpc health still %v %v after the bridge became unready", resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Reflection lists the services.
	rc, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.CloseSend()
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"pipestream.gateway.v1.DocumentService", "pipestream.gateway.v1.EventService", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}

	_, _ = h.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: "missing"})
	code, _, b := h.do("GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("/metrics HTTP %d", code)
	}
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="NotFound",grpc_method="GetDocument",grpc_service="pipestream.gateway.v1.DocumentService",grpc_type="unary"} 1`,
		`grpc_server_handling_seconds_bucket{grpc_method="GetDocument"`,
		`grpc_server_started_total{grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"}`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if code, hdr, b := h.do("GET", "/openapi.json", nil); code != 200 || hdr.Get("Content-Type") != "application/json" ||
		!strings.Contains(string(b), `"/v1/documents:upload"`) || !strings.Contains(string(b), `"/v1/events/ws"`) {
		t.Errorf("/openapi.json: HTTP %d %.200s, want the merged spec with upload and WebSocket routes", code, b)
	}
	if code, hdr, b := h.do("GET", "/docs/", nil); code != 200 || !strings.Contains(hdr.Get("Content-Type"), "text/html") {
		t.Errorf("/docs/: HTTP %d %.200s, want the docs UI page", code, b)
	}
}

type tenantAuth struct{}

func (tenantAuth) Authenticate(_ context.Context, token string) (bridge.Tenant, error) {
	return gateway.StaticTokens{"s3cret": "acme"}.Authenticate(context.Background(), token)
}

func TestAuthHook(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.Authenticator = tenantAuth{} })
	ctx := context.Background()
	_, err := h.docs.SubmitDocument(ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte("x")})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	// Health skips auth.
	if _, err := healthpb.NewHealthClient(h.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check needs no token, got %v", err)
	}
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	if _, err := h.docs.SubmitDocument(authed, &gatewayv1.SubmitDocumentRequest{Content: []byte("x")}); err != nil {
		t.Fatalf("with token: %v", err)
	}
	if got := *h.fake.lastTenant.Load(); got != "acme" {
		t.Errorf("bridge saw tenant %q, want acme", got)
	}
	// REST: 401 without, Authorization forwarded with.
	if code, _, b := h.do("POST", "/v1/documents", strings.NewReader(`{"content":"eA=="}`)); code != http.StatusUnauthorized {
		t.Errorf("REST without token: HTTP %d %s, want 401", code, b)
	}
	if code, _, b := h.do("POST", "/v1/documents", strings.NewReader(`{"content":"eA=="}`), "Authorization", "Bearer s3cret"); code != 200 {
		t.Errorf("REST with token: HTTP %d %s", code, b)
	}
	if code, _, _ := h.do("GET", "/healthz", nil); code != 200 {
		t.Errorf("/healthz must not need a token, got %d", code)
	}
}

func TestShutdownEndsStreamsAndClosesBridge(t *testing.T) {
	h := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Header(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("shutdown took %v with an open live subscription", time.Since(start))
	}
	if !h.fake.closed.Load() {
		t.Error("bridge was not closed")
	}
	if _, err := sub.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("open subscription ended with %v, want Unavailable: shutting down", err)
	}
}

// TestUnknownGRPCMethod: a call of a method no service has is
// Unimplemented in the one error shape (reason UNKNOWN_METHOD) with the
// request id in its trailers, and the metrics label it "unknown".
func TestUnknownGRPCMethod(t *testing.T) {
	h := start(t, nil)
	var trl metadata.MD
	err := h.conn.Invoke(context.Background(), "/pipestream.gateway.v1.DocumentService/Frobnicate", &gatewayv1.GetDocumentRequest{}, &gatewayv1.Document{}, grpc.Trailer(&trl))
	if status.Code(err) != codes.Unimplemented || reasonOf(err) != gateway.ReasonUnknownMethod || !strings.Contains(status.Convert(err).Message(), "Frobnicate") {
		t.Errorf("unknown method: %v (reason %q), want Unimplemented %s naming the method", err, reasonOf(err), gateway.ReasonUnknownMethod)
	}
	if len(trl.Get("x-request-id")) != 1 {
		t.Errorf("unknown method: trailers %v, want x-request-id", trl)
	}
	_, _, m := h.do("GET", "/metrics", nil)
	if strings.Contains(string(m), "Frobnicate") || !strings.Contains(string(m), `grpc_method="unknown"`) {
		t.Errorf("metrics of an unknown method: want it labelled unknown, not by its name")
	}
}
