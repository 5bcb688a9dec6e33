package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// drainingBridge is the fake bridge whose Close waits for the uploads in
// progress, as the real bridge's does.
type drainingBridge struct {
	*fakeBridge
	wg      sync.WaitGroup
	started chan struct{} // one value per upload that started
}

func (b *drainingBridge) Upload(ctx context.Context, t bridge.Tenant, o *gatewayv1.SubmitOptions, r io.Reader) (*gatewayv1.Document, error) {
	b.wg.Add(1)
	defer b.wg.Done()
	b.started <- struct{}{}
	return b.fakeBridge.Upload(ctx, t, o, r)
}

func (b *drainingBridge) Close(ctx context.Context) error {
	b.wg.Wait()
	return b.fakeBridge.Close(ctx)
}

// TestUploadCutByShutdown: uploads still running shortly before the
// shutdown deadline are cut with Unavailable SHUTTING_DOWN (REST: 503 with
// Retry-After) saying the upload was not stored and may be retried; an
// upload started while the server drains is refused the same way; the
// shutdown keeps its budget.
func TestUploadCutByShutdown(t *testing.T) {
	b := &drainingBridge{fakeBridge: newFakeBridge(), started: make(chan struct{}, 4)}
	h := start(t, func(c *gateway.Config) { c.Bridge = b })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A gRPC upload, stalled after its first 1000 bytes.
	stream, err := h.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain"}, Chunk: make([]byte, 1000)}); err != nil {
		t.Fatal(err)
	}
	// A REST upload, stalled after 1000 of 100000 bytes.
	conn, err := net.Dial("tcp", h.srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/documents:upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n%s", strings.Repeat("x", 1000))
	for range 2 {
		select {
		case <-b.started:
		case <-ctx.Done():
			t.Fatal("the uploads did not start")
		}
	}

	const budget = 4 * time.Second
	began := time.Now()
	shutdownErr := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		shutdownErr <- h.srv.Shutdown(sctx)
	}()

	// While it drains, a new upload is refused.
	for deadline := time.Now().Add(budget / 2); ; {
		code, _, _ := h.do(http.MethodGet, "/healthz", nil)
		if code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/healthz did not turn 503 at shutdown")
		}
	}
	late, err := h.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = late.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{}})
	_, err = late.CloseAndRecv()
	assertShutdownStatus(t, "upload during the drain", err, "accepts no new uploads")

	// The running uploads are cut before the deadline, with a status
	// (RecvMsg waits for it without ending the upload, as CloseAndRecv would).
	err = stream.RecvMsg(new(gatewayv1.Document))
	assertShutdownStatus(t, "gRPC upload", err, "cut after 1000 bytes")
	_ = conn.SetReadDeadline(time.Now().Add(budget))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("REST upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	st := decodeStatus(t, body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || st.reason() != gateway.ReasonShuttingDown ||
		!strings.Contains(st.Message, "shutting down") || !strings.Contains(st.Message, "retry") {
		t.Errorf("REST upload: %d Retry-After %q %s, want 503 SHUTTING_DOWN with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	if err := <-shutdownErr; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if took := time.Since(began); took > budget {
		t.Errorf("shutdown took %v, above its %v budget", took, budget)
	}
}

func assertShutdownStatus(t *testing.T, what string, err error, want string) {
	t.Helper()
	st := status.Convert(err)
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	if st.Code() != codes.Unavailable || reason != gateway.ReasonShuttingDown || !strings.Contains(st.Message(), want) || !strings.Contains(st.Message(), "retry") {
		t.Errorf("%s: %v (reason %q), want Unavailable %s saying %q and retry", what, err, reason, gateway.ReasonShuttingDown, want)
	}
}
