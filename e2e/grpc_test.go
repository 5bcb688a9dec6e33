package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// watchGRPC follows WatchDocument with the Go client until the server ends
// the stream and returns every update.
func watchGRPC(t testing.TB, c grpcClients, id string) []*gatewayv1.WatchDocumentResponse {
	t.Helper()
	stream, err := c.docs.WatchDocument(ctxT(t, 2*time.Minute), &gatewayv1.WatchDocumentRequest{Id: id})
	if err != nil {
		t.Fatalf("WatchDocument(%s): %v", id, err)
	}
	var out []*gatewayv1.WatchDocumentResponse
	for {
		u, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("WatchDocument(%s) after %d updates: %v", id, len(out), err)
		}
		out = append(out, u)
	}
}

// TestGRPCUploadStreaming streams a document with the generated Go client's
// UploadDocument in 256 KiB messages, watches it to completion over gRPC
// and compares the result bytes.
func TestGRPCUploadStreaming(t *testing.T) {
	g := shared(t)
	c := dialGRPC(t, g)
	in := textCorpus(8 << 20)
	ctx := ctxT(t, 2*time.Minute)
	stream, err := c.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opts := &gatewayv1.SubmitOptions{
		ContentType: "text/plain", DisplayName: "corpus.txt", RequestId: uniq("grpc-upload"),
		Split:    &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 512 << 10, Processor: "passthrough"},
		Metadata: map[string]string{"source": "e2e"},
	}
	if err := stream.Send(&gatewayv1.UploadDocumentRequest{Options: opts}); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(in); off += 256 << 10 {
		end := min(off+256<<10, len(in))
		if err := stream.Send(&gatewayv1.UploadDocumentRequest{Chunk: in[off:end]}); err != nil {
			t.Fatalf("send chunk at %d: %v", off, err)
		}
	}
	d, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatalf("UploadDocument: %v", err)
	}
	if d.GetSizeBytes() != uint64(len(in)) || d.GetChecksum() != sha256Hex(in) {
		t.Errorf("accepted %d bytes sha256 %s, want %d %s", d.GetSizeBytes(), d.GetChecksum(), len(in), sha256Hex(in))
	}
	if d.GetMetadata()["source"] != "e2e" || d.GetDisplayName() != "corpus.txt" || d.GetName() != "documents/"+d.GetId() {
		t.Errorf("document does not echo the options: name %q displayName %q metadata %v", d.GetName(), d.GetDisplayName(), d.GetMetadata())
	}

	ups := watchGRPC(t, c, d.GetId())
	checkWatch(t, d.GetId(), ups)
	fin := ups[len(ups)-1].GetDocument()
	if fin.GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %v (%s), want SUCCEEDED", fin.GetState(), fin.GetError())
	}
	if fin.GetEntityCounts().GetTotal() < 1+16 || fin.GetEntityCounts().GetComplete() != fin.GetEntityCounts().GetTotal() {
		t.Errorf("entityCounts %v: want root + >=16 line chunks of <=512 KiB, all complete", fin.GetEntityCounts())
	}
	full, err := c.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: d.GetId(), IncludeEntities: true})
	if err != nil {
		t.Fatal(err)
	}
	var chunkBytes uint64
	for _, e := range full.GetEntities() {
		if e.GetParentId() != 0 {
			chunkBytes += e.GetSizeBytes()
			if e.GetSizeBytes() > 512<<10 {
				t.Errorf("entity %d is %d bytes, above chunkBytes 512 KiB", e.GetEntityId(), e.GetSizeBytes())
			}
		}
	}
	if chunkBytes != uint64(len(in)) {
		t.Errorf("children carry %d bytes, want %d (entity tree: %d entities)", chunkBytes, len(in), len(full.GetEntities()))
	}

	body, err := grpcResult(ctx, c.docs, d.GetId())
	if err != nil {
		t.Fatalf("GetDocumentResult: %v", err)
	}
	if !bytes.Equal(body.GetData(), in) {
		t.Errorf("result %d bytes sha256 %s, want the %d input bytes sha256 %s", len(body.GetData()), sha256Hex(body.GetData()), len(in), sha256Hex(in))
	}

	// Too large for the server's limit is covered in TestOversize; an empty
	// upload is InvalidArgument with a message that says what to send.
	empty, err := c.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = empty.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain"}})
	if _, err := empty.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty upload: %v, want InvalidArgument", err)
	}
}

// TestGrpcurl drives the gRPC API with grpcurl over server reflection:
// list, a unary submit and the WatchDocument server stream.
func TestGrpcurl(t *testing.T) {
	need(t, toolGrpcurl)
	g := shared(t)

	out, errb, code := grpcurl(t, g, nil, "list")
	if code != 0 {
		t.Fatalf("grpcurl list: exit %d: %s", code, errb)
	}
	services := strings.Fields(string(out))
	for _, s := range []string{"pipestream.gateway.v1.DocumentService", "pipestream.gateway.v1.EventService", "grpc.health.v1.Health"} {
		if !contains(services, s) {
			t.Errorf("grpcurl list (reflection) does not show %s: %v", s, services)
		}
	}
	out, errb, code = grpcurl(t, g, nil, "describe", "pipestream.gateway.v1.DocumentService")
	if code != 0 || !strings.Contains(string(out), "rpc UploadDocument ( stream .pipestream.gateway.v1.UploadDocumentRequest )") {
		t.Errorf("grpcurl describe DocumentService: exit %d\n%s%s", code, out, errb)
	}
	// The listener serves unary methods as client streams (gateway
	// wireErrorsDesc); reflection still describes them as unary.
	if !strings.Contains(string(out), "rpc GetDocument ( .pipestream.gateway.v1.GetDocumentRequest ) returns ( .pipestream.gateway.v1.Document )") {
		t.Errorf("grpcurl describe DocumentService: GetDocument is not described as unary\n%s", out)
	}
	out, errb, code = grpcurl(t, g, nil, "grpc.health.v1.Health/Check")
	if code != 0 || !strings.Contains(string(out), "SERVING") {
		t.Errorf("grpcurl Health/Check: exit %d\n%s%s", code, out, errb)
	}

	in := []byte("One. Two! Three?")
	req, _ := json.Marshal(map[string]any{"content": b64(in), "contentType": "text/plain", "split": map[string]any{"processor": "sentences"}})
	out, errb, code = grpcurl(t, g, []string{"-d", string(req)}, "pipestream.gateway.v1.DocumentService/SubmitDocument")
	if code != 0 {
		t.Fatalf("grpcurl SubmitDocument: exit %d: %s", code, errb)
	}
	d := &gatewayv1.Document{}
	decode(t, out, d)

	// Server streaming: grpcurl prints one JSON object per message and
	// exits 0 when the server ends the stream (the document is terminal).
	out, errb, code = grpcurl(t, g, []string{"-d", `{"id":"` + d.GetId() + `"}`}, "pipestream.gateway.v1.DocumentService/WatchDocument")
	if code != 0 {
		t.Fatalf("grpcurl WatchDocument: exit %d: %s", code, errb)
	}
	var ups []*gatewayv1.WatchDocumentResponse
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("grpcurl WatchDocument output: %v\n%s", err, out)
		}
		u := &gatewayv1.WatchDocumentResponse{}
		decode(t, raw, u)
		ups = append(ups, u)
	}
	if len(ups) == 0 {
		t.Fatalf("grpcurl WatchDocument printed nothing")
	}
	checkWatch(t, d.GetId(), ups)
	if st := ups[len(ups)-1].GetDocument().GetState(); st != gatewayv1.State_SUCCEEDED {
		t.Errorf("watch ended at %v, want SUCCEEDED", st)
	}

	// Errors carry the gRPC code: NotFound for an unknown id.
	_, errb, code = grpcurl(t, g, []string{"-d", `{"id":"no-such-document"}`}, "pipestream.gateway.v1.DocumentService/GetDocument")
	if code == 0 || !strings.Contains(string(errb), "NotFound") {
		t.Errorf("grpcurl GetDocument(unknown): exit %d, stderr %s; want NotFound", code, errb)
	}
}

// TestPagination lists five documents on a fresh gateway, two per page,
// over gRPC and over REST: every document exactly once, newest first.
func TestPagination(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gwOpts{})
	c := dialGRPC(t, g)
	ctx := ctxT(t, time.Minute)
	var ids []string // oldest first
	for i := range 5 {
		d, err := c.docs.SubmitDocument(ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte{byte('a' + i)}, ContentType: "text/plain"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.GetId())
	}

	check := func(via string, pages [][]string) {
		t.Helper()
		var seen []string
		for i, p := range pages {
			if len(p) > 2 {
				t.Errorf("%s: page %d has %d documents, page size is 2", via, i, len(p))
			}
			seen = append(seen, p...)
		}
		if len(pages) != 3 {
			t.Errorf("%s: %d pages, want 3 (2+2+1)", via, len(pages))
		}
		want := make([]string, len(ids))
		for i, id := range ids {
			want[len(ids)-1-i] = id
		}
		if strings.Join(seen, ",") != strings.Join(want, ",") {
			t.Errorf("%s: visited %v, want each document once, newest first: %v", via, seen, want)
		}
	}

	var pages [][]string
	token := ""
	for n := 0; n < 10; n++ {
		resp, err := c.docs.ListDocuments(ctx, &gatewayv1.ListDocumentsRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		var p []string
		for _, d := range resp.GetDocuments() {
			p = append(p, d.GetId())
		}
		pages = append(pages, p)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	check("gRPC", pages)

	pages, token = nil, ""
	for n := 0; n < 10; n++ {
		u := g.baseURL() + "/v1/documents?pageSize=2"
		if token != "" {
			u += "&pageToken=" + token
		}
		r := curl(t, "GET", u, nil)
		wantOK(t, "GET "+u, r)
		resp := &gatewayv1.ListDocumentsResponse{}
		decode(t, r.body, resp)
		var p []string
		for _, d := range resp.GetDocuments() {
			p = append(p, d.GetId())
		}
		pages = append(pages, p)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	check("REST", pages)

	// A token that was never issued is InvalidArgument, not a silent restart.
	r := curl(t, "GET", g.baseURL()+"/v1/documents?pageSize=2&pageToken=not-a-token", nil)
	wantError(t, "bad pageToken", r, 400, int(codes.InvalidArgument), "", "page")
}

// grpcReason returns the ErrorInfo reason of a gRPC error, if any.
func grpcReason(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
