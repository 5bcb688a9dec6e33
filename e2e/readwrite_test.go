package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestCancelReadYourWrites (issue 24, read your writes): two replicas on
// one PostgreSQL cluster. A deferred document (RUNNING until its claim is
// redeemed), submitted through replica 0 which drives it, is cancelled
// through replica 0 or replica 1 (which forwards the cancel), 20 times
// over gRPC (CancelDocument, CancelOperation) and 20 over REST (:cancel on
// the document and on the operation). Right after each answer, the next
// read on the same connection and on the other replica shows the cancel:
// GetDocument CANCELLED and GetOperation done with error CANCELLED, 40
// out of 40 (docs/operations.md, CancelOperation).
func TestCancelReadYourWrites(t *testing.T) {
	dsn := startPostgres(t)
	addr, cert, _ := startPeer(t)
	args := []string{"--store", dsn, "--peer", addr, "--peer-ca", cert, "--rate-limit", "0"}
	gws := []*gatewayProc{startGateway(t, gwOpts{args: args}), startGateway(t, gwOpts{args: args})}
	type clients struct {
		docs gatewayv1.DocumentServiceClient
		ops  longrunningpb.OperationsClient
	}
	var cs []clients
	for _, g := range gws {
		conn, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		cs = append(cs, clients{gatewayv1.NewDocumentServiceClient(conn), longrunningpb.NewOperationsClient(conn)})
	}
	ctx := ctxT(t, 5*time.Minute)
	stale := 0
	for i := range 40 {
		rest, viaOp, via := i%2 == 1, i%4 >= 2, (i/4)%2
		d := submitREST(t, gws[0], deferredDoc(fmt.Appendf(nil, "cancelled %d", i), 5*time.Minute, nil, nil))
		awaitClaims(t, gws[0], d.GetId(), 1) // RUNNING at the peer, deferred
		cancel(t, ctx, gws[via], cs[via].docs, cs[via].ops, d.GetId(), rest, viaOp)
		for k, g := range gws {
			if got := readState(t, ctx, g, cs[k].docs, cs[k].ops, d.GetId(), rest, viaOp); got != "CANCELLED" {
				stale++
				t.Errorf("run %d (rest %v, operation %v, through replica %d): the read on replica %d right after the cancel answered shows %s", i, rest, viaOp, via, k, got)
			}
		}
	}
	t.Logf("40 cancels (20 gRPC, 20 REST; half through the operation; half through the replica that does not drive the document): %d reads of 80 did not show the cancel", stale)
}

// cancel cancels document id through g (REST or gRPC, the document or its
// operation) and fails the test unless it answered OK.
func cancel(t *testing.T, ctx context.Context, g *gatewayProc, docs gatewayv1.DocumentServiceClient, ops longrunningpb.OperationsClient, id string, rest, viaOp bool) {
	t.Helper()
	var err error
	switch {
	case rest && viaOp:
		err = postOK(ctx, g.baseURL()+"/v1/operations/"+id+":cancel")
	case rest:
		err = postOK(ctx, g.baseURL()+"/v1/documents/"+id+":cancel")
	case viaOp:
		_, err = ops.CancelOperation(ctx, &longrunningpb.CancelOperationRequest{Name: "operations/" + id})
	default:
		_, err = docs.CancelDocument(ctx, &gatewayv1.CancelDocumentRequest{Id: id})
	}
	if err != nil {
		t.Fatalf("cancel %s (rest %v, operation %v): %v", id, rest, viaOp, err)
	}
}

func postOK(ctx context.Context, url string) error {
	st, b, err := doJSON(ctx, "POST", url, []byte("{}"), "application/json")
	if err == nil && st != 200 {
		err = fmt.Errorf("HTTP %d %s", st, b)
	}
	return err
}

// readState reads document id through g the way it was cancelled and
// returns its state: the document's, or CANCELLED for an operation that is
// done with error CANCELLED (else "done=false" or the error).
func readState(t *testing.T, ctx context.Context, g *gatewayProc, docs gatewayv1.DocumentServiceClient, ops longrunningpb.OperationsClient, id string, rest, viaOp bool) string {
	t.Helper()
	switch {
	case rest && viaOp:
		st, b, err := doJSON(ctx, "GET", g.baseURL()+"/v1/operations/"+id, nil, "")
		var op struct {
			Done  bool
			Error *struct{ Code int }
		}
		if err != nil || st != 200 || json.Unmarshal(b, &op) != nil {
			t.Fatalf("GET operation %s: %d %v %s", id, st, err, b)
		}
		if op.Done && op.Error != nil && op.Error.Code == int(codes.Canceled) {
			return "CANCELLED"
		}
		return fmt.Sprintf("done=%v error=%v", op.Done, op.Error)
	case rest:
		st, b, err := doJSON(ctx, "GET", g.baseURL()+"/v1/documents/"+id, nil, "")
		var d docJSON
		if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("GET document %s: %d %v %s", id, st, err, b)
		}
		return d.State
	case viaOp:
		op, err := ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: "operations/" + id})
		if err != nil {
			t.Fatalf("GetOperation %s: %v", id, err)
		}
		if op.GetDone() && op.GetError().GetCode() == int32(codes.Canceled) {
			return "CANCELLED"
		}
		return fmt.Sprintf("done=%v error=%v", op.GetDone(), op.GetError())
	}
	d, err := docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: id})
	if err != nil {
		t.Fatalf("GetDocument %s: %v", id, err)
	}
	return d.GetState().String()
}
