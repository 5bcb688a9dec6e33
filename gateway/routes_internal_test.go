package gateway

import (
	"net/http"
	"reflect"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/genproto/googleapis/api/annotations"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestRouteTemplates: path templates with plain, patterned and trailing
// variables and verbs match the paths grpc-gateway serves.
func TestRouteTemplates(t *testing.T) {
	cancelReq := (&longrunningpb.CancelOperationRequest{}).ProtoReflect().Descriptor()
	getReq := (&longrunningpb.GetOperationRequest{}).ProtoReflect().Descriptor()
	watchReq := (&gatewayv1.WatchDocumentRequest{}).ProtoReflect().Descriptor()
	rs := appendRule(nil, &annotations.HttpRule{Pattern: &annotations.HttpRule_Post{Post: "/v1/{name=operations/*}:cancel"}, Body: "*"}, cancelReq)
	rs = appendRule(rs, &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/{name=operations/*}"}}, getReq)
	rs = appendRule(rs, &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/documents/{id}:watch"}}, watchReq)
	rs = appendRule(rs, &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/files/{path=**}"},
		AdditionalBindings: []*annotations.HttpRule{{Pattern: &annotations.HttpRule_Delete{Delete: "/v1/files/{path=**}"}}}}, nil)
	for path, want := range map[string][]string{
		"/v1/operations/abc:cancel": {http.MethodGet, http.MethodOptions, http.MethodPost}, // GET: the name "abc:cancel"
		"/v1/operations/abc":        {http.MethodGet, http.MethodOptions},
		"/v1/operations":            nil,
		"/v1/documents/x:watch":     {http.MethodGet, http.MethodOptions},
		"/v1/documents/x":           nil,
		"/v1/files/a/b/c":           {http.MethodDelete, http.MethodGet, http.MethodOptions},
	} {
		if got := allowedMethods(rs, path); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	// noQuery: the body is the request; every field is in the path
	// ({name=...}); cursor and others are left to the query.
	if !rs[0].noQuery || !rs[1].noQuery || rs[2].noQuery {
		t.Errorf("noQuery: body * %v, GET with its one field in the path %v, GET with query fields %v", rs[0].noQuery, rs[1].noQuery, rs[2].noQuery)
	}
}
