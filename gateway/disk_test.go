package gateway_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestLowDisk: below MinFreeDiskBytes in DataDir, /healthz answers 503
// "low disk" and new documents (JSON, upload, gRPC) are refused with 503 /
// ResourceExhausted, reason DISK_FULL and Retry-After, while reads still
// work; with room, the same gateway is healthy.
func TestLowDisk(t *testing.T) {
	low := start(t, func(c *gateway.Config) { c.DataDir = t.TempDir(); c.MinFreeDiskBytes = 1 << 62 })
	doc := low.fake.add(gatewayv1.State_SUCCEEDED, 1)
	code, _, body := low.do("GET", "/healthz", nil)
	if code != 503 || !strings.Contains(string(body), "low disk") {
		t.Errorf("/healthz on a low disk: HTTP %d %s, want 503 low disk", code, body)
	}
	code, hdr, body := low.do("POST", "/v1/documents", strings.NewReader(`{"content":"aGk="}`), "Content-Type", "application/json")
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "DISK_FULL") || !strings.Contains(string(body), "disk full") {
		t.Errorf("submit on a low disk: HTTP %d Retry-After %q %s, want 503 DISK_FULL with Retry-After", code, hdr.Get("Retry-After"), body)
	}
	code, _, body = low.do("POST", "/v1/documents:upload", strings.NewReader("hello"), "Content-Type", "text/plain")
	if code != 503 || !strings.Contains(string(body), "DISK_FULL") {
		t.Errorf("upload on a low disk: HTTP %d %s", code, body)
	}
	_, err := low.docs.SubmitDocument(context.Background(), &gatewayv1.SubmitDocumentRequest{Content: []byte("hi")})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "disk full") {
		t.Errorf("gRPC submit on a low disk: %v, want ResourceExhausted disk full", err)
	}
	if code, _, _ := low.do("GET", "/v1/documents/"+doc.Id, nil); code != 200 {
		t.Errorf("a read on a low disk: HTTP %d, want 200", code)
	}

	ok := start(t, func(c *gateway.Config) { c.DataDir = t.TempDir(); c.MinFreeDiskBytes = 1 })
	if code, _, body := ok.do("GET", "/healthz", nil); code != 200 {
		t.Errorf("/healthz with room: HTTP %d %s", code, body)
	}
}
