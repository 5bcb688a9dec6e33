package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// hangingDoc is a submission the fault processor never finishes (no
// completion-policy timeout), so it stays RUNNING until cancelled.
func hangingDoc(content string) map[string]any {
	return map[string]any{
		"content": b64([]byte(content)), "contentType": "text/plain",
		"split":    map[string]any{"processor": "fault"},
		"metadata": map[string]string{"pipestream.fault": "timeout"},
	}
}

// awaitState polls GET /v1/documents/{id} until pred holds.
func awaitState(t testing.TB, g *gatewayProc, id string, what string, pred func(*gatewayv1.Document) bool) *gatewayv1.Document {
	t.Helper()
	var d *gatewayv1.Document
	waitFor(t, fmt.Sprintf("document %s to be %s", id, what), 30*time.Second, func() bool {
		d = getREST(t, g, id, "")
		return pred(d)
	})
	return d
}

// TestCancel cancels a running document: CANCELLED, the watch stream ends,
// and a second cancel or a result request is FailedPrecondition (400).
func TestCancel(t *testing.T) {
	g := shared(t)
	d := submitREST(t, g, hangingDoc("this never finishes"))
	awaitState(t, g, d.GetId(), "RUNNING", func(d *gatewayv1.Document) bool { return d.GetState() == gatewayv1.State_RUNNING })

	u := g.baseURL() + "/v1/documents/" + d.GetId() + ":cancel"
	c := docOf(t, "POST "+u, curlJSON(t, "POST", u, "{}"))
	if c.GetState() != gatewayv1.State_CANCELLED {
		t.Errorf("cancel answered state %v, want CANCELLED", c.GetState())
	}
	fin := awaitREST(t, g, d.GetId()) // the watch must end now
	if fin.GetState() != gatewayv1.State_CANCELLED || fin.GetFinishTime() == nil {
		t.Errorf("after cancel: state %v finishTime %v, want CANCELLED with a finish time", fin.GetState(), fin.GetFinishTime())
	}
	wantError(t, "second cancel", curlJSON(t, "POST", u, "{}"), 400, int(codes.FailedPrecondition), "", "cancel")
	wantError(t, "result of a cancelled document", curl(t, "GET", g.baseURL()+"/v1/documents/"+d.GetId()+"/result", nil),
		400, int(codes.FailedPrecondition), "", "")
	wantError(t, "cancel unknown", curlJSON(t, "POST", g.baseURL()+"/v1/documents/nope-404:cancel", "{}"), 404, int(codes.NotFound), "", "nope-404")
}

// TestIdempotentResubmission: the same requestId with the same body returns
// the first document; with a different body it is AlreadyExists (409).
func TestIdempotentResubmission(t *testing.T) {
	g := shared(t)
	rid := uniq("idem")
	req := map[string]any{"content": b64([]byte("same body")), "contentType": "text/plain", "requestId": rid}
	first := submitREST(t, g, req)
	again := submitREST(t, g, req)
	if again.GetId() != first.GetId() {
		t.Errorf("resubmission with requestId %s got id %s, want the first id %s", rid, again.GetId(), first.GetId())
	}
	if first.GetRequestId() != rid {
		t.Errorf("requestId echoed as %q, want %q", first.GetRequestId(), rid)
	}

	req["content"] = b64([]byte("a different body"))
	st := wantError(t, "same requestId, different body", curlJSON(t, "POST", g.baseURL()+"/v1/documents", req), 409, int(codes.AlreadyExists), "", rid)
	_ = st

	// The raw upload route shares the idempotency rules.
	u := g.baseURL() + "/v1/documents:upload?contentType=text/plain&requestId=" + uniq("idem-up")
	a := docOf(t, "upload", curl(t, "POST", u, []byte("upload body")))
	b := docOf(t, "upload again", curl(t, "POST", u, []byte("upload body")))
	if a.GetId() != b.GetId() {
		t.Errorf("upload resubmission got id %s, want %s", b.GetId(), a.GetId())
	}
	wantError(t, "upload, different body", curl(t, "POST", u, []byte("other upload body")), 409, int(codes.AlreadyExists), "", "")

	// A different requestId is a new document even with the same body.
	req["requestId"] = uniq("idem2")
	if other := submitREST(t, g, req); other.GetId() == first.GetId() {
		t.Errorf("a new requestId returned the old document %s", other.GetId())
	}
}

// TestBadInput: invalid requests get the right HTTP status, gRPC code and a
// message that says what to fix.
func TestBadInput(t *testing.T) {
	g := shared(t)
	docs := g.baseURL() + "/v1/documents"
	wantError(t, "invalid base64", curlJSON(t, "POST", docs, `{"content":"!!not base64!!","contentType":"text/plain"}`), 400, int(codes.InvalidArgument), "", "content")
	wantError(t, "not JSON", curlJSON(t, "POST", docs, `{"content":`), 400, int(codes.InvalidArgument), "", "")
	wantError(t, "no content", curlJSON(t, "POST", docs, `{"contentType":"text/plain"}`), 400, int(codes.InvalidArgument), "", "content")
	wantError(t, "unknown processor", curlJSON(t, "POST", docs, map[string]any{"content": b64([]byte("x")), "split": map[string]any{"processor": "nope"}}),
		400, int(codes.InvalidArgument), "", "processor", "passthrough")
	wantError(t, "unknown fault", curlJSON(t, "POST", docs, map[string]any{"content": b64([]byte("x")), "metadata": map[string]string{"pipestream.fault": "explode"}}),
		400, int(codes.InvalidArgument), "", "pipestream.fault")
	wantError(t, "unknown id", curl(t, "GET", docs+"/does-not-exist", nil), 404, int(codes.NotFound), "", "does-not-exist")
	wantError(t, "result of unknown id", curl(t, "GET", docs+"/does-not-exist/result", nil), 404, int(codes.NotFound), "", "")
	wantError(t, "watch unknown id", curl(t, "GET", docs+"/does-not-exist:watch", nil), 404, int(codes.NotFound), "", "")
	wantError(t, "unknown claim", curl(t, "GET", g.baseURL()+"/v1/claims/12345", nil), 404, int(codes.NotFound), "", "12345")
	wantError(t, "upload with a typo in a parameter", curl(t, "POST", docs+":upload?split.stratgy=lines", []byte("x")), 400, int(codes.InvalidArgument), "", "split.stratgy")
	wantError(t, "future cursor", curl(t, "GET", g.baseURL()+"/v1/events:subscribe?cursor=9007199254740000", nil), 400, int(codes.OutOfRange), "FutureCursor", "")

	// Unknown route: 404 without crashing anything.
	if r := curl(t, "GET", g.baseURL()+"/v1/nothing-here", nil); r.status != 404 {
		t.Errorf("unknown route: %s, want 404", r)
	}
	if r := curl(t, "GET", g.baseURL()+"/healthz", nil); r.status != 200 {
		t.Errorf("healthz after bad input: %s", r)
	}
}

// TestOversize starts a gateway with --max-upload-bytes 1MiB: bigger REST
// uploads are 413 (with and without Content-Length), bigger gRPC uploads
// InvalidArgument with reason TOO_LARGE, and the server keeps serving.
func TestOversize(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gwOpts{args: []string{"--max-upload-bytes", "1MiB"}})
	big := binaryData(2<<20, 7)
	path := writeTemp(t, "big.bin", big)
	u := g.baseURL() + "/v1/documents:upload?contentType=application/octet-stream"

	wantError(t, "upload with Content-Length above the limit", curl(t, "POST", u, nil, "--data-binary", "@"+path),
		413, int(codes.InvalidArgument), "TOO_LARGE", "1048576")
	wantError(t, "chunked upload above the limit", curl(t, "POST", u, big, "-H", "Transfer-Encoding: chunked"),
		413, int(codes.InvalidArgument), "TOO_LARGE", "1048576")

	c := dialGRPC(t, g)
	stream, err := c.docs.UploadDocument(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "application/octet-stream"}})
	for off := 0; err == nil && off < len(big); off += 256 << 10 {
		err = stream.Send(&gatewayv1.UploadDocumentRequest{Chunk: big[off : off+256<<10]})
	}
	_, err = stream.CloseAndRecv()
	if status.Code(err) != codes.InvalidArgument || grpcReason(err) != "TOO_LARGE" || !strings.Contains(status.Convert(err).Message(), "1048576") {
		t.Errorf("gRPC upload above the limit: %v (reason %q), want InvalidArgument TOO_LARGE naming the limit", err, grpcReason(err))
	}

	// Just under the limit works, and nothing of the rejected uploads
	// leaked into the document list.
	ok := big[:1<<20]
	d := docOf(t, "upload at the limit", curl(t, "POST", u, ok))
	fin := awaitREST(t, g, d.GetId())
	if fin.GetState() != gatewayv1.State_SUCCEEDED || !bytes.Equal(resultREST(t, g, d.GetId()).body, ok) {
		t.Errorf("upload at the limit: state %v, result not identical", fin.GetState())
	}
	r := curl(t, "GET", g.baseURL()+"/v1/documents", nil)
	list := &gatewayv1.ListDocumentsResponse{}
	wantOK(t, "list", r)
	decode(t, r.body, list)
	if len(list.GetDocuments()) != 1 {
		t.Errorf("%d documents listed, want only the accepted one (rejected uploads must leave nothing)", len(list.GetDocuments()))
	}
}
