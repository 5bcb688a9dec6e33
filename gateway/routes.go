package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// route is one REST route: an HTTP method and a google.api.http path
// template ("/v1/documents/{id}:watch").
type route struct {
	method string
	segs   []string // the template's segments, "{x}" for a variable
	verb   string   // after the last ':' of the last segment, or ""
	// noQuery: the route reads no query parameters (its request has no
	// fields, or the body is the whole request), so any is a mistake.
	noQuery bool
}

// extraRoutes are the REST routes that are not google.api.http rules of
// a gRPC method (http.go); noQuery as in route.
var extraRoutes = []struct {
	route   string
	noQuery bool
}{
	{"POST /v1/events:ticket", true},
	{"GET /v1/events/ws", false},            // cursor, kinds, documentId, ticket (wsSubscribeRequest)
	{"POST /v1/operations/{id}:wait", true}, // googleapis gives WaitOperation no HTTP rule (operations_http.go); the body is the request
}

// restRoutes lists the routes of the google.api.http rules of the gRPC
// services registered on the server, plus extraRoutes: a new RPC with an
// HTTP rule is known without a change here.
func (s *Server) restRoutes() []route {
	var rs []route
	for name := range s.grpc.GetServiceInfo() {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			continue
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			continue
		}
		for i := 0; i < sd.Methods().Len(); i++ {
			md := sd.Methods().Get(i)
			rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
			rs = appendRule(rs, rule, md.Input())
		}
	}
	for _, e := range extraRoutes {
		m, p, _ := strings.Cut(e.route, " ")
		r := newRoute(m, p)
		r.noQuery = e.noQuery
		rs = append(rs, r)
	}
	return rs
}

// appendRule appends the routes of rule (and its additional bindings),
// whose request message is in (nil: a request without fields).
func appendRule(rs []route, rule *annotations.HttpRule, in protoreflect.MessageDescriptor) []route {
	if rule == nil {
		return rs
	}
	start := len(rs)
	pairs := map[string]string{
		http.MethodGet: rule.GetGet(), http.MethodPost: rule.GetPost(), http.MethodPut: rule.GetPut(),
		http.MethodDelete: rule.GetDelete(), http.MethodPatch: rule.GetPatch(),
	}
	tmpl := ""
	for m, p := range pairs {
		if p != "" {
			rs = append(rs, newRoute(m, p))
			tmpl = p
		}
	}
	if c := rule.GetCustom(); c != nil && c.GetPath() != "" {
		rs = append(rs, newRoute(c.GetKind(), c.GetPath()))
		tmpl = c.GetPath()
	}
	for i := start; i < len(rs); i++ {
		rs[i].noQuery = queryFree(rule, tmpl, in)
	}
	for _, b := range rule.GetAdditionalBindings() {
		rs = appendRule(rs, b, in)
	}
	return rs
}

// queryFree reports whether a rule leaves no field of its request to the
// query: the body is the whole request, or every field is a path
// variable or the body field. grpc-gateway's generated handlers then
// parse no query, so strictQueryParser never sees a stray parameter.
func queryFree(rule *annotations.HttpRule, tmpl string, in protoreflect.MessageDescriptor) bool {
	if rule.GetBody() == "*" || in == nil {
		return true
	}
	bound := map[string]bool{rule.GetBody(): true}
	for _, v := range templateVar.FindAllString(tmpl, -1) {
		name, _, _ := strings.Cut(strings.Trim(v, "{}"), "=")
		name, _, _ = strings.Cut(name, ".")
		bound[name] = true
	}
	for i := 0; i < in.Fields().Len(); i++ {
		if !bound[string(in.Fields().Get(i).Name())] {
			return false
		}
	}
	return true
}

// templateVar is a variable of a path template: {x} or {x=pattern}.
var templateVar = regexp.MustCompile(`\{[^}=]+(=([^}]*))?\}`)

// newRoute parses a google.api.http path template: variables become
// their pattern ({x}: *, {name=operations/*}: operations/*).
func newRoute(method, tmpl string) route {
	r := route{method: method}
	tmpl = templateVar.ReplaceAllStringFunc(tmpl, func(v string) string {
		if m := templateVar.FindStringSubmatch(v); m[2] != "" {
			return m[2]
		}
		return "*"
	})
	if i := strings.LastIndex(tmpl, ":"); i > strings.LastIndex(tmpl, "/") {
		tmpl, r.verb = tmpl[:i], tmpl[i+1:]
	}
	r.segs = strings.Split(strings.TrimPrefix(tmpl, "/"), "/")
	return r
}

// matches reports whether path fits the template (* is one segment, **
// the rest).
func (r route) matches(path string) bool {
	comps := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if r.verb != "" {
		last, ok := strings.CutSuffix(comps[len(comps)-1], ":"+r.verb)
		if !ok {
			return false
		}
		comps[len(comps)-1] = last
	}
	for i, seg := range r.segs {
		if strings.Contains(seg, "**") {
			return i < len(comps)
		}
		if i >= len(comps) || comps[i] == "" {
			return false
		}
		if seg != "*" && seg != comps[i] {
			return false
		}
	}
	return len(comps) == len(r.segs)
}

// allowedMethods returns the methods of the routes that match path,
// sorted ("" when none does).
func allowedMethods(routes []route, path string) []string {
	var ms []string
	for _, r := range routes {
		if r.matches(path) {
			ms = append(ms, r.method)
		}
	}
	if len(ms) > 0 {
		ms = append(ms, http.MethodOptions)
	}
	slices.Sort(ms)
	return slices.Compact(ms)
}

// refuseStrayQuery answers 400 to a request with query parameters on a
// route that reads none (grpc-gateway does not parse the query there, so
// strictQueryParser cannot see them).
func (s *Server) refuseStrayQuery(routes []route, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			for _, rt := range routes {
				if rt.noQuery && rt.method == r.Method && rt.matches(r.URL.Path) {
					s.writeStatus(w, r, http.StatusBadRequest, invalid(fmt.Sprintf(
						"%s %s takes no query parameters (got %q): send the request fields in the JSON body, if any", r.Method, r.URL.Path, r.URL.RawQuery)))
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// routingErrorHandler answers a request that matches no REST route: 405
// with an Allow header when the path is known under other methods, else
// 404 naming the path. grpc-gateway's default answers 501 for the former.
func (s *Server) routingErrorHandler(routes []route) runtime.RoutingErrorHandlerFunc {
	return func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, code int) {
		var err error
		switch allowed := allowedMethods(routes, r.URL.Path); {
		case len(allowed) > 0:
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			err = &runtime.HTTPStatusError{HTTPStatus: http.StatusMethodNotAllowed, Err: statusError(codes.Unimplemented, ReasonMethodNotAllowed,
				fmt.Sprintf("method %s is not allowed on %s: use %s", r.Method, r.URL.Path, strings.Join(allowed, " or ")))}
		case code == http.StatusBadRequest:
			err = status.Error(codes.InvalidArgument, "the request path is malformed")
		default:
			err = statusError(codes.NotFound, ReasonRouteNotFound, fmt.Sprintf("no route %s %s: the API is under /v1/ (see /openapi.json, /docs/)", r.Method, r.URL.Path))
		}
		if hse, ok := err.(*runtime.HTTPStatusError); ok {
			s.logRefusal(r, hse.HTTPStatus, hse.Err)
		} else {
			s.logRefusal(r, runtime.HTTPStatusFromCode(status.Code(err)), err)
		}
		httpErrorHandler(ctx, mux, m, w, r, err)
	}
}

// indexBody is the JSON of GET /: where things are.
type indexBody struct {
	Name    string            `json:"name"`
	Links   map[string]string `json:"links"`
	Console string            `json:"console"`
}

// handleIndex serves GET /: browsers (Accept: text/html) are redirected
// to the console at /ui/; other clients get a small JSON index of the
// console, the API docs, the OpenAPI spec, health and metrics.
func handleIndex(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, "/ui/", http.StatusFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(indexBody{
		Name:    "PipeStream gateway",
		Console: "/ui/",
		Links: map[string]string{
			"console": "/ui/", "docs": "/docs/", "openapi": "/openapi.json",
			"health": "/healthz", "metrics": "/metrics", "documents": "/v1/documents",
		},
	})
}
