package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func twoTenants() gateway.Authenticator {
	return gateway.StaticTokens{"tok-acme": "acme", "tok-globex": "globex"}
}

func retryInfo(err error) *errdetails.RetryInfo {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	return nil
}

// TestRateLimitPerTenant: the bucket is per tenant; a refused call is
// ResourceExhausted with RetryInfo and a retry-after trailer over gRPC, 429
// with Retry-After over REST.
func TestRateLimitPerTenant(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.Authenticator = twoTenants()
		c.RateLimit, c.RateBurst = 0.2, 2 // one token every 5 s
	})
	acme := bearer(context.Background(), "tok-acme")
	for i := range 2 {
		if _, err := h.docs.ListDocuments(acme, &gatewayv1.ListDocumentsRequest{}); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	var trailer metadata.MD
	_, err := h.docs.ListDocuments(acme, &gatewayv1.ListDocumentsRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "rate limit exceeded for this tenant") {
		t.Fatalf("third call: %v, want ResourceExhausted naming the rate limit", err)
	}
	ri := retryInfo(err)
	if ri == nil || ri.GetRetryDelay().AsDuration() <= 0 || ri.GetRetryDelay().AsDuration() > 5*time.Second {
		t.Errorf("RetryInfo %v, want a delay in (0, 5s]", ri)
	}
	if v := trailer.Get("retry-after"); len(v) != 1 || (v[0] != "4" && v[0] != "5") {
		t.Errorf("retry-after trailer %v, want [5] (seconds, rounded up)", v)
	}
	code, hdr, body := h.do("GET", "/v1/documents", nil, "Authorization", "Bearer tok-acme")
	if code != 429 || hdr.Get("Retry-After") == "" {
		t.Errorf("REST over the limit: HTTP %d Retry-After %q %s, want 429 with Retry-After", code, hdr.Get("Retry-After"), body)
	}
	// Another tenant has its own bucket.
	if code, _, body := h.do("GET", "/v1/documents", nil, "Authorization", "Bearer tok-globex"); code != 200 {
		t.Errorf("other tenant: HTTP %d %s, want 200", code, body)
	}
	// Health is never limited.
	if code, _, _ := h.do("GET", "/healthz", nil); code != 200 {
		t.Errorf("/healthz: HTTP %d", code)
	}
}

// TestConcurrentUploadsPerTenant: the second concurrent upload of a tenant
// is refused with the documented message; another tenant is not affected,
// and the slot frees when the first upload ends.
func TestConcurrentUploadsPerTenant(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.Authenticator = twoTenants()
		c.MaxUploadsPerTenant = 1
	})
	bg := context.Background()
	first, err := h.docs.UploadDocument(bearer(bg, "tok-acme"))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain"}, Chunk: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.fake.uploadStarted:
	case <-time.After(5 * time.Second):
		t.Fatal("first upload never reached the bridge")
	}
	upload := func(tok string) error {
		s, err := h.docs.UploadDocument(bearer(bg, tok))
		if err != nil {
			return err
		}
		_ = s.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain"}, Chunk: []byte("x")})
		_, err = s.CloseAndRecv()
		return err
	}
	err = upload("tok-acme")
	if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != "too many concurrent uploads for this tenant (limit 1, --max-uploads-per-tenant); retry when one ends" {
		t.Errorf("second concurrent upload: %v, want ResourceExhausted \"too many concurrent uploads for this tenant (limit 1, --max-uploads-per-tenant); retry when one ends\"", err)
	}
	if retryInfo(err) == nil {
		t.Error("no RetryInfo on the concurrency refusal")
	}
	code, hdr, body := h.do("POST", "/v1/documents:upload", strings.NewReader("x"), "Authorization", "Bearer tok-acme")
	if code != 429 || hdr.Get("Retry-After") != "1" {
		t.Errorf("REST upload over the limit: HTTP %d Retry-After %q %s, want 429, Retry-After 1", code, hdr.Get("Retry-After"), body)
	}
	if err := upload("tok-globex"); err != nil {
		t.Errorf("other tenant's upload: %v", err)
	}
	if _, err := first.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if err := upload("tok-acme"); err != nil {
		t.Errorf("upload after the first ended: %v", err)
	}
}

// TestSubscribersPerTenant covers SubscribeEvents, WatchDocument and the
// WebSocket route, which share one per-tenant budget.
func TestSubscribersPerTenant(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.Authenticator = twoTenants()
		c.MaxSubscribersPerTenant = 1
	})
	ctx, cancel := context.WithCancel(bearer(context.Background(), "tok-acme"))
	defer cancel()
	live, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := live.Header(); err != nil {
		t.Fatal(err)
	}
	s2, err := h.events.SubscribeEvents(bearer(context.Background(), "tok-acme"), &gatewayv1.SubscribeEventsRequest{})
	if err == nil {
		_, err = s2.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many concurrent event streams") || !strings.Contains(err.Error(), "(limit 1, --max-subscribers-per-tenant)") {
		t.Errorf("second subscription: %v, want ResourceExhausted naming the limit", err)
	}
	doc := h.fake.add(gatewayv1.State_RUNNING, 1)
	w, err := h.docs.WatchDocument(bearer(context.Background(), "tok-acme"), &gatewayv1.WatchDocumentRequest{Id: doc.Id})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("watch while subscribed: %v, want ResourceExhausted", err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	_, resp, err := websocket.Dial(wctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws", &websocket.DialOptions{
		HTTPClient: h.http, HTTPHeader: http.Header{"Authorization": {"Bearer tok-acme"}}})
	if err == nil || resp == nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("WebSocket over the limit: %v %v, want 429 with Retry-After before the upgrade", resp, err)
	}
	c, _, err := websocket.Dial(wctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws", &websocket.DialOptions{
		HTTPClient: h.http, HTTPHeader: http.Header{"Authorization": {"Bearer tok-globex"}}})
	if err != nil {
		t.Errorf("other tenant's WebSocket: %v", err)
	} else {
		c.Close(websocket.StatusNormalClosure, "")
	}
	cancel()
	waitFor(t, 5*time.Second, "the slot to free", func() bool {
		s, err := h.events.SubscribeEvents(bearer(context.Background(), "tok-acme"), &gatewayv1.SubscribeEventsRequest{})
		if err != nil {
			return false
		}
		md, err := s.Header()
		ok := err == nil && len(md.Get("x-pipestream-subscribed")) == 1
		return ok
	})
}

// TestUploadIdleTimeout: an upload whose body stops arriving is cut after
// UploadIdleTimeout, over REST (408) and gRPC (DeadlineExceeded,
// UPLOAD_STALLED), though the connection stays open.
func TestUploadIdleTimeout(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.UploadIdleTimeout = 300 * time.Millisecond })

	conn, err := net.Dial("tcp", h.srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/documents:upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\nfirst bytes, then nothing")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to a stalled upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 408 || !strings.Contains(string(body), "stalled") {
		t.Errorf("stalled REST upload: HTTP %d %s, want 408 naming the stall", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stalled REST upload cut after %s, want about 300ms", d)
	}

	s, err := h.docs.UploadDocument(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain"}, Chunk: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	err = s.RecvMsg(new(gatewayv1.Document)) // no CloseSend: the client stalls
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--upload-idle-timeout") {
		t.Errorf("stalled gRPC upload: %v, want DeadlineExceeded naming --upload-idle-timeout", err)
	}
}

// TestReadHeaderTimeout: a client that trickles its headers is
// disconnected after ReadHeaderTimeout.
func TestReadHeaderTimeout(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.ReadHeaderTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", h.srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(conn)
	if err != nil {
		t.Fatalf("connection not closed by the server: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closed after %s, want about 200ms", d)
	}
}
