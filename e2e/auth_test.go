package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestTenants starts a gateway with --auth-tokens (lines made by `gateway
// hash-token`) and checks docs/architecture.md, "Security and limits": no or a wrong bearer token
// is 401 / Unauthenticated, health needs none, and a tenant sees only its
// own documents, claims and events.
func TestTenants(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{"acme": "acme-" + uniq("token"), "globex": "globex-" + uniq("token")}
	var file strings.Builder
	for tenant, tok := range tokens {
		out, errb, code := run(t, clientTimeout, []byte(tok+"\n"), gatewayBinary(t), "hash-token", tenant)
		if code != 0 {
			t.Fatalf("gateway hash-token %s: exit %d: %s", tenant, code, errb)
		}
		if strings.Contains(string(out), tok) {
			t.Fatalf("gateway hash-token printed the token itself: %q", out)
		}
		file.Write(out)
	}
	tokFile := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(tokFile, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, gwOpts{args: []string{"--auth-tokens", tokFile}})
	auth := func(tenant string) []string { return []string{"-H", "Authorization: Bearer " + tokens[tenant]} }
	docs := g.baseURL() + "/v1/documents"

	wantError(t, "no token", curl(t, "GET", docs, nil), 401, int(codes.Unauthenticated), "", "")
	wantError(t, "wrong token", curl(t, "GET", docs, nil, "-H", "Authorization: Bearer not-a-token"), 401, int(codes.Unauthenticated), "", "")
	if r := curl(t, "GET", g.baseURL()+"/healthz", nil); r.status != 200 {
		t.Errorf("/healthz without a token: %s, want 200", r)
	}

	// acme's document.
	body := []byte(`{"content":"` + b64([]byte("acme only")) + `","contentType":"text/plain"}`)
	r := curl(t, "POST", docs, body, append(auth("acme"), "-H", "Content-Type: application/json")...)
	d := docOf(t, "acme submit", r)
	cd := docOf(t, "acme deferred submit", curl(t, "POST", docs, mustJSON(t, deferredDoc([]byte("acme claim"), time.Minute, nil, nil)),
		append(auth("acme"), "-H", "Content-Type: application/json")...))

	// acme sees it; globex does not, not even by id.
	if got := docOf(t, "acme get", curl(t, "GET", docs+"/"+d.GetId(), nil, auth("acme")...)); got.GetId() != d.GetId() {
		t.Errorf("acme GET its document: %v", got)
	}
	wantError(t, "globex GET acme's document", curl(t, "GET", docs+"/"+d.GetId(), nil, auth("globex")...), 404, int(codes.NotFound), "", "")
	wantError(t, "globex result of acme's document", curl(t, "GET", docs+"/"+d.GetId()+"/result", nil, auth("globex")...), 404, int(codes.NotFound), "", "")
	wantError(t, "globex cancels acme's document", curl(t, "POST", docs+"/"+cd.GetId()+":cancel", []byte("{}"), auth("globex")...), 404, int(codes.NotFound), "", "")
	list := &gatewayv1.ListDocumentsResponse{}
	lr := curl(t, "GET", docs, nil, auth("globex")...)
	wantOK(t, "globex list", lr)
	decode(t, lr.body, list)
	if len(list.GetDocuments()) != 0 {
		t.Errorf("globex lists %d documents of acme", len(list.GetDocuments()))
	}

	// Claims are the tenant's too.
	var claim string
	waitFor(t, "acme's claim", 30*time.Second, func() bool {
		got := docOf(t, "acme get", curl(t, "GET", docs+"/"+cd.GetId(), nil, auth("acme")...))
		if len(got.GetClaimChecks()) > 0 {
			claim = got.GetClaimChecks()[0].GetClaimId()
		}
		return claim != ""
	})
	wantError(t, "globex GET acme's claim", curl(t, "GET", g.baseURL()+"/v1/claims/"+claim, nil, auth("globex")...), 404, int(codes.NotFound), "", "")
	wantError(t, "globex redeems acme's claim", curl(t, "POST", g.baseURL()+"/v1/claims/"+claim+":redeem", []byte("{}"), auth("globex")...), 404, int(codes.NotFound), "", "")

	// Events: globex's log view has nothing of acme.
	evr := curlStream(t, g.baseURL()+"/v1/events:subscribe?cursor=0", time.Second)
	if evr.status != 401 {
		t.Errorf("event stream without a token: HTTP %d, want 401", evr.status)
	}
	_ = docOf(t, "globex submit", curl(t, "POST", docs, body, append(auth("globex"), "-H", "Content-Type: application/json")...))
	for _, ev := range events(t, curlStreamAuth(t, g.baseURL()+"/v1/events:subscribe?cursor=0", time.Second, auth("globex"))) {
		if ev.GetDocumentId() == d.GetId() || ev.GetDocumentId() == cd.GetId() {
			t.Errorf("globex's event stream shows acme's event %v", ev)
		}
	}

	// gRPC and the CLI carry the token as authorization metadata.
	c := dialGRPC(t, g)
	if _, err := c.docs.GetDocument(ctxT(t, 10*time.Second), &gatewayv1.GetDocumentRequest{Id: d.GetId()}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC without a token: %v, want Unauthenticated", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tokens["acme"])
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if got, err := c.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: d.GetId()}); err != nil || got.GetId() != d.GetId() {
		t.Errorf("gRPC with acme's token: %v, %v", got, err)
	}
	if out, errb, code := cli(t, g, "get", "--token", tokens["acme"], d.GetId()); code != 0 || !strings.Contains(string(out), d.GetId()) {
		t.Errorf("gateway get --token: exit %d\n%s%s", code, out, errb)
	}
	if _, errb, code := cli(t, g, "get", "--token", tokens["globex"], d.GetId()); code == 0 || !strings.Contains(string(errb), "NotFound") {
		t.Errorf("gateway get --token (other tenant): exit %d, stderr %q; want NotFound", code, errb)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	r := curlJSONBody(t, v)
	return r
}
