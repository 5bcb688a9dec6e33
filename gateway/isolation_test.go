package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestTenantIsolation runs the real bridge (SQLite store, event log; its
// peer is unreachable, so documents stay PENDING) behind a token file with
// two tenants, and checks every route over gRPC, REST and WebSocket: a
// tenant sees only its own documents and events, and another tenant's ids
// answer NotFound (never PermissionDenied, which would confirm that the id
// exists). Claim checks need a live peer; cmd/gateway's
// TestClaimIsolationOverMutualTLS covers them.
func TestTenantIsolation(t *testing.T) {
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
	bg := context.Background()
	acme, globex := bearer(bg, "tok-acme"), bearer(bg, "tok-globex")

	submit := func(ctx context.Context, content string) *gatewayv1.Document {
		t.Helper()
		d, err := h.docs.SubmitDocument(ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte(content), ContentType: "text/plain"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a1 := submit(acme, "acme one")
	g1 := submit(globex, "globex one")
	up, err := h.docs.UploadDocument(acme)
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain"}, Chunk: []byte("acme two")}); err != nil {
		t.Fatal(err)
	}
	a2, err := up.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("grpc", func(t *testing.T) {
		wantNotFound := func(what string, err error) {
			t.Helper()
			if status.Code(err) != codes.NotFound {
				t.Errorf("%s of another tenant's id: %v, want NotFound", what, err)
			}
		}
		for _, id := range []string{a1.Id, a2.Id} {
			_, err := h.docs.GetDocument(globex, &gatewayv1.GetDocumentRequest{Id: id})
			wantNotFound("GetDocument", err)
			rs, err := h.docs.GetDocumentResult(globex, &gatewayv1.GetDocumentResultRequest{Id: id})
			if err == nil {
				_, err = rs.Recv()
			}
			wantNotFound("GetDocumentResult", err)
			_, err = h.docs.CancelDocument(globex, &gatewayv1.CancelDocumentRequest{Id: id})
			wantNotFound("CancelDocument", err)
			w, err := h.docs.WatchDocument(globex, &gatewayv1.WatchDocumentRequest{Id: id})
			if err == nil {
				_, err = w.Recv()
			}
			wantNotFound("WatchDocument", err)
		}
		_, err := h.docs.GetDocument(acme, &gatewayv1.GetDocumentRequest{Id: g1.Id})
		wantNotFound("GetDocument (acme reading globex)", err)
		_, err = h.docs.GetClaimCheck(globex, &gatewayv1.GetClaimCheckRequest{ClaimId: "12345"})
		wantNotFound("GetClaimCheck", err)
		_, err = h.docs.RedeemClaimCheck(globex, &gatewayv1.RedeemClaimCheckRequest{ClaimId: "12345"})
		wantNotFound("RedeemClaimCheck", err)

		// The owner still has them (the cancel above did nothing).
		if d, err := h.docs.GetDocument(acme, &gatewayv1.GetDocumentRequest{Id: a1.Id}); err != nil || d.State != gatewayv1.State_PENDING {
			t.Errorf("owner's GetDocument: %v %v, want PENDING", d, err)
		}

		for ctx, want := range map[context.Context][]string{acme: {a1.Id, a2.Id}, globex: {g1.Id}} {
			l, err := h.docs.ListDocuments(ctx, &gatewayv1.ListDocumentsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := docIDs(l.Documents); !sameSet(got, want) {
				t.Errorf("ListDocuments = %v, want exactly %v", got, want)
			}
			snap, err := h.events.GetSnapshot(ctx, &gatewayv1.GetSnapshotRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := docIDs(snap.Documents); !sameSet(got, want) {
				t.Errorf("GetSnapshot = %v, want exactly %v", got, want)
			}
		}

		// The whole log from cursor 0 for a second: globex's events only,
		// though acme's come before and after them in seq order.
		sctx, cancel := context.WithTimeout(globex, time.Second)
		defer cancel()
		cur := uint64(0)
		s, err := h.events.SubscribeEvents(sctx, &gatewayv1.SubscribeEventsRequest{Cursor: &cur})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			ev, err := s.Recv()
			if err != nil {
				if status.Code(err) != codes.DeadlineExceeded {
					t.Errorf("subscription ended with %v", err)
				}
				break
			}
			n++
			if ev.DocumentId != g1.Id {
				t.Errorf("globex received event %d of document %s", ev.Seq, ev.DocumentId)
			}
		}
		if n == 0 {
			t.Error("globex received none of its own events")
		}
	})

	t.Run("rest", func(t *testing.T) {
		as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
		for _, r := range []struct{ method, path string }{
			{"GET", "/v1/documents/" + a1.Id},
			{"GET", "/v1/documents/" + a1.Id + "/result"},
			{"POST", "/v1/documents/" + a1.Id + ":cancel"},
			{"GET", "/v1/documents/" + a1.Id + ":watch"},
			{"GET", "/v1/claims/12345"},
			{"POST", "/v1/claims/12345:redeem"},
		} {
			code, _, body := h.do(r.method, r.path, strings.NewReader("{}"), as("tok-globex")...)
			if code != 404 {
				t.Errorf("%s %s as another tenant: HTTP %d %s, want 404", r.method, r.path, code, body)
			}
		}
		code, _, body := h.do("GET", "/v1/documents", nil, as("tok-globex")...)
		var list struct{ Documents []struct{ Id string } }
		if err := json.Unmarshal(body, &list); code != 200 || err != nil || len(list.Documents) != 1 || list.Documents[0].Id != g1.Id {
			t.Errorf("REST list as globex: HTTP %d %s, want only %s", code, body, g1.Id)
		}
		code, _, body = h.do("GET", "/v1/events:snapshot", nil, as("tok-globex")...)
		if code != 200 || strings.Contains(string(body), a1.Id) || strings.Contains(string(body), a2.Id) || !strings.Contains(string(body), g1.Id) {
			t.Errorf("REST snapshot as globex: HTTP %d %s", code, body)
		}
		// NDJSON subscription: read until globex's document shows up; no
		// acme id may appear before (acme's events come first in seq order).
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/events:subscribe?cursor=0", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok-globex")
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var seen bytes.Buffer
		buf := make([]byte, 4096)
		for !strings.Contains(seen.String(), g1.Id) {
			n, err := resp.Body.Read(buf)
			seen.Write(buf[:n])
			if err != nil {
				t.Fatalf("NDJSON subscription ended before globex's event: %v: %s", err, seen.String())
			}
		}
		if s := seen.String(); strings.Contains(s, a1.Id) || strings.Contains(s, a2.Id) {
			t.Errorf("globex's NDJSON stream carries acme's documents: %s", s)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		hdr := map[string][]string{"Authorization": {"Bearer tok-globex"}}
		c, _, err := websocket.Dial(ctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws?cursor=0", &websocket.DialOptions{HTTPClient: h.http, HTTPHeader: hdr})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		f, err := readFrame(t, c)
		if err != nil || f.Op != 1 || f.Payload["documentId"] != g1.Id {
			t.Fatalf("globex's first WebSocket frame %v %v %v, want an event of %s", f.Header, f.Payload, err, g1.Id)
		}
		// acme over WebSocket sees acme's first.
		ca, _, err := websocket.Dial(ctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws?cursor=0", &websocket.DialOptions{HTTPClient: h.http, HTTPHeader: map[string][]string{"Authorization": {"Bearer tok-acme"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer ca.CloseNow()
		if f, err := readFrame(t, ca); err != nil || f.Payload["documentId"] != a1.Id {
			t.Fatalf("acme's first WebSocket frame %v %v, want an event of %s", f.Payload, err, a1.Id)
		}
	})
}

func docIDs(ds []*gatewayv1.Document) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Id)
	}
	return out
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x]--; m[x] < 0 {
			return false
		}
	}
	return true
}
