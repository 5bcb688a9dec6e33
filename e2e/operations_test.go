package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning"
	lroauto "cloud.google.com/go/longrunning/autogen"
	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/anypb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// restOperation is an Operation as the REST routes send it.
type restOperation struct {
	Name     string          `json:"name"`
	Done     bool            `json:"done"`
	Metadata json.RawMessage `json:"metadata"`
	Response json.RawMessage `json:"response"`
	Error    *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func operationOf(t testing.TB, what string, r httpResp) restOperation {
	t.Helper()
	wantOK(t, what, r)
	var op restOperation
	if err := json.Unmarshal(r.body, &op); err != nil {
		t.Fatalf("%s: %v: %s", what, err, r.body)
	}
	return op
}

// TestOperationsGRPCClients: a finished document is a done operation
// operations/{id} with the Document as metadata and a ResultRef as
// response, for clients that know google.longrunning and nothing of this
// gateway: grpcurl (through reflection) and the Go longrunning client
// (cloud.google.com/go/longrunning over our gRPC connection), which waits
// for a running document and finds the result through the ResultRef.
func TestOperationsGRPCClients(t *testing.T) {
	g := shared(t)
	content := "Operations are documents. Each one ends."
	d := submitREST(t, g, map[string]any{"content": b64([]byte(content)), "contentType": "text/plain", "split": map[string]any{"processor": "textstats"}})
	fin := awaitREST(t, g, d.GetId())
	if fin.GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s", fin.GetState())
	}

	out, errb, code := grpcurl(t, g, nil, "list")
	if code != 0 || !strings.Contains(string(out), "google.longrunning.Operations") {
		t.Fatalf("grpcurl list: exit %d, %s %s; want google.longrunning.Operations listed", code, out, errb)
	}
	grpcurlOperation(t, g, d.GetId())

	// The Go LRO client, given only the name of a running operation.
	conn, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := ctxT(t, time.Minute)
	client, err := lroauto.NewOperationsClient(ctx, option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("A line of text for the operation to chew on.\n", 20000)
	d2 := submitREST(t, g, map[string]any{"content": b64([]byte(big)), "contentType": "text/plain",
		"split": map[string]any{"strategy": "SPLIT_LINES", "chunkBytes": 4096, "processor": "passthrough"}})
	pb, err := client.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: "operations/" + d2.GetId()})
	if err != nil {
		t.Fatalf("GetOperation: %v", err)
	}
	op := longrunning.InternalNewOperation(client, pb)
	var ref gatewayv1.ResultRef
	if err := op.WaitWithInterval(ctx, protoadapt.MessageV1Of(&ref), 100*time.Millisecond); err != nil {
		t.Fatalf("Operation.Wait: %v", err)
	}
	var meta gatewayv1.Document
	if err := op.Metadata(protoadapt.MessageV1Of(&meta)); err != nil || meta.GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("metadata after Wait: %v, state %s", err, meta.GetState())
	}
	if !op.Done() || ref.GetDocumentId() != d2.GetId() || ref.GetState() != gatewayv1.State_SUCCEEDED || ref.GetSizeBytes() != uint64(len(big)) {
		t.Fatalf("after Wait: done %v, ResultRef %v; want document %s SUCCEEDED with %d result bytes", op.Done(), &ref, d2.GetId(), len(big))
	}
	res := curl(t, "GET", g.baseURL()+ref.GetResultPath(), nil)
	wantOK(t, "GET "+ref.GetResultPath(), res)
	if string(res.body) != big {
		t.Fatalf("result at the ResultRef's path: %d bytes, want the %d submitted (passthrough)", len(res.body), len(big))
	}

	// Unknown and malformed names.
	if _, err := client.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: "operations/nope-404"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetOperation(unknown): %v, want NotFound", err)
	}
	if _, err := client.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: "documents/" + d2.GetId()}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("GetOperation(documents/...): %v, want InvalidArgument", err)
	}
}

// grpcurlOperation asserts that grpcurl's GetOperation and WaitOperation
// show document id as a done operation with its Document and a ResultRef.
func grpcurlOperation(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	name := "operations/" + id
	for _, m := range []string{"GetOperation", "WaitOperation"} {
		out, errb, code := grpcurl(t, g, []string{"-d", `{"name":"` + name + `"}`}, "google.longrunning.Operations/"+m)
		if code != 0 {
			t.Fatalf("grpcurl %s: exit %d: %s", m, code, errb)
		}
		var op struct {
			Name     string         `json:"name"`
			Done     bool           `json:"done"`
			Metadata map[string]any `json:"metadata"`
			Response map[string]any `json:"response"`
		}
		if err := json.Unmarshal(out, &op); err != nil {
			t.Fatalf("grpcurl %s: %v: %s", m, err, out)
		}
		if op.Name != name || !op.Done || op.Metadata["@type"] != "type.googleapis.com/pipestream.gateway.v1.Document" ||
			op.Metadata["state"] != "SUCCEEDED" || op.Response["@type"] != "type.googleapis.com/pipestream.gateway.v1.ResultRef" ||
			op.Response["resultPath"] != "/v1/documents/"+id+"/result" {
			t.Fatalf("grpcurl %s: %s; want a done operation with the Document and a ResultRef", m, out)
		}
	}

}

// TestOperationsREST: the REST routes of the operations (curl), WaitOperation
// with a timeout on a running document, CancelOperation making it done
// with error CANCELLED, the list, and the routes in the served spec.
func TestOperationsREST(t *testing.T) {
	g := shared(t)
	d := submitREST(t, g, hangingDoc("an operation that waits for its cancel"))
	awaitState(t, g, d.GetId(), "RUNNING", func(d *gatewayv1.Document) bool { return d.GetState() == gatewayv1.State_RUNNING })
	base := g.baseURL() + "/v1/operations/" + d.GetId()

	op := operationOf(t, "GET "+base, curl(t, "GET", base, nil))
	if op.Name != "operations/"+d.GetId() || op.Done || op.Error != nil || op.Response != nil {
		t.Fatalf("running operation: %+v; want not done, no result", op)
	}
	var meta gatewayv1.Document
	var metaAny anypb.Any
	if err := protojson.Unmarshal(op.Metadata, &metaAny); err != nil {
		t.Fatalf("metadata %s: %v", op.Metadata, err)
	}
	if err := metaAny.UnmarshalTo(&meta); err != nil || meta.GetState() != gatewayv1.State_RUNNING {
		t.Fatalf("metadata %s: %v; want the RUNNING Document", op.Metadata, err)
	}

	start := time.Now()
	op = operationOf(t, "POST "+base+":wait", curlJSON(t, "POST", base+":wait", map[string]any{"timeout": "1s"}))
	if took := time.Since(start); op.Done || took < time.Second {
		t.Fatalf("wait 1s on a running document: done %v after %v; want not done after the timeout", op.Done, took)
	}

	wantOK(t, "POST "+base+":cancel", curlJSON(t, "POST", base+":cancel", map[string]any{}))
	op = operationOf(t, "POST "+base+":wait", curlJSON(t, "POST", base+":wait", map[string]any{"timeout": "30s"}))
	if !op.Done || op.Error == nil || op.Error.Code != int(codes.Canceled) {
		t.Fatalf("after cancel: %+v; want done with error code %d (CANCELLED)", op, codes.Canceled)
	}
	if d := getREST(t, g, d.GetId(), ""); d.GetState() != gatewayv1.State_CANCELLED {
		t.Fatalf("document after CancelOperation: %s, want CANCELLED", d.GetState())
	}

	list := curl(t, "GET", g.baseURL()+"/v1/operations?pageSize=500", nil)
	wantOK(t, "GET /v1/operations", list)
	var page struct {
		Operations    []restOperation `json:"operations"`
		NextPageToken string          `json:"nextPageToken"`
	}
	if err := json.Unmarshal(list.body, &page); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range page.Operations {
		found = found || (o.Name == "operations/"+d.GetId() && o.Done)
	}
	if !found {
		t.Fatalf("GET /v1/operations: operations/%s (done) not in %d operations", d.GetId(), len(page.Operations))
	}
	wantError(t, "unknown operation", curl(t, "GET", g.baseURL()+"/v1/operations/nope-404", nil), 404, int(codes.NotFound), "", "nope-404")
	wantError(t, "filter", curl(t, "GET", g.baseURL()+"/v1/operations?filter=done", nil), 400, int(codes.InvalidArgument), "", "filter")

	spec := curl(t, "GET", g.baseURL()+"/openapi.json", nil)
	wantOK(t, "GET /openapi.json", spec)
	var s struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(spec.body, &s); err != nil {
		t.Fatal(err)
	}
	for p, m := range map[string]string{"/v1/operations": "get", "/v1/operations/{id}": "get", "/v1/operations/{id}:wait": "post", "/v1/operations/{id}:cancel": "post"} {
		if s.Paths[p][m] == nil {
			t.Errorf("served spec lacks %s %s", strings.ToUpper(m), p)
		}
	}
}
