package gateway_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestOperationsTenantIsolation: google.longrunning.Operations over the
// real bridge (peer unreachable, so documents stay PENDING) behind two
// tenants: a tenant gets, lists, waits for and cancels only its own
// documents' operations; another tenant's are NotFound over gRPC and REST,
// and no token is Unauthenticated.
func TestOperationsTenantIsolation(t *testing.T) {
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
	d, err := h.docs.SubmitDocument(acme, &gatewayv1.SubmitDocumentRequest{Content: []byte("acme's"), ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	ops := longrunningpb.NewOperationsClient(h.conn)
	name := "operations/" + d.GetId()

	op, err := ops.GetOperation(acme, &longrunningpb.GetOperationRequest{Name: name})
	if err != nil || op.GetName() != name || op.GetDone() {
		t.Fatalf("GetOperation as the owner: %v, %v; want %s not done", op, err, name)
	}
	var meta gatewayv1.Document
	if err := op.GetMetadata().UnmarshalTo(&meta); err != nil || meta.GetId() != d.GetId() || meta.GetState() != gatewayv1.State_PENDING {
		t.Fatalf("metadata: %v (%v); want the PENDING document", &meta, err)
	}
	// WaitOperation with a short timeout returns the operation, not done.
	op, err = ops.WaitOperation(acme, &longrunningpb.WaitOperationRequest{Name: name, Timeout: durationpb.New(1)})
	if err != nil || op.GetDone() {
		t.Fatalf("WaitOperation(1ns): %v, %v; want the operation not done", op, err)
	}

	for what, call := range map[string]func(context.Context) error{
		"GetOperation": func(ctx context.Context) error {
			_, err := ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
			return err
		},
		"WaitOperation": func(ctx context.Context) error {
			_, err := ops.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: name})
			return err
		},
		"CancelOperation": func(ctx context.Context) error {
			_, err := ops.CancelOperation(ctx, &longrunningpb.CancelOperationRequest{Name: name})
			return err
		},
	} {
		if c := status.Code(call(globex)); c != codes.NotFound {
			t.Errorf("%s of another tenant's operation: %v, want NotFound", what, c)
		}
		if c := status.Code(call(bg)); c != codes.Unauthenticated {
			t.Errorf("%s without a token: %v, want Unauthenticated", what, c)
		}
	}
	list, err := ops.ListOperations(globex, &longrunningpb.ListOperationsRequest{})
	if err != nil || len(list.GetOperations()) != 0 {
		t.Fatalf("ListOperations as another tenant: %v, %v; want none", list, err)
	}
	list, err = ops.ListOperations(acme, &longrunningpb.ListOperationsRequest{Name: "operations"})
	if err != nil || len(list.GetOperations()) != 1 || list.GetOperations()[0].GetName() != name {
		t.Fatalf("ListOperations as the owner: %v, %v; want [%s]", list, err, name)
	}
	if _, err := ops.DeleteOperation(acme, &longrunningpb.DeleteOperationRequest{Name: name}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("DeleteOperation: %v, want Unimplemented", err)
	}

	restOperationIsolation(t, h, d.GetId())

	// Cancel makes the operation done with CANCELLED.
	if _, err := ops.CancelOperation(acme, &longrunningpb.CancelOperationRequest{Name: name}); err != nil {
		t.Fatalf("CancelOperation: %v", err)
	}
	op, err = ops.WaitOperation(acme, &longrunningpb.WaitOperationRequest{Name: name, Timeout: durationpb.New(30 * time.Second)})
	if err != nil || !op.GetDone() || op.GetError().GetCode() != int32(codes.Canceled) {
		t.Fatalf("after CancelOperation: %v, %v; want done with error CANCELLED", op, err)
	}
}

// restOperationIsolation checks GET /v1/operations/{id} of acme's document
// as acme (200), globex (404) and without a token (401).
func restOperationIsolation(t *testing.T, h *harness, id string) {
	t.Helper()
	name := "operations/" + id
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", h.base+"/v1/operations/"+id, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("tok-globex"); code != http.StatusNotFound {
		t.Errorf("REST GET as another tenant: %d %s, want 404", code, body)
	}
	if code, body := get(""); code != http.StatusUnauthorized {
		t.Errorf("REST GET without a token: %d %s, want 401", code, body)
	}
	if code, body := get("tok-acme"); code != http.StatusOK || !strings.Contains(body, `"name":"`+name+`"`) {
		t.Errorf("REST GET as the owner: %d %s", code, body)
	}

}
