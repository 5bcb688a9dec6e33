package gateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// rawCodec sends and receives message bytes as they are, under the name
// "proto", so a test can put bytes on the wire that no generated client
// would send.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// grpcMethod is one method the server lists through reflection.
type grpcMethod struct {
	name             string // /service/Method
	clientStreams    bool
	serverStreams    bool
	skipsCredentials bool // health and reflection answer without a token
}

// listGRPCMethods asks the server's reflection service for its services
// and returns every method of each, so a new service or method is walked
// without a change here.
func listGRPCMethods(t *testing.T, conn *grpc.ClientConn) []grpcMethod {
	t.Helper()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	var out []grpcMethod
	for _, svc := range resp.GetListServicesResponse().GetService() {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc.GetName()))
		if err != nil {
			t.Fatalf("service %s: %v", svc.GetName(), err)
		}
		sd := d.(protoreflect.ServiceDescriptor)
		for i := 0; i < sd.Methods().Len(); i++ {
			md := sd.Methods().Get(i)
			out = append(out, grpcMethod{
				name:             "/" + svc.GetName() + "/" + string(md.Name()),
				clientStreams:    md.IsStreamingClient(),
				serverStreams:    md.IsStreamingServer(),
				skipsCredentials: strings.HasPrefix(svc.GetName(), "grpc."),
			})
		}
	}
	return out
}

// callRaw calls m with payload as its one request message, over the real
// gRPC listener, and returns the call's error and trailers. A stream's
// answers are read until it ends.
func callRaw(ctx context.Context, conn *grpc.ClientConn, m grpcMethod, payload []byte) (metadata.MD, error) {
	var trl metadata.MD
	if !m.clientStreams && !m.serverStreams {
		var reply []byte
		err := conn.Invoke(ctx, m.name, &payload, &reply, grpc.ForceCodec(rawCodec{}), grpc.Trailer(&trl))
		return trl, err
	}
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: m.clientStreams, ServerStreams: m.serverStreams}, m.name, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return nil, err
	}
	_ = cs.SendMsg(&payload) // io.EOF when the server answered first: RecvMsg has the status
	_ = cs.CloseSend()
	for {
		var reply []byte
		if err = cs.RecvMsg(&reply); err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return cs.Trailer(), err
}

// TestGRPCAnswersHaveOneShape is the route walker of the gRPC transport:
// every method of every service the server lists (reflection) is called
// over the real listener with bytes that do not decode as its request,
// with a message over --max-recv-msg-bytes, with one past grpc-go's hard
// stop (answered by grpc-go unread: code and request id only), and (API
// methods) with a good message but no credentials; every unary method
// also with an empty request (a success, or an error of the shape) and
// with no request message or two (CARDINALITY_VIOLATION, which grpc-go
// would answer itself without details); and paths that are not
// /service/method (MALFORMED_METHOD_NAME, walkMalformedMethodNames) and
// a call whose deadline passed before it arrived (walkExpiredDeadline).
// Each error is a google.rpc.Status with the expected code and an
// ErrorInfo reason in domain pipestream.gateway.v1, with a message free of
// "rpc error:"; every answer carries the call's request id in its
// trailers. grpc-go would answer the first two itself, before any
// interceptor runs (wireerrors.go).
func TestGRPCAnswersHaveOneShape(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string]string{"tok-a": "acme"})
	tf, err := gateway.LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	const maxRecv = 300 << 10
	h := start(t, func(c *gateway.Config) { c.Authenticator, c.MaxRecvMsgBytes = tf, maxRecv })
	methods := listGRPCMethods(t, h.conn)
	if len(methods) < 15 {
		t.Fatalf("reflection lists %d methods: %v; the walk would miss some", len(methods), methods)
	}
	// Field 15, length-delimited, 5 bytes long with 1 byte present: no
	// message type decodes it.
	undecodable := []byte{0x7a, 0x05, 'x'}
	probes := []grpcProbe{
		{"undecodable", undecodable, true, codes.InvalidArgument, gateway.ReasonMalformedMessage, "does not decode"},
		{"oversized", make([]byte, maxRecv+1024), true, codes.ResourceExhausted, gateway.ReasonMessageTooLarge, "--max-recv-msg-bytes"},
		{"far oversized", make([]byte, maxRecv+gateway.RecvSlack+1), true, codes.ResourceExhausted, "", "larger than max"},
		{"no credentials", nil, false, codes.Unauthenticated, gateway.ReasonMissingCredentials, "token"},
	}
	for _, m := range methods {
		for i, p := range probes {
			if !p.token && m.skipsCredentials {
				continue
			}
			walkGRPCProbe(t, h, m, p, fmt.Sprintf("walk-%d-%s", i, strings.ReplaceAll(m.name[1:], "/", ".")))
		}
		if !m.clientStreams && !m.serverStreams { // a good stream may not end
			walkEmptyRequest(t, h, m)
			walkNoRequestMessage(t, h, m)
		}
	}
	walkMalformedMethodNames(t, h)
	walkExpiredDeadline(t, h)
	// The log line of a call that did not decode carries its request id
	// (the interceptors ran).
	if !strings.Contains(h.logs.String(), `"request_id":"walk-0-pipestream.gateway.v1.DocumentService.GetDocument"`) {
		t.Error("the undecodable GetDocument call was not logged with its request id")
	}
}

// grpcProbe is one bad call of the gRPC walk.
type grpcProbe struct {
	name    string
	payload []byte
	token   bool
	code    codes.Code
	reason  string // "": grpc-go answers (far over the limit), reason unchecked
	says    string
}

func walkGRPCProbe(t *testing.T, h *harness, m grpcMethod, p grpcProbe, rid string) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", rid)
	if p.token {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-a")
	}
	trl, err := callRaw(ctx, h.conn, m, p.payload)
	where := m.name + " " + p.name
	if p.reason == "" {
		if status.Code(err) != p.code || !strings.Contains(status.Convert(err).Message(), p.says) {
			t.Errorf("%s: %v, want %v saying %q", where, err, p.code, p.says)
		}
	} else {
		checkGRPCShape(t, where, err, p.code, p.reason, p.says)
	}
	if got := trl.Get("x-request-id"); len(got) != 1 || got[0] != rid {
		t.Errorf("%s: trailer x-request-id %v, want [%s]", where, got, rid)
	}
}

// walkEmptyRequest calls unary method m with an empty request and a
// token: a success or an error of the one shape (a generic reason
// allowed), the request id in the trailers either way.
func walkEmptyRequest(t *testing.T, h *harness, m grpcMethod) {
	t.Helper()
	rid := "walk-empty-" + strings.ReplaceAll(m.name[1:], "/", ".")
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", rid, "authorization", "Bearer tok-a")
	trl, err := callRaw(ctx, h.conn, m, nil)
	t.Logf("%s with an empty request: %v", m.name, err)
	if err != nil {
		checkGRPCShape(t, m.name+" empty request", err, status.Code(err), reasonOf(err), "")
		if reasonOf(err) == "" {
			t.Errorf("%s empty request: %v has no reason", m.name, err)
		}
	}
	if got := trl.Get("x-request-id"); len(got) != 1 || got[0] != rid {
		t.Errorf("%s empty request (%v): trailer x-request-id %v, want [%s]", m.name, err, got, rid)
	}
}

// walkNoRequestMessage calls unary method m without a request message,
// then with two: each is CARDINALITY_VIOLATION in the one shape (grpc-go
// would answer both itself, with no details: wireErrorsDesc), the request
// id in the trailers, and logged once.
func walkNoRequestMessage(t *testing.T, h *harness, m grpcMethod) {
	t.Helper()
	for _, n := range []int{0, 2} {
		rid := fmt.Sprintf("walk-%dmsgs-%s", n, strings.ReplaceAll(m.name[1:], "/", "."))
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", rid, "authorization", "Bearer tok-a")
		cs, err := h.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, m.name, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Errorf("%s: %v", m.name, err)
			return
		}
		for range n {
			empty := []byte{}
			_ = cs.SendMsg(&empty)
		}
		_ = cs.CloseSend()
		var reply []byte
		err = cs.RecvMsg(&reply)
		where := fmt.Sprintf("%s with %d request messages", m.name, n)
		checkGRPCShape(t, where, err, codes.InvalidArgument, gateway.ReasonCardinalityViolation, "exactly one request message")
		if got := cs.Trailer().Get("x-request-id"); len(got) != 1 || got[0] != rid {
			t.Errorf("%s: trailer x-request-id %v, want [%s]", where, got, rid)
		}
		if got := strings.Count(h.logs.String(), `"request_id":"`+rid+`"`); got != 1 {
			t.Errorf("%s: %d log lines carry its request id, want 1 (the unary chain runs once)", where, got)
		}
	}
}

// walkMalformedMethodNames calls paths that are not /service/method: the
// listener's tap refuses each in the one shape, code Unimplemented,
// reason MALFORMED_METHOD_NAME; its trailers-only answer carries the
// request id in a google.rpc.RequestInfo detail (it cannot carry other
// trailers: docs/errors.md), the client's own when it sent one, and the
// refusal is logged with it. A good call on the same connection still
// works afterwards.
func walkMalformedMethodNames(t *testing.T, h *harness) {
	t.Helper()
	for _, tc := range []struct{ path, rid string }{
		{"noslash", "malformed-1"},
		{"/pipestream.gateway.v1.DocumentService.GetDocument", "malformed-2"},
		{"", ""},
	} {
		ctx := context.Background()
		if tc.rid != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-request-id", tc.rid)
		}
		in, out := []byte{}, []byte{}
		err := h.conn.Invoke(ctx, tc.path, &in, &out, grpc.ForceCodec(rawCodec{}))
		checkGRPCShape(t, fmt.Sprintf("path %q", tc.path), err, codes.Unimplemented, gateway.ReasonMalformedMethodName, "malformed method name")
		rid := requestInfoID(err)
		if tc.rid != "" && rid != tc.rid || rid == "" {
			t.Errorf("path %q: RequestInfo request id %q, want %q (or a new one when the client sent none)", tc.path, rid, tc.rid)
		}
		if tc.rid != "" && !strings.Contains(h.logs.String(), `"request_id":"`+tc.rid+`"`) {
			t.Errorf("path %q: no log line with its request id", tc.path)
		}
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok-a")
	if _, err := h.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("a good call after the malformed ones: %v, want NotFound", err)
	}
}

func checkGRPCShape(t *testing.T, where string, err error, code codes.Code, reason, says string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Errorf("%s: %v, want code %v", where, err, code)
		return
	}
	if st.Message() == "" || strings.Contains(st.Message(), "rpc error:") || !strings.Contains(st.Message(), says) {
		t.Errorf("%s: message %q: want one that says %q, with no leaked rpc error prefix", where, st.Message(), says)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetReason() != reason || info.GetDomain() != "pipestream.gateway.v1" {
				t.Errorf("%s: ErrorInfo %s/%s, want %s/pipestream.gateway.v1", where, info.GetReason(), info.GetDomain(), reason)
			}
			return
		}
	}
	t.Errorf("%s: no ErrorInfo in %v", where, st.Details())
}

// rawGRPCCall sends one gRPC request by hand (net/http's HTTP/2 client,
// h2c) to path on the gRPC listener with headers and body, and returns
// the answer's status: grpc-status, grpc-message and the decoded
// grpc-status-details-bin (nil without one), from the headers of a
// trailers-only answer or from the trailers. A grpc-go client would not
// send some of these requests (an expired deadline) or would find the
// codec registered in this process (an unknown grpc-encoding).
func rawGRPCCall(t *testing.T, h *harness, path string, headers map[string]string, body []byte) (code, msg string, details *status.Status) {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "http://"+h.srv.GRPCAddr()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	get := func(k string) string { // a trailers-only answer has them in the header
		if v := resp.Header.Get(k); v != "" {
			return v
		}
		return resp.Trailer.Get(k)
	}
	if bin := get("Grpc-Status-Details-Bin"); bin != "" {
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(bin, "="))
		var sp spb.Status
		if err != nil || proto.Unmarshal(b, &sp) != nil {
			t.Fatalf("%s: grpc-status-details-bin %q does not decode: %v", path, bin, err)
		}
		details = status.FromProto(&sp)
	}
	return get("Grpc-Status"), get("Grpc-Message"), details
}

// walkExpiredDeadline calls GetDocument with a deadline that has passed
// when the call arrives (grpc-timeout 0): the tap refuses it in the one
// shape, DEADLINE_EXCEEDED, the request id in a RequestInfo (grpc-go
// would refuse it right after, without details).
func walkExpiredDeadline(t *testing.T, h *harness) {
	t.Helper()
	code, _, st := rawGRPCCall(t, h, "/pipestream.gateway.v1.DocumentService/GetDocument",
		map[string]string{"Grpc-Timeout": "0n", "X-Request-Id": "expired-1", "Authorization": "Bearer tok-a"},
		[]byte{0, 0, 0, 0, 0})
	if code != "4" || st == nil {
		t.Errorf("an expired deadline: grpc-status %q details %v, want 4 with details", code, st)
		return
	}
	checkGRPCShape(t, "an expired deadline", st.Err(), codes.DeadlineExceeded, "DEADLINE_EXCEEDED", "deadline")
	if rid := requestInfoID(st.Err()); rid != "expired-1" {
		t.Errorf("an expired deadline: RequestInfo request id %q, want expired-1", rid)
	}
}

// requestInfoID is the request id of err's google.rpc.RequestInfo.
func requestInfoID(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RequestInfo); ok {
			return ri.GetRequestId()
		}
	}
	return ""
}

// TestGRPCUnknownEncodingIsGRPCGosAnswer pins one of the two gRPC answers
// docs/errors.md lists as outside the one shape: a call whose
// grpc-encoding the server has no decompressor for is refused by grpc-go
// before any handler or interceptor runs (code Unimplemented, no
// details, no request id). No server hook reaches it (docs/errors.md
// says why and what the one design that would costs); if a grpc-go
// upgrade changes this answer, this test fails and the docs are to be
// updated.
func TestGRPCUnknownEncodingIsGRPCGosAnswer(t *testing.T) {
	h := start(t, nil)
	// One message, flagged compressed, of 3 bytes.
	code, msg, st := rawGRPCCall(t, h, "/pipestream.gateway.v1.DocumentService/GetDocument",
		map[string]string{"Grpc-Encoding": "pipestream-no-such-codec", "X-Request-Id": "unknown-encoding-1"},
		[]byte{1, 0, 0, 0, 3, 'a', 'b', 'c'})
	if code != "12" || !strings.Contains(msg, "Decompressor is not installed") || st != nil {
		t.Errorf("unknown grpc-encoding: grpc-status %q message %q details %v; docs/errors.md says grpc-go answers 12 without details: update it", code, msg, st)
	}
}
