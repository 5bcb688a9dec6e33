package gateway

import (
	"net/http"
	"reflect"
	"testing"

	"google.golang.org/genproto/googleapis/api/annotations"
)

// TestRouteTemplates: path templates with plain, patterned and trailing
// variables and verbs match the paths grpc-gateway serves.
func TestRouteTemplates(t *testing.T) {
	rs := appendRule(nil, &annotations.HttpRule{Pattern: &annotations.HttpRule_Post{Post: "/v1/{name=operations/*}:cancel"}, Body: "*"}, false)
	rs = appendRule(rs, &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/{name=operations/*}"}}, false)
	rs = appendRule(rs, &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/documents/{id}:watch"}}, false)
	rs = appendRule(rs, &annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: "/v1/files/{path=**}"},
		AdditionalBindings: []*annotations.HttpRule{{Pattern: &annotations.HttpRule_Delete{Delete: "/v1/files/{path=**}"}}}}, false)
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
	if !rs[0].noQuery || rs[1].noQuery {
		t.Errorf("noQuery: body * %v, GET with fields %v", rs[0].noQuery, rs[1].noQuery)
	}
}
