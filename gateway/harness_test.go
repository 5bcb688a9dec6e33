package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	goleak.VerifyTestMain(m)
}

// syncBuffer collects log output from concurrent handlers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	t      *testing.T
	srv    *gateway.Server
	fake   *fakeBridge
	conn   *grpc.ClientConn
	docs   gatewayv1.DocumentServiceClient
	events gatewayv1.EventServiceClient
	base   string
	http   *http.Client
	logs   *syncBuffer
}

// start runs a Server over the fake bridge on 127.0.0.1:0 listeners with a
// real gRPC client and a real HTTP client.
func start(t *testing.T, mutate func(*gateway.Config)) *harness {
	t.Helper()
	h := &harness{t: t, fake: newFakeBridge(), logs: &syncBuffer{}}
	cfg := gateway.Config{
		GRPCAddr: "127.0.0.1:0",
		HTTPAddr: "127.0.0.1:0",
		Bridge:   h.fake,
		Logger:   slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	h.conn, err = grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.docs = gatewayv1.NewDocumentServiceClient(h.conn)
	h.events = gatewayv1.NewEventServiceClient(h.conn)
	h.base = "http://" + srv.HTTPAddr()
	h.http = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		h.conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		h.http.CloseIdleConnections()
	})
	return h
}

// do sends an HTTP request and returns status, headers and body.
func (h *harness) do(method, path string, body io.Reader, hdr ...string) (int, http.Header, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.http.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// rpcStatus is the JSON google.rpc.Status grpc-gateway writes.
type rpcStatus struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type   string `json:"@type"`
		Reason string `json:"reason"`
		Domain string `json:"domain"`
	} `json:"details"`
}

func decodeStatus(t *testing.T, b []byte) rpcStatus {
	t.Helper()
	// Streaming routes wrap the status: {"error": {...}} (grpc-gateway).
	var wrapped struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &wrapped) == nil && len(wrapped.Error) > 0 {
		b = wrapped.Error
	}
	var st rpcStatus
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("error body is not a JSON google.rpc.Status: %v: %s", err, b)
	}
	if st.Message == "" {
		t.Fatalf("error body has no message: %s", b)
	}
	return st
}

func (st rpcStatus) reason() string {
	for _, d := range st.Details {
		if strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") {
			return d.Reason
		}
	}
	return ""
}
