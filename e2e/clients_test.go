package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/api/httpbody"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Real clients: curl and grpcurl run as processes; JSON they return is
// decoded with protojson into the generated types, so a field the API does
// not define is an error, not silently ignored.

const clientTimeout = 2 * time.Minute // bound on any one client process

// run executes bin args with stdin, returning stdout, stderr and the exit
// code (-1 when it could not run or was killed by the timeout).
func run(t testing.TB, timeout time.Duration, stdin []byte, bin string, args ...string) (stdout, stderr []byte, code int) {
	t.Helper()
	stdout, stderr, code, err := runE(timeout, stdin, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return stdout, stderr, code
}

// runE is run for a goroutine the test started: it returns an error where
// run fails the test (t.Fatal would end only that goroutine; see
// internal/lint/gofatal).
func runE(timeout time.Duration, stdin []byte, bin string, args ...string) (stdout, stderr []byte, code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.Bytes(), errb.Bytes(), 0, nil
	case ctx.Err() != nil:
		return out.Bytes(), errb.Bytes(), -1, nil
	case errors.As(err, &ee):
		return out.Bytes(), errb.Bytes(), ee.ExitCode(), nil
	}
	return nil, nil, -1, fmt.Errorf("run %s: %w", bin, err)
}

// httpResp is what curl reported.
type httpResp struct {
	status  int
	body    []byte
	headers string
}

func (r httpResp) String() string {
	b := r.body
	if len(b) > 2000 {
		b = append(b[:2000:2000], "..."...)
	}
	return fmt.Sprintf("HTTP %d\n%s", r.status, b)
}

// curl performs one request with curl. body (may be nil) goes in with
// --data-binary @-; extra are more curl arguments (headers, -N...).
func curl(t testing.TB, method, url string, body []byte, extra ...string) httpResp {
	t.Helper()
	r, err := curlE(need(t, toolCurl), method, url, body, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// curlE is curl for a goroutine the test started (bin: the curl the test's
// goroutine found with need): an error instead of failing the test.
func curlE(bin, method, url string, body []byte, extra ...string) (httpResp, error) {
	dir, err := os.MkdirTemp("", "e2e-curl-")
	if err != nil {
		return httpResp{}, err
	}
	defer os.RemoveAll(dir)
	bodyFile, hdrFile := filepath.Join(dir, "body"), filepath.Join(dir, "headers")
	args := []string{"-sS", "-X", method, "-o", bodyFile, "-D", hdrFile, "-w", "%{http_code}", "--max-time", "110"}
	if body != nil {
		args = append(args, "--data-binary", "@-")
	}
	args = append(append(args, extra...), url)
	out, errb, code, err := runE(clientTimeout, body, bin, args...)
	if err != nil {
		return httpResp{}, err
	}
	if code != 0 {
		return httpResp{}, fmt.Errorf("curl %s %s: exit %d: %s", method, url, code, errb)
	}
	status, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return httpResp{}, fmt.Errorf("curl %s %s: status %q: %v", method, url, out, err)
	}
	b, _ := os.ReadFile(bodyFile)
	h, _ := os.ReadFile(hdrFile)
	return httpResp{status: status, body: b, headers: string(h)}, nil
}

// curlJSON sends v (a string is sent verbatim, anything else is
// json.Marshal'ed) with Content-Type application/json.
func curlJSON(t testing.TB, method, url string, v any) httpResp {
	t.Helper()
	return curl(t, method, url, curlJSONBody(t, v), "-H", "Content-Type: application/json")
}

// jsonOf encodes v, which must be a value json.Marshal encodes (maps of
// strings, numbers and slices, structs of them): it panics otherwise, a bug
// of the test. For goroutines the test started, where mustJSON's t.Fatal
// would end only the goroutine.
func jsonOf(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("jsonOf(%T): %v", v, err))
	}
	return b
}

// curlJSONBody encodes v as curlJSON does.
func curlJSONBody(t testing.TB, v any) []byte {
	t.Helper()
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return []byte(x)
	case []byte:
		return x
	}
	body, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// decode unmarshals protojson into m, failing t on unknown fields.
func decode(t testing.TB, b []byte, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(b, m); err != nil {
		t.Fatalf("decode %T: %v\n%s", m, err, b)
	}
}

// wantOK fails t unless r is 200.
func wantOK(t testing.TB, what string, r httpResp) {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("%s: want HTTP 200, got %s", what, r)
	}
}

// docOf decodes a 200 response into a Document.
func docOf(t testing.TB, what string, r httpResp) *gatewayv1.Document {
	t.Helper()
	wantOK(t, what, r)
	d := &gatewayv1.Document{}
	decode(t, r.body, d)
	return d
}

// rpcStatus is a google.rpc.Status JSON error body.
type rpcStatus struct {
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Details []map[string]any `json:"details"`
}

// reasons returns the ErrorInfo reasons among the details.
func (s rpcStatus) reasons() []string {
	var out []string
	for _, d := range s.Details {
		if r, ok := d["reason"].(string); ok {
			out = append(out, r)
		}
	}
	return out
}

// wantError checks an error response: HTTP status, gRPC code, that the
// message contains every fragment (case-insensitive) and, if reason is not
// empty, that an ErrorInfo detail carries it.
func wantError(t testing.TB, what string, r httpResp, httpStatus, grpcCode int, reason string, fragments ...string) rpcStatus {
	t.Helper()
	if r.status != httpStatus {
		t.Fatalf("%s: want HTTP %d, got %s", what, httpStatus, r)
	}
	// Streaming routes (NDJSON) wrap the status: {"error": Status}.
	body := r.body
	var env struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &env) == nil && len(env.Error) > 0 && env.Error[0] == '{' {
		body = env.Error
	}
	var st rpcStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("%s: body is not a google.rpc.Status JSON object: %v\n%s", what, err, r.body)
	}
	if st.Code != grpcCode {
		t.Errorf("%s: want gRPC code %d in the body, got %d (%s)", what, grpcCode, st.Code, r.body)
	}
	for _, f := range fragments {
		if !strings.Contains(strings.ToLower(st.Message), strings.ToLower(f)) {
			t.Errorf("%s: message %q does not say %q", what, st.Message, f)
		}
	}
	if reason != "" && !contains(st.reasons(), reason) {
		t.Errorf("%s: want ErrorInfo reason %s, got details %v", what, reason, st.Details)
	}
	return st
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// terminal reports whether s is a terminal document state.
func terminal(s gatewayv1.State) bool {
	switch s {
	case gatewayv1.State_SUCCEEDED, gatewayv1.State_PARTIALLY_SUCCEEDED, gatewayv1.State_FAILED, gatewayv1.State_CANCELLED:
		return true
	}
	return false
}

// submitREST posts req to /v1/documents and returns the accepted document.
func submitREST(t testing.TB, g *gatewayProc, req map[string]any) *gatewayv1.Document {
	t.Helper()
	d := docOf(t, "POST /v1/documents", curlJSON(t, "POST", g.baseURL()+"/v1/documents", req))
	if d.GetId() == "" {
		t.Fatalf("POST /v1/documents: no id in %v", d)
	}
	return d
}

// getREST fetches GET /v1/documents/{id}.
func getREST(t testing.TB, g *gatewayProc, id string, query string) *gatewayv1.Document {
	t.Helper()
	u := g.baseURL() + "/v1/documents/" + id
	if query != "" {
		u += "?" + query
	}
	return docOf(t, "GET "+u, curl(t, "GET", u, nil))
}

// watchREST follows GET /v1/documents/{id}:watch with curl -N until the
// server ends the stream (the document is terminal) and returns the
// updates. Every line must be {"result": WatchDocumentResponse}.
func watchREST(t testing.TB, g *gatewayProc, id string) []*gatewayv1.WatchDocumentResponse {
	t.Helper()
	u := g.baseURL() + "/v1/documents/" + id + ":watch"
	r := curl(t, "GET", u, nil, "-N")
	wantOK(t, "GET "+u, r)
	var out []*gatewayv1.WatchDocumentResponse
	for _, line := range scanLines(r.body) {
		var env struct {
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatalf("watch NDJSON line is not JSON: %v\n%s", err, line)
		}
		if env.Error != nil {
			t.Fatalf("watch %s ended with an error: %s", id, env.Error)
		}
		u := &gatewayv1.WatchDocumentResponse{}
		decode(t, env.Result, u)
		out = append(out, u)
	}
	if len(out) == 0 {
		t.Fatalf("watch %s: empty stream", id)
	}
	return out
}

// awaitREST waits (via the REST watch stream) until id is terminal and
// returns the final document as GET reports it.
func awaitREST(t testing.TB, g *gatewayProc, id string) *gatewayv1.Document {
	t.Helper()
	ups := watchREST(t, g, id)
	last := ups[len(ups)-1].GetDocument()
	if !terminal(last.GetState()) {
		t.Fatalf("watch %s ended at non-terminal state %v", id, last.GetState())
	}
	return getREST(t, g, id, "")
}

// resultREST downloads GET /v1/documents/{id}/result.
func resultREST(t testing.TB, g *gatewayProc, id string) httpResp {
	t.Helper()
	u := g.baseURL() + "/v1/documents/" + id + "/result"
	r := curl(t, "GET", u, nil)
	wantOK(t, "GET "+u, r)
	return r
}

// grpcResult reads the GetDocumentResult stream (chunks of the result, the
// first with the content type) into one HttpBody.
func grpcResult(ctx context.Context, docs gatewayv1.DocumentServiceClient, id string) (*httpbody.HttpBody, error) {
	stream, err := docs.GetDocumentResult(ctx, &gatewayv1.GetDocumentResultRequest{Id: id})
	if err != nil {
		return nil, err
	}
	var body httpbody.HttpBody
	for first := true; ; first = false {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return &body, nil
		}
		if err != nil {
			return nil, err
		}
		if first {
			body.ContentType = m.GetContentType()
		}
		body.Data = append(body.Data, m.GetData()...)
	}
}

// grpcurl runs `grpcurl -plaintext flags... ADDR cmd...` against g's gRPC
// port (cmd: list, describe SYMBOL, or a method).
func grpcurl(t testing.TB, g *gatewayProc, flags []string, cmd ...string) (stdout, stderr []byte, code int) {
	t.Helper()
	full := append(append([]string{"-plaintext", "-max-time", "110"}, flags...), g.grpcAddr)
	return run(t, clientTimeout, nil, need(t, toolGrpcurl), append(full, cmd...)...)
}

// cli runs a client verb of the gateway binary against g.
func cli(t testing.TB, g *gatewayProc, verb string, args ...string) (stdout, stderr []byte, code int) {
	t.Helper()
	full := append([]string{verb, "--addr", g.grpcAddr}, args...)
	return run(t, clientTimeout, nil, gatewayBinary(t), full...)
}

// curlStream reads a stream that does not end by itself (the event log)
// with curl -N for d, then returns what arrived. curl's exit code 28
// (timeout) is the expected way out.
func curlStream(t testing.TB, url string, d time.Duration) httpResp {
	t.Helper()
	return curlStreamAuth(t, url, d, nil)
}

// curlStreamAuth is curlStream with extra curl arguments (headers).
func curlStreamAuth(t testing.TB, url string, d time.Duration, extra []string) httpResp {
	t.Helper()
	dir := t.TempDir()
	bodyFile, hdrFile := filepath.Join(dir, "body"), filepath.Join(dir, "headers")
	secs := fmt.Sprintf("%.1f", d.Seconds())
	out, errb, code := run(t, clientTimeout, nil, need(t, toolCurl),
		append(append([]string{"-sS", "-N", "-o", bodyFile, "-D", hdrFile, "-w", "%{http_code}", "--max-time", secs}, extra...), url)...)
	if code != 0 && code != 28 {
		t.Fatalf("curl -N %s: exit %d: %s", url, code, errb)
	}
	status, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	b, _ := os.ReadFile(bodyFile)
	h, _ := os.ReadFile(hdrFile)
	return httpResp{status: status, body: b, headers: string(h)}
}

// events decodes an NDJSON event stream ({"result": Event} per line).
func events(t testing.TB, r httpResp) []*gatewayv1.Event {
	t.Helper()
	wantOK(t, "event stream", r)
	var out []*gatewayv1.Event
	for _, line := range scanLines(r.body) {
		var env struct {
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatalf("event stream line is not JSON: %v\n%s", err, line)
		}
		if env.Error != nil {
			t.Fatalf("event stream error: %s", env.Error)
		}
		ev := &gatewayv1.Event{}
		decode(t, env.Result, ev)
		out = append(out, ev)
	}
	return out
}
