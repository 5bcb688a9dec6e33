package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// getTicket asks POST /v1/events:ticket with the given headers and returns
// the HTTP status and the ticket.
func getTicket(t *testing.T, h *harness, hdr ...string) (int, string) {
	t.Helper()
	code, _, b := h.do("POST", "/v1/events:ticket", strings.NewReader("{}"), hdr...)
	if code != http.StatusOK {
		return code, ""
	}
	var body struct {
		Ticket           string `json:"ticket"`
		ExpiresInSeconds int    `json:"expiresInSeconds"`
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Ticket == "" || body.ExpiresInSeconds != 30 {
		t.Fatalf("ticket answer %s (%v), want {ticket, expiresInSeconds: 30}", b, err)
	}
	return code, body.Ticket
}

// dialTicket opens the WebSocket with ?ticket= and no Authorization
// header, as a browser does; it returns the HTTP status of a refusal.
func dialTicket(t *testing.T, h *harness, query string) (*websocket.Conn, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws"+query, &websocket.DialOptions{HTTPClient: h.http})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		var body struct{ Error string }
		if resp.Body != nil {
			_ = json.NewDecoder(resp.Body).Decode(&body)
		}
		return nil, resp.StatusCode, body.Error
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, http.StatusSwitchingProtocols, ""
}

// TestWebSocketTicketNoAuth: in loopback mode (no tokens) a ticket needs
// no header and opens the stream; it is single use; a wrong ticket is 401.
func TestWebSocketTicketNoAuth(t *testing.T) {
	h := start(t, nil)
	code, tk := getTicket(t, h)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/events:ticket without tokens: HTTP %d, want 200", code)
	}
	c, code, _ := dialTicket(t, h, "?cursor=18&ticket="+tk)
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade with a ticket: HTTP %d, want 101", code)
	}
	if f, err := readFrame(t, c); err != nil || f.Payload["seq"] != int64(18) {
		t.Fatalf("first frame %v, %v; want seq 18 (the cursor passed along with the ticket)", f.Payload, err)
	}
	if _, code, name := dialTicket(t, h, "?ticket="+tk); code != http.StatusUnauthorized || name != gateway.ReasonInvalidTicket {
		t.Errorf("second use of a ticket: HTTP %d %q, want 401 %s", code, name, gateway.ReasonInvalidTicket)
	}
	if _, code, name := dialTicket(t, h, "?ticket=AAAA"); code != http.StatusUnauthorized || name != gateway.ReasonInvalidTicket {
		t.Errorf("wrong ticket: HTTP %d %q, want 401 %s", code, name, gateway.ReasonInvalidTicket)
	}
	if code, _, _ := h.do("GET", "/v1/events:ticket", nil); code == http.StatusOK {
		t.Errorf("GET /v1/events:ticket answered 200; tickets are POST only")
	}
}

// TestWebSocketTicketTenants: with tokens, a ticket needs a valid token,
// and the stream it opens is its tenant's: acme's ticket never shows
// globex's events though they come first in the log.
func TestWebSocketTicketTenants(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir: t.TempDir(), PeerAddr: "127.0.0.1:9", PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string]string{"tok-acme": "acme", "tok-globex": "globex"})
	tf, err := gateway.LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b; c.Authenticator = tf })

	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}} {
		code, _, body := h.do("POST", "/v1/events:ticket", nil, hdr...)
		if code != http.StatusUnauthorized {
			t.Errorf("ticket with %v: HTTP %d %s, want 401", hdr, code, body)
		}
	}
	if _, code, _ := dialTicket(t, h, "?cursor=0"); code != http.StatusUnauthorized {
		t.Errorf("WebSocket with neither token nor ticket: HTTP %d, want 401", code)
	}

	bg := context.Background()
	g1, err := h.docs.SubmitDocument(bearer(bg, "tok-globex"), &gatewayv1.SubmitDocumentRequest{Content: []byte("globex"), ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	a1, err := h.docs.SubmitDocument(bearer(bg, "tok-acme"), &gatewayv1.SubmitDocumentRequest{Content: []byte("acme"), ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	_, tk := getTicket(t, h, "Authorization", "Bearer tok-acme")
	if tk == "" {
		t.Fatal("no ticket for acme's token")
	}
	c, code, _ := dialTicket(t, h, "?cursor=0&ticket="+tk)
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("acme's ticket: HTTP %d, want 101", code)
	}
	for {
		f, err := readFrame(t, c)
		if err != nil {
			t.Fatalf("acme's stream ended before acme's document: %v", err)
		}
		doc := f.Payload["documentId"]
		if doc == g1.Id {
			t.Fatalf("acme's ticket streams globex's event %v", f.Payload)
		}
		if doc == a1.Id {
			break
		}
	}
	if _, code, _ := dialTicket(t, h, "?cursor=0&ticket="+tk); code != http.StatusUnauthorized {
		t.Errorf("acme's ticket reused: HTTP %d, want 401", code)
	}
}

// TestWebSocketTicketRevalidated: the upgrade authenticates the ticket's
// token again, so a token removed from the token file, or now mapped to
// another tenant, makes its outstanding tickets worthless.
func TestWebSocketTicketRevalidated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string]string{"tok-acme": "acme", "tok-globex": "globex"})
	tf, err := gateway.LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Authenticator = tf })
	acme := []string{"Authorization", "Bearer tok-acme"}
	_, kept := getTicket(t, h, acme...)
	_, moved := getTicket(t, h, acme...)
	_, revoked := getTicket(t, h, "Authorization", "Bearer tok-globex")
	if kept == "" || moved == "" || revoked == "" {
		t.Fatal("no tickets")
	}
	if _, code, _ := dialTicket(t, h, "?cursor=18&ticket="+kept); code != http.StatusSwitchingProtocols {
		t.Fatalf("a ticket of an unchanged token: HTTP %d, want 101", code)
	}

	// tok-acme now belongs to tenant other; tok-globex is gone.
	writeTokens(t, path, map[string]string{"tok-acme": "other"})
	if err := tf.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, code, name := dialTicket(t, h, "?cursor=18&ticket="+moved); code != http.StatusUnauthorized || name != gateway.ReasonInvalidTicket {
		t.Errorf("ticket whose token moved to another tenant: HTTP %d %q, want 401 %s", code, name, gateway.ReasonInvalidTicket)
	}
	if _, code, name := dialTicket(t, h, "?cursor=18&ticket="+revoked); code != http.StatusUnauthorized || name != gateway.ReasonInvalidTicket {
		t.Errorf("ticket of a removed token: HTTP %d %q, want 401 %s", code, name, gateway.ReasonInvalidTicket)
	}
}

// TestWebSocketTicketForeignOrigin: a handshake with a ticket from a page
// of a foreign origin is refused 403 before the ticket is looked at, so
// the ticket still opens the socket from the gateway's own page (issue
// 22: the refused handshake used to spend it).
func TestWebSocketTicketForeignOrigin(t *testing.T) {
	h := start(t, nil)
	_, tk := getTicket(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws?ticket="+tk, &websocket.DialOptions{
		HTTPClient: h.http, HTTPHeader: http.Header{"Origin": {"https://evil.example"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("handshake from a foreign origin: %v %v, want 403", resp, err)
	}
	if _, code, name := dialTicket(t, h, "?ticket="+tk); code != http.StatusSwitchingProtocols {
		t.Errorf("the same ticket afterwards: HTTP %d %q, want 101: the refused handshake must not spend it", code, name)
	}
}
