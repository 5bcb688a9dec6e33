package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestInvalidUTF8Answers400: a path id, query value or upload Content-Type
// that is not UTF-8 would make the REST proxy's request message
// unmarshalable (500 "string field contains invalid UTF-8"); each answers
// 400 INVALID_ARGUMENT naming the part to fix.
func TestInvalidUTF8Answers400(t *testing.T) {
	h := start(t, nil)
	tests := []struct {
		name, method, path, contentType, body, wantMsg string
	}{
		{"path id", "GET", "/v1/documents/%87", "", "", "URL path"},
		{"result path id", "GET", "/v1/documents/%87/result", "", "", "URL path"},
		{"claim id", "POST", "/v1/claims/%87:redeem", "application/json", "{}", "URL path"},
		{"page token", "GET", "/v1/documents?pageToken=%C0", "", "", `"pageToken"`},
		{"query name", "GET", "/v1/documents?%C0=1", "", "", "query parameter name"},
		{"upload content type", "POST", "/v1/documents:upload", "\x91", "hello", "Content-Type"},
		{"upload query", "POST", "/v1/documents:upload?displayName=%FF", "text/plain", "hello", `"displayName"`},
		{"websocket query", "GET", "/v1/events/ws?documentId=%C0", "", "", `"documentId"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.contentType != "" {
				hdr = []string{"Content-Type", tc.contentType}
			}
			var body *strings.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			var code int
			var b []byte
			if body != nil {
				code, _, b = h.do(tc.method, tc.path, body, hdr...)
			} else {
				code, _, b = h.do(tc.method, tc.path, nil, hdr...)
			}
			if code != http.StatusBadRequest {
				t.Fatalf("HTTP %d, want 400: %s", code, b)
			}
			st := decodeStatus(t, b)
			if st.Code != int(codes.InvalidArgument) {
				t.Errorf("code %d, want 3 (INVALID_ARGUMENT): %s", st.Code, b)
			}
			for _, want := range []string{"not valid UTF-8", tc.wantMsg} {
				if !strings.Contains(st.Message, want) {
					t.Errorf("message %q does not say %q", st.Message, want)
				}
			}
		})
	}
	// Valid UTF-8 beyond ASCII still passes.
	if code, _, b := h.do("GET", "/v1/documents/%C3%A9t%C3%A9", nil); code != http.StatusNotFound {
		t.Errorf("GET /v1/documents/été: HTTP %d, want 404: %s", code, b)
	}
}

// TestGRPCInvalidUTF8 calls the gRPC handlers in-process (no codec on the
// way, so invalid UTF-8 reaches them): requests are refused with
// InvalidArgument naming the field, and no status message leaves with
// invalid UTF-8.
func TestGRPCInvalidUTF8(t *testing.T) {
	ui, _ := gateway.UTF8Interceptors()
	reached := false
	handler := func(ctx context.Context, req any) (any, error) {
		reached = true
		return nil, status.Error(codes.NotFound, "document \x87 not found")
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/pipestream.gateway.v1.DocumentService/SubmitDocument"}
	req := &gatewayv1.SubmitDocumentRequest{Content: []byte("x"), Metadata: map[string]string{"owner": "al\xc0ce"}}
	_, err := ui(context.Background(), req, info, handler)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "field metadata[owner]") || reached {
		t.Fatalf("invalid metadata value: %v (handler reached: %v), want InvalidArgument naming metadata[owner]", err, reached)
	}
	_, err = ui(context.Background(), &gatewayv1.GetDocumentRequest{Id: "ok"}, info, handler)
	if status.Code(err) != codes.NotFound || !reached {
		t.Fatalf("valid request: %v, want the handler's NotFound", err)
	}
	if msg := status.Convert(err).Message(); msg != "document \uFFFD not found" {
		t.Errorf("status message %q, want the invalid byte replaced by U+FFFD", msg)
	}
}
