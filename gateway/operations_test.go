package gateway_test

import (
	"context"
	"io"
	"net/http"
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
	h, acme, globex := startTwoTenants(t)
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
		if c := status.Code(call(context.Background())); c != codes.Unauthenticated {
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

// TestWaitOperationCountsAsStream: a WaitOperation holds a document
// subscription, so it counts against MaxSubscribersPerTenant like
// WatchDocument: with a limit of 1, a second concurrent wait is
// ResourceExhausted TOO_MANY_SUBSCRIBERS, and a wait is possible again once
// the first ended.
func TestWaitOperationCountsAsStream(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir: t.TempDir(), PeerAddr: "127.0.0.1:9", PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b; c.MaxSubscribersPerTenant = 1 })
	d, err := h.docs.SubmitDocument(context.Background(), &gatewayv1.SubmitDocumentRequest{Content: []byte("waits"), ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	ops := longrunningpb.NewOperationsClient(h.conn)
	name := "operations/" + d.GetId()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	first := func() {
		_, err := ops.WaitOperation(ctx, &longrunningpb.WaitOperationRequest{Name: name, Timeout: durationpb.New(time.Minute)})
		done <- err
	}
	go first()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-done:
			// A probe held the slot when the first wait started: again.
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("first wait ended early: %v", err)
			}
			go first()
		default:
		}
		_, err := ops.WaitOperation(context.Background(), &longrunningpb.WaitOperationRequest{Name: name, Timeout: durationpb.New(1)})
		if status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "event streams") {
			break
		}
		if err != nil && !strings.Contains(status.Convert(err).Message(), "rate limit") {
			t.Fatalf("second wait: %v; want OK until the first wait holds the slot, then the event stream limit", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("a second concurrent WaitOperation was never refused with a limit of 1")
		}
		time.Sleep(10 * time.Millisecond) // poll interval, not synchronisation
	}
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("first wait after its cancel: %v", err)
	}
	// The slot is released with the call's end on the server; poll.
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, err := ops.WaitOperation(context.Background(), &longrunningpb.WaitOperationRequest{Name: name, Timeout: durationpb.New(1)})
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("wait after the first ended: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}
