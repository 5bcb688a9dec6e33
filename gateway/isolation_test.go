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
	h, acme, globex := startTwoTenants(t)

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

	iso := &isolation{h: h, acme: acme, globex: globex, a1: a1, a2: a2, g1: g1}
	t.Run("grpc", func(t *testing.T) {
		iso.grpcNotFound(t)
		iso.grpcLists(t)
		iso.grpcSubscription(t)
	})
	t.Run("rest", func(t *testing.T) {
		iso.restNotFound(t)
		iso.restSubscription(t)
	})
	t.Run("websocket", iso.websocket)
}

// isolation is TestTenantIsolation's server and documents: acme owns a1
// (submitted) and a2 (uploaded), globex owns g1; acme and globex are
// contexts carrying their bearer tokens.
type isolation struct {
	h            *harness
	acme, globex context.Context
	a1, a2, g1   *gatewayv1.Document
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) != codes.NotFound {
		t.Errorf("%s of another tenant's id: %v, want NotFound", what, err)
	}
}

// grpcNotFound: every gRPC call on another tenant's id answers NotFound,
// and the owner's document is untouched.
func (iso *isolation) grpcNotFound(t *testing.T) {
	for _, id := range []string{iso.a1.Id, iso.a2.Id} {
		_, err := iso.h.docs.GetDocument(iso.globex, &gatewayv1.GetDocumentRequest{Id: id})
		wantNotFound(t, "GetDocument", err)
		rs, err := iso.h.docs.GetDocumentResult(iso.globex, &gatewayv1.GetDocumentResultRequest{Id: id})
		if err == nil {
			_, err = rs.Recv()
		}
		wantNotFound(t, "GetDocumentResult", err)
		_, err = iso.h.docs.CancelDocument(iso.globex, &gatewayv1.CancelDocumentRequest{Id: id})
		wantNotFound(t, "CancelDocument", err)
		w, err := iso.h.docs.WatchDocument(iso.globex, &gatewayv1.WatchDocumentRequest{Id: id})
		if err == nil {
			_, err = w.Recv()
		}
		wantNotFound(t, "WatchDocument", err)
	}
	_, err := iso.h.docs.GetDocument(iso.acme, &gatewayv1.GetDocumentRequest{Id: iso.g1.Id})
	wantNotFound(t, "GetDocument (acme reading globex)", err)
	_, err = iso.h.docs.GetClaimCheck(iso.globex, &gatewayv1.GetClaimCheckRequest{ClaimId: "12345"})
	wantNotFound(t, "GetClaimCheck", err)
	_, err = iso.h.docs.RedeemClaimCheck(iso.globex, &gatewayv1.RedeemClaimCheckRequest{ClaimId: "12345"})
	wantNotFound(t, "RedeemClaimCheck", err)

	// The owner still has them (the cancel above did nothing).
	if d, err := iso.h.docs.GetDocument(iso.acme, &gatewayv1.GetDocumentRequest{Id: iso.a1.Id}); err != nil || d.State != gatewayv1.State_PENDING {
		t.Errorf("owner's GetDocument: %v %v, want PENDING", d, err)
	}

}

// grpcLists: ListDocuments and GetSnapshot show each tenant exactly its
// own documents.
func (iso *isolation) grpcLists(t *testing.T) {
	for ctx, want := range map[context.Context][]string{iso.acme: {iso.a1.Id, iso.a2.Id}, iso.globex: {iso.g1.Id}} {
		l, err := iso.h.docs.ListDocuments(ctx, &gatewayv1.ListDocumentsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := docIDs(l.Documents); !sameSet(got, want) {
			t.Errorf("ListDocuments = %v, want exactly %v", got, want)
		}
		snap, err := iso.h.events.GetSnapshot(ctx, &gatewayv1.GetSnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := docIDs(snap.Documents); !sameSet(got, want) {
			t.Errorf("GetSnapshot = %v, want exactly %v", got, want)
		}
	}

}

// grpcSubscription: the whole log from cursor 0 for a second carries
// globex's events only, though acme's come before and after them in seq
// order.
func (iso *isolation) grpcSubscription(t *testing.T) {
	sctx, cancel := context.WithTimeout(iso.globex, time.Second)
	defer cancel()
	cur := uint64(0)
	s, err := iso.h.events.SubscribeEvents(sctx, &gatewayv1.SubscribeEventsRequest{Cursor: &cur})
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
		if ev.DocumentId != iso.g1.Id {
			t.Errorf("globex received event %d of document %s", ev.Seq, ev.DocumentId)
		}
	}
	if n == 0 {
		t.Error("globex received none of its own events")
	}
}

// restNotFound: every REST route on another tenant's id answers 404; list
// and snapshot show globex only its own document.
func (iso *isolation) restNotFound(t *testing.T) {
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/documents/" + iso.a1.Id},
		{"GET", "/v1/documents/" + iso.a1.Id + "/result"},
		{"POST", "/v1/documents/" + iso.a1.Id + ":cancel"},
		{"GET", "/v1/documents/" + iso.a1.Id + ":watch"},
		{"GET", "/v1/claims/12345"},
		{"POST", "/v1/claims/12345:redeem"},
	} {
		code, _, body := iso.h.do(r.method, r.path, strings.NewReader("{}"), as("tok-globex")...)
		if code != 404 {
			t.Errorf("%s %s as another tenant: HTTP %d %s, want 404", r.method, r.path, code, body)
		}
	}
	code, _, body := iso.h.do("GET", "/v1/documents", nil, as("tok-globex")...)
	var list struct{ Documents []struct{ Id string } }
	if err := json.Unmarshal(body, &list); code != 200 || err != nil || len(list.Documents) != 1 || list.Documents[0].Id != iso.g1.Id {
		t.Errorf("REST list as globex: HTTP %d %s, want only %s", code, body, iso.g1.Id)
	}
	code, _, body = iso.h.do("GET", "/v1/events:snapshot", nil, as("tok-globex")...)
	if code != 200 || strings.Contains(string(body), iso.a1.Id) || strings.Contains(string(body), iso.a2.Id) || !strings.Contains(string(body), iso.g1.Id) {
		t.Errorf("REST snapshot as globex: HTTP %d %s", code, body)
	}
}

// restSubscription: globex's NDJSON subscription from cursor 0 shows its
// document and no acme id before it (acme's events come first in seq
// order).
func (iso *isolation) restSubscription(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", iso.h.base+"/v1/events:subscribe?cursor=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-globex")
	resp, err := iso.h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(seen.String(), iso.g1.Id) {
		n, err := resp.Body.Read(buf)
		seen.Write(buf[:n])
		if err != nil {
			t.Fatalf("NDJSON subscription ended before globex's event: %v: %s", err, seen.String())
		}
	}
	if s := seen.String(); strings.Contains(s, iso.a1.Id) || strings.Contains(s, iso.a2.Id) {
		t.Errorf("globex's NDJSON stream carries acme's documents: %s", s)
	}
}

// websocket: each tenant's WebSocket from cursor 0 starts with its own
// document's event.
func (iso *isolation) websocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := map[string][]string{"Authorization": {"Bearer tok-globex"}}
	c, _, err := websocket.Dial(ctx, "ws://"+iso.h.srv.HTTPAddr()+"/v1/events/ws?cursor=0", &websocket.DialOptions{HTTPClient: iso.h.http, HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	f, err := readFrame(t, c)
	if err != nil || f.Op != 1 || f.Payload["documentId"] != iso.g1.Id {
		t.Fatalf("globex's first WebSocket frame %v %v %v, want an event of %s", f.Header, f.Payload, err, iso.g1.Id)
	}
	// acme over WebSocket sees acme's first.
	ca, _, err := websocket.Dial(ctx, "ws://"+iso.h.srv.HTTPAddr()+"/v1/events/ws?cursor=0", &websocket.DialOptions{HTTPClient: iso.h.http, HTTPHeader: map[string][]string{"Authorization": {"Bearer tok-acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.CloseNow()
	if f, err := readFrame(t, ca); err != nil || f.Payload["documentId"] != iso.a1.Id {
		t.Fatalf("acme's first WebSocket frame %v %v, want an event of %s", f.Payload, err, iso.a1.Id)
	}
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

// startTwoTenants starts the gateway over the real bridge (SQLite store,
// event log; its peer is unreachable, so documents stay PENDING) behind a
// token file with tenants acme and globex, and returns the harness with a
// context carrying each tenant's token.
func startTwoTenants(t *testing.T) (h *harness, acme, globex context.Context) {
	t.Helper()
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
	h = start(t, func(c *gateway.Config) { c.Bridge = b; c.Authenticator = tf })
	bg := context.Background()
	return h, bearer(bg, "tok-acme"), bearer(bg, "tok-globex")
}
