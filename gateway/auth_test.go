package gateway_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// writeTokens writes a token file mapping each token to its tenant.
func writeTokens(t *testing.T, path string, tokens map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# test tokens\n\n")
	for tok, tenant := range tokens {
		b.WriteString(gateway.HashToken(tok) + "\t" + tenant + "   # " + tenant + "'s token\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func TestParseTokenFile(t *testing.T) {
	h := gateway.HashToken("s3cret")
	if !strings.HasPrefix(h, "sha256:") || len(h) != 7+64 {
		t.Fatalf("HashToken = %q, want sha256:<64 hex>", h)
	}
	m, err := gateway.ParseTokenFile([]byte("# c\n\n" + h + " acme # trailing\n" + gateway.HashToken("other") + "\tglobex\n"))
	if err != nil || len(m) != 2 {
		t.Fatalf("parse: %v %v", m, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"s3cret acme", `line 1: the hash must start with "sha256:"`},
		{"sha256:abcd acme", "line 1: the SHA-256 hash must be 64 hex digits"},
		{"sha256:" + strings.Repeat("zz", 32) + " acme", "line 1: the hash is not hex"},
		{"# ok\n" + h, "line 2: want"},
		{h + " acme extra", "line 1: want"},
		{h + " acme/evil", "line 1: tenant"},
		{h + " acme\n" + h + " globex", `line 2: this token hash is already mapped to tenant "acme"`},
	} {
		_, err := gateway.ParseTokenFile([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseTokenFile(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

// TestAuthentication: without a token or with an unknown one every API
// route answers Unauthenticated (REST 401 with WWW-Authenticate: Bearer),
// the operations routes stay open, and a known token reaches the bridge
// as its tenant.
func TestAuthentication(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string]string{"tok-a": "acme"})
	tf, err := gateway.LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Authenticator = tf })
	ctx := context.Background()
	doc := h.fake.add(gatewayv1.State_SUCCEEDED, 5)

	for name, c := range map[string]context.Context{"no token": ctx, "unknown token": bearer(ctx, "tok-b"), "wrong scheme": metadata.AppendToOutgoingContext(ctx, "authorization", "Basic dG9rLWE=")} {
		_, err := h.docs.GetDocument(c, &gatewayv1.GetDocumentRequest{Id: doc.Id})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("gRPC GetDocument, %s: %v, want Unauthenticated", name, err)
		}
		s, err := h.events.SubscribeEvents(c, &gatewayv1.SubscribeEventsRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("gRPC SubscribeEvents, %s: %v, want Unauthenticated", name, err)
		}
	}

	for _, tc := range []struct {
		method, path, auth, wantChallenge string
	}{
		{"GET", "/v1/documents/" + doc.Id, "", `Bearer realm="pipestream"`},
		{"GET", "/v1/documents", "Bearer nope", `Bearer realm="pipestream", error="invalid_token"`},
		{"GET", "/v1/documents/" + doc.Id + ":watch", "", `Bearer realm="pipestream"`},
		{"POST", "/v1/documents:upload", "Bearer nope", `Bearer realm="pipestream", error="invalid_token"`},
		{"GET", "/v1/events:window", "", `Bearer realm="pipestream"`},
	} {
		var hdr []string
		if tc.auth != "" {
			hdr = []string{"Authorization", tc.auth}
		}
		code, rh, body := h.do(tc.method, tc.path, strings.NewReader("x"), hdr...)
		if code != 401 || rh.Get("WWW-Authenticate") != tc.wantChallenge {
			t.Errorf("%s %s (auth %q): HTTP %d WWW-Authenticate %q %s, want 401 %q", tc.method, tc.path, tc.auth, code, rh.Get("WWW-Authenticate"), body, tc.wantChallenge)
			continue
		}
		if st := decodeStatus(t, body); st.Code != int(codes.Unauthenticated) {
			t.Errorf("%s %s: status %+v", tc.method, tc.path, st)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(wctx, "ws"+strings.TrimPrefix(h.base, "http")+"/v1/events/ws", nil)
	if err == nil || resp == nil || resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("WebSocket without a token: %v %v, want a 401 with WWW-Authenticate before the upgrade", resp, err)
	}

	checkOpenRoutes(t, h)

	// The right token gets through, as its tenant.
	if _, err := h.docs.SubmitDocument(bearer(ctx, "tok-a"), &gatewayv1.SubmitDocumentRequest{Content: []byte("x"), ContentType: "text/plain"}); err != nil {
		t.Fatalf("submit with a valid token: %v", err)
	}
	if got := h.fake.lastTenant.Load(); got == nil || *got != "acme" {
		t.Errorf("bridge saw tenant %v, want acme", got)
	}
	code, _, body := h.do("POST", "/v1/documents", strings.NewReader(`{"content":"eA==","contentType":"text/plain"}`), "Authorization", "bearer tok-a")
	if code != 200 {
		t.Errorf("REST submit with a valid token (lower-case scheme): HTTP %d %s", code, body)
	}
}

// checkOpenRoutes: the operations routes (/metrics, /openapi.json,
// /docs/, /healthz, gRPC health and reflection) need no token.
func checkOpenRoutes(t *testing.T, h *harness) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []string{"/metrics", "/openapi.json", "/docs/"} {
		if code, _, body := h.do("GET", p, nil); code != 200 {
			t.Errorf("GET %s without a token: HTTP %d %.200s, want 200", p, code, body)
		}
	}
	if code, _, _ := h.do("GET", "/healthz", nil); code == 401 {
		t.Error("/healthz asks for a token")
	}
	if _, err := healthpb.NewHealthClient(h.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("gRPC health without a token: %v", err)
	}
	rs, err := reflectpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(ctx)
	if err == nil {
		err = rs.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}})
	}
	if err == nil {
		_, err = rs.Recv()
		rs.CloseSend()
	}
	if err != nil {
		t.Errorf("reflection without a token: %v", err)
	}
}

// TestTokenFileReload: a rewritten file takes effect without a restart
// (mtime polling, within one interval and not before), a broken file keeps
// the previous set and is reported once by the poller, and Reload (what
// SIGHUP calls) reports the error. The poller runs on synctest's fake
// clock; Authenticate is called directly so the bubble holds no sockets.
func TestTokenFileReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 20 * time.Millisecond
		path := filepath.Join(t.TempDir(), "tokens")
		writeTokens(t, path, map[string]string{"old": "acme"})
		var logs syncBuffer
		tf, err := gateway.LoadTokenFile(path, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); tf.Watch(ctx, interval) }()
		defer func() { cancel(); <-done }()

		auth := func(tok string) codes.Code {
			_, err := tf.Authenticate(context.Background(), tok)
			return status.Code(err)
		}
		if c := auth("old"); c != codes.OK {
			t.Fatalf("old token: %v", c)
		}
		writeTokens(t, path, map[string]string{"new": "acme", "second-tenant-token": "globex"})
		time.Sleep(interval - time.Nanosecond)
		synctest.Wait()
		if c := auth("new"); c != codes.Unauthenticated {
			t.Errorf("new token before the first poll: %v, want Unauthenticated", c)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait() // the poller's tick is handled
		if c := auth("new"); c != codes.OK {
			t.Fatalf("new token one interval after the rewrite: %v, want OK", c)
		}
		if c := auth("old"); c != codes.Unauthenticated {
			t.Errorf("revoked token: %v, want Unauthenticated", c)
		}

		if err := os.WriteFile(path, []byte("this is not a token file\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := tf.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Reload of a broken file: %v, want an error naming line 1", err)
		}
		time.Sleep(5 * interval) // the poller sees the broken file too
		synctest.Wait()
		if c := auth("new"); c != codes.OK || tf.Len() != 2 {
			t.Errorf("after a broken reload: %v with %d tokens, want the previous 2 still accepted", c, tf.Len())
		}
		// One failure from Reload, one from the poller's first look at the
		// broken file; later polls see no change and stay quiet.
		if n := strings.Count(logs.String(), "token file reload failed"); n != 2 {
			t.Errorf("%d reload failures logged over 5 intervals, want 2 (Reload's and the poller's once):\n%s", n, logs.String())
		}
	})
}

// TestTokenFileEmptyKeepsTokens: a token file caught mid-rewrite (truncated
// to zero bytes) keeps the previous set instead of locking everyone out; a
// file with only a comment revokes every token.
func TestTokenFileEmptyKeepsTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string]string{"old": "acme"})
	tf, err := gateway.LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tf.Reload(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("Reload of an empty file: %v, want an error saying it is empty", err)
	}
	if tf.Len() != 1 {
		t.Errorf("after reloading an empty file: %d tokens, want the previous 1", tf.Len())
	}
	if err := os.WriteFile(path, []byte("# no tokens\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tf.Reload(); err != nil || tf.Len() != 0 {
		t.Errorf("Reload of a comment-only file: %v, %d tokens; want no error and 0 tokens", err, tf.Len())
	}
}

func waitFor(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRefuseNonLoopbackWithoutAuth: docs/architecture.md, "Security and limits".
func TestRefuseNonLoopbackWithoutAuth(t *testing.T) {
	fb := newFakeBridge()
	for _, tc := range []struct {
		grpc, http string
		noAuthOK   bool
		auth       gateway.Authenticator
		wantErr    bool
	}{
		{grpc: "0.0.0.0:0", http: "127.0.0.1:0", wantErr: true},
		{grpc: "127.0.0.1:0", http: ":0", wantErr: true},
		{grpc: "[::]:0", http: "127.0.0.1:0", wantErr: true},
		{grpc: "192.0.2.1:9090", http: "127.0.0.1:0", wantErr: true},
		{grpc: "localhost:0", http: "127.0.0.2:0"},
		{grpc: "[::1]:0", http: "127.0.0.1:0"},
		{grpc: "0.0.0.0:0", http: ":0", noAuthOK: true},
		{grpc: "0.0.0.0:0", http: ":0", auth: gateway.StaticTokens{"t": "acme"}},
	} {
		cfg := gateway.Config{GRPCAddr: tc.grpc, HTTPAddr: tc.http, Bridge: fb, AllowInsecureNoAuth: tc.noAuthOK, Authenticator: tc.auth}
		srv, err := gateway.New(cfg)
		if tc.wantErr {
			if !errors.Is(err, gateway.ErrInsecureListen) || !strings.Contains(err.Error(), "--insecure-no-auth") || !strings.Contains(err.Error(), "--auth-tokens") {
				t.Errorf("grpc %s http %s: %v, want ErrInsecureListen naming --auth-tokens and --insecure-no-auth", tc.grpc, tc.http, err)
			}
			continue
		}
		if err != nil || srv == nil {
			t.Errorf("grpc %s http %s: %v, want it accepted", tc.grpc, tc.http, err)
			continue
		}
		_ = srv.Shutdown(context.Background()) // New starts the gRPC server's stream workers
	}
}
