package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestRequestIDsEverywhere: a gRPC answer carries the request id in its
// trailers (and headers), failed or not; a REST request without an id gets
// a new one in X-Request-Id, and the gRPC call behind it logs that same id;
// an answer the HTTP side refuses by itself logs it too.
func TestRequestIDsEverywhere(t *testing.T) {
	h := start(t, nil)
	doc := h.fake.add(gatewayv1.State_SUCCEEDED, 3)
	for _, id := range []string{doc.GetId(), "nope"} {
		var hdr, trl metadata.MD
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "rid-"+id)
		_, err := h.docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: id}, grpc.Header(&hdr), grpc.Trailer(&trl))
		if got := trl.Get("x-request-id"); len(got) != 1 || got[0] != "rid-"+id {
			t.Errorf("GetDocument %s (err %v): trailer x-request-id %v, want [rid-%s]", id, err, got, id)
		}
		if err == nil && strings.Join(hdr.Get("x-request-id"), ",") != "rid-"+id {
			t.Errorf("GetDocument %s: header x-request-id %v, want [rid-%s]", id, hdr.Get("x-request-id"), id)
		}
	}
	var trl metadata.MD
	if _, err := h.docs.GetDocument(context.Background(), &gatewayv1.GetDocumentRequest{Id: doc.GetId()}, grpc.Trailer(&trl)); err != nil || len(trl.Get("x-request-id")) != 1 || len(trl.Get("x-request-id")[0]) != 32 {
		t.Errorf("GetDocument without an id: trailer %v (%v), want a generated 32-hex id", trl, err)
	}

	for _, path := range []string{"/v1/documents/" + doc.GetId(), "/v1/operations/" + doc.GetId(), "/v1/documents/" + doc.GetId() + "/result", "/healthz", "/v1/nothing"} {
		_, rh, _ := h.do("GET", path, nil)
		rid := rh.Get("X-Request-Id")
		if len(rid) != 32 || len(rh.Values("X-Request-Id")) != 1 {
			t.Errorf("GET %s: X-Request-Id %v, want one generated id", path, rh.Values("X-Request-Id"))
		}
		if strings.HasPrefix(path, "/v1/documents/"+doc.GetId()) && !strings.HasSuffix(path, "/result") && !strings.Contains(h.logs.String(), `"request_id":"`+rid+`"`) {
			t.Errorf("GET %s: the gRPC call's log does not carry the answer's X-Request-Id %s", path, rid)
		}
	}
	// The result download is served without a gRPC call: it logs itself.
	if code, _, _ := h.do("GET", "/v1/documents/"+doc.GetId()+"/result", nil, "X-Request-Id", "rid-download"); code != 200 ||
		!strings.Contains(h.logs.String(), `"msg":"result download"`) || !strings.Contains(h.logs.String(), `"request_id":"rid-download"`) {
		t.Errorf("result download (HTTP %d): no log line with its request id", code)
	}
	// Answers the HTTP side writes itself, with no gRPC call behind them,
	// are logged with their request id too.
	for _, tc := range []struct {
		path string
		hdr  []string
	}{
		{"/v1/nothing", nil},           // no such route
		{"/v1/claims/42?bogus=1", nil}, // a stray query parameter
		{"/v1/events/ws", nil},         // not a WebSocket handshake
	} {
		code, rh, _ := h.do("GET", tc.path, nil, tc.hdr...)
		rid := rh.Get("X-Request-Id")
		if !strings.Contains(h.logs.String(), fmt.Sprintf(`"status":%d,"reason":`, code)) || !strings.Contains(h.logs.String(), `"request_id":"`+rid+`"`) {
			t.Errorf("GET %s (HTTP %d): no log line with its X-Request-Id %s", tc.path, code, rid)
		}
	}
	if _, rh, _ := h.do("GET", "/v1/documents/"+doc.GetId(), nil, "X-Request-Id", "bad id with spaces"); rh.Get("X-Request-Id") == "bad id with spaces" {
		t.Error("an invalid X-Request-Id was echoed")
	}
}
