package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestResultHonoursAccept: GET /v1/documents/{id}/result serves the
// result's own type when Accept is absent or allows it, the same bytes as
// application/octet-stream when the client asks for that (generated
// clients do), and 406 with a google.rpc.Status naming both types
// otherwise. Vary: Accept on every answer.
func TestResultHonoursAccept(t *testing.T) {
	h := start(t, nil)
	want := []byte(`{"words":3}`)
	h.fake.result = func(id string) (string, int64, io.ReadCloser, bool) {
		return "application/json", int64(len(want)), io.NopCloser(bytes.NewReader(want)), true
	}
	path := "/v1/documents/d1/result"
	for _, tc := range []struct {
		accept, wantType string
	}{
		{"", "application/json"},
		{"*/*", "application/json"},
		{"application/*", "application/json"},
		{"application/json", "application/json"},
		{"application/octet-stream", "application/octet-stream"},
		{"text/plain, application/octet-stream;q=0.5", "application/octet-stream"},
		{"application/json;q=0.2, application/octet-stream;q=0.9", "application/octet-stream"},
		{"application/octet-stream;q=0.5, */*", "application/json"},
		{"application/json, application/octet-stream", "application/octet-stream"},
		{"application/octet-stream, application/json, text/plain", "application/octet-stream"},
		{"application/octet-stream;q=0.9, application/json", "application/json"},
		{"*", "application/json"},
		{"text/html, application/json;q=0.1", "application/json"},
		{"text/plain", ""},
		{"image/png, text/*", ""},
		{"application/json;q=0, application/octet-stream;q=0", ""},
	} {
		var hdr []string
		if tc.accept != "" {
			hdr = []string{"Accept", tc.accept}
		}
		code, rh, b := h.do("GET", path, nil, hdr...)
		if !strings.Contains(rh.Get("Vary"), "Accept") {
			t.Errorf("Accept %q: Vary %q, want Accept", tc.accept, rh.Get("Vary"))
		}
		if tc.wantType == "" {
			if code != http.StatusNotAcceptable || rh.Get("Content-Type") != "application/json" {
				t.Errorf("Accept %q: HTTP %d %s %s, want 406 application/json", tc.accept, code, rh.Get("Content-Type"), b)
				continue
			}
			st := decodeStatus(t, b)
			if st.reason() != gateway.ReasonNotAcceptable || !strings.Contains(st.Message, "application/json") ||
				!strings.Contains(st.Message, "application/octet-stream") {
				t.Errorf("Accept %q: 406 body %s, want reason %s naming both types", tc.accept, b, gateway.ReasonNotAcceptable)
			}
			continue
		}
		if code != http.StatusOK || rh.Get("Content-Type") != tc.wantType || !bytes.Equal(b, want) {
			t.Errorf("Accept %q: HTTP %d %q %q, want 200 %q with the result bytes", tc.accept, code, rh.Get("Content-Type"), b, tc.wantType)
		}
		if rh.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("Accept %q: nosniff missing", tc.accept)
		}
	}
}

// TestStreamsAreNDJSONWithOneErrorShape: watch answers
// application/x-ndjson lines of {"result": ...}; a stream refused before it
// started (unknown document) answers 404 with a bare google.rpc.Status as
// application/json, the shape unary routes and the spec use.
func TestStreamsAreNDJSONWithOneErrorShape(t *testing.T) {
	h := start(t, nil)
	d := h.fake.add(gatewayv1.State_PENDING, 1)
	code, rh, b := h.do("GET", "/v1/documents/"+d.GetId()+":watch", nil)
	if code != 200 || rh.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("watch: HTTP %d Content-Type %q, want 200 application/x-ndjson: %s", code, rh.Get("Content-Type"), b)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var env map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &env); err != nil || len(env) != 1 || env["result"] == nil {
			t.Errorf("watch line %q: want exactly {\"result\": ...}", line)
		}
	}
	for _, path := range []string{"/v1/documents/nope:watch", "/v1/events:subscribe?cursor=999999"} {
		code, rh, b = h.do("GET", path, nil)
		if code < 400 || rh.Get("Content-Type") != "application/json" {
			t.Errorf("%s: HTTP %d %q, want an error status as application/json", path, code, rh.Get("Content-Type"))
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(b, &top); err != nil || top["error"] != nil || top["code"] == nil || top["message"] == nil {
			t.Errorf("%s: body %s, want a bare google.rpc.Status {code, message, details}", path, b)
		}
	}
}

// TestWebSocketRejectionsAreJSONStatus: every rejection before the
// upgrade, whether the gateway's (bad cursor) or the WebSocket handshake's
// (not an upgrade 426, bad version 400, foreign Origin 403), is a JSON
// google.rpc.Status with the matching gRPC code, plus the AT sync draft's
// "error" name.
func TestWebSocketRejectionsAreJSONStatus(t *testing.T) {
	h := start(t, nil)
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	for _, tc := range []struct {
		name     string
		query    string
		hdr      []string
		httpCode int
		grpcCode int
		says     string
	}{
		{"bad cursor", "?cursor=abc", nil, 400, 3, "cursor"},
		{"plain GET", "", nil, 426, 9, "Upgrade"},
		{"bad version", "", append(upgrade, "Sec-WebSocket-Version", "7"), 400, 3, "version"},
		{"foreign origin", "", append(upgrade, "Sec-WebSocket-Version", "13", "Origin", "http://evil.example"), 403, 7, "Origin"},
	} {
		code, rh, b := h.do("GET", "/v1/events/ws"+tc.query, nil, tc.hdr...)
		var body struct {
			Code    int
			Message string
			Error   string
		}
		if err := json.Unmarshal(b, &body); err != nil || code != tc.httpCode || rh.Get("Content-Type") != "application/json" {
			t.Errorf("%s: HTTP %d %q %s, want %d application/json", tc.name, code, rh.Get("Content-Type"), b, tc.httpCode)
			continue
		}
		if body.Code != tc.grpcCode || body.Error == "" || !strings.Contains(body.Message, tc.says) {
			t.Errorf("%s: body %s, want code %d, an error name and a message about %q", tc.name, b, tc.grpcCode, tc.says)
		}
	}
}

// liveSpec is the served spec as generic JSON, for checking live answers.
type liveSpec struct {
	paths    map[string]any
	defs     map[string]any
	produces []any
}

func loadLiveSpec(t *testing.T, h *harness) liveSpec {
	t.Helper()
	code, _, b := h.do("GET", "/openapi.json", nil)
	var spec map[string]any
	if code != 200 || json.Unmarshal(b, &spec) != nil {
		t.Fatalf("GET /openapi.json: HTTP %d", code)
	}
	paths, _ := spec["paths"].(map[string]any)
	defs, _ := spec["definitions"].(map[string]any)
	produces, _ := spec["produces"].([]any)
	return liveSpec{paths: paths, defs: defs, produces: produces}
}

func (s liveSpec) op(tmpl, method string) map[string]any {
	p, _ := s.paths[tmpl].(map[string]any)
	o, _ := p[strings.ToLower(method)].(map[string]any)
	return o
}

// check reports where value v does not fit schema: a field the spec does
// not have, a type it does not declare, an enum value it does not list,
// a null where the field is not x-nullable.
func (s liveSpec) check(where string, schema map[string]any, v any) []string {
	if ref, ok := schema["$ref"].(string); ok {
		def, _ := s.defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
		if def == nil {
			return []string{where + ": $ref " + ref + " is not defined"}
		}
		if v == nil && schema["x-nullable"] == true {
			return nil
		}
		return s.check(where, def, v)
	}
	if v == nil {
		if schema["x-nullable"] == true {
			return nil
		}
		return []string{where + ": null, but the spec does not mark it x-nullable"}
	}
	typ, _ := schema["type"].(string)
	switch typ {
	case "object", "":
		return s.checkObject(where, typ, schema, v)
	case "array":
		arr, ok := v.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %T, the spec says array", where, v)}
		}
		items, _ := schema["items"].(map[string]any)
		var errs []string
		for i, e := range arr {
			errs = append(errs, s.check(fmt.Sprintf("%s[%d]", where, i), items, e)...)
		}
		return errs
	case "string":
		str, ok := v.(string)
		if !ok {
			return []string{fmt.Sprintf("%s: %T %v, the spec says string", where, v, v)}
		}
		if enum, ok := schema["enum"].([]any); ok && !slices.Contains(enum, any(str)) {
			return []string{fmt.Sprintf("%s: %q is not in the spec's enum %v", where, str, enum)}
		}
	case "integer", "number":
		if _, ok := v.(float64); !ok {
			return []string{fmt.Sprintf("%s: %T %v, the spec says %s", where, v, v, typ)}
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return []string{fmt.Sprintf("%s: %T %v, the spec says boolean", where, v, v)}
		}
	}
	return nil
}

// checkObject is check for an object schema (typ "" accepts any value
// that is not an object).
func (s liveSpec) checkObject(where, typ string, schema map[string]any, v any) []string {
	obj, ok := v.(map[string]any)
	if !ok {
		if typ == "" {
			return nil
		}
		return []string{fmt.Sprintf("%s: %T, the spec says object", where, v)}
	}
	props, _ := schema["properties"].(map[string]any)
	if props == nil {
		return nil // a free-form object (the spec itself)
	}
	var errs []string
	for k, fv := range obj {
		ps, ok := props[k].(map[string]any)
		if !ok {
			if schema["additionalProperties"] == nil {
				errs = append(errs, where+"."+k+": sent, but not in the spec")
			}
			continue
		}
		errs = append(errs, s.check(where+"."+k, ps, fv)...)
	}
	return errs
}

// probe is one live request of the walk and the spec operation it belongs to.
type probe struct {
	method, path, tmpl, body string
	hdr                      []string
}

// answer is what the walk saw for a probe.
type answer struct {
	probe
	code int
	hdr  http.Header
	body []byte
}

// walk sends every probe and checks each answer against the spec and the
// API's rules: X-Request-Id on every answer; a Content-Type the
// operation declares; a status it declares (or its default); a JSON body
// that fits the declared schema; an error body that is a google.rpc.Status
// with an ErrorInfo (reason, domain pipestream.gateway.v1) and no leaked
// "rpc error:" prefix. It returns the answers.
func walk(t *testing.T, h *harness, spec liveSpec, probes []probe) []answer {
	t.Helper()
	var out []answer
	for _, p := range probes {
		var body io.Reader
		if p.body != "" {
			body = strings.NewReader(p.body)
		}
		code, hdr, b := h.do(p.method, p.path, body, p.hdr...)
		a := answer{probe: p, code: code, hdr: hdr, body: b}
		out = append(out, a)
		where := fmt.Sprintf("%s %s -> %d", p.method, p.path, code)
		if hdr.Get("X-Request-Id") == "" {
			t.Errorf("%s: no X-Request-Id", where)
		}
		if code >= 400 {
			checkErrorShape(t, where, hdr, b)
		}
		o := spec.op(p.tmpl, p.method)
		if o == nil {
			if code < 400 {
				t.Errorf("%s: answered %d, but the spec has no %s %s", where, code, p.method, p.tmpl)
			}
			continue // a method the spec does not have: the error shape is all there is to check
		}
		checkAgainstSpec(t, spec, o, where, a)
	}
	return out
}

func checkErrorShape(t *testing.T, where string, hdr http.Header, b []byte) {
	t.Helper()
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: error as %q, want application/json", where, ct)
	}
	var st struct {
		Code    int
		Message string
		Details []struct {
			Type   string `json:"@type"`
			Reason string
			Domain string
		}
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Errorf("%s: error body is not JSON: %v: %s", where, err, b)
		return
	}
	if st.Code == 0 || st.Message == "" || strings.Contains(st.Message, "rpc error:") {
		t.Errorf("%s: error body %s: want a code, a message, no leaked rpc error prefix", where, b)
	}
	for _, d := range st.Details {
		if strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") && d.Reason != "" && d.Domain == "pipestream.gateway.v1" {
			return
		}
	}
	t.Errorf("%s: error body %s has no ErrorInfo with a reason and domain pipestream.gateway.v1", where, b)
}

func checkAgainstSpec(t *testing.T, spec liveSpec, o map[string]any, where string, a answer) {
	t.Helper()
	responses, _ := o["responses"].(map[string]any)
	resp, ok := responses[strconv.Itoa(a.code)].(map[string]any)
	if !ok {
		resp, ok = responses["default"].(map[string]any)
	}
	if !ok {
		t.Errorf("%s: the spec declares no %d (and no default) for this operation", where, a.code)
		return
	}
	produces, _ := o["produces"].([]any)
	if produces == nil {
		produces = spec.produces
	}
	mt, _, _ := mime.ParseMediaType(a.hdr.Get("Content-Type"))
	if a.code != http.StatusSwitchingProtocols && !slices.Contains(produces, any(mt)) {
		t.Errorf("%s: Content-Type %q is not among the operation's produces %v", where, mt, produces)
	}
	schema, _ := resp["schema"].(map[string]any)
	if mt != "application/json" || schema == nil {
		return
	}
	var v any
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Errorf("%s: body is not JSON: %v", where, err)
		return
	}
	for _, e := range spec.check("body", schema, v) {
		t.Errorf("%s: %s", where, e)
	}
}

// TestLiveAnswersMatchTheSpec walks every operation of the served spec
// with good and bad input and checks every answer against the spec (both
// success and error bodies, field by field) and the one error shape; every
// operation must be walked with a success and, where it declares an
// error, with that error. Unknown query parameters, unknown ids,
// malformed bodies and wrong methods are tried on every route.
func TestLiveAnswersMatchTheSpec(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.MaxJSONBodyBytes, c.MaxUploadBytes = 4096, 1024 })
	spec := loadLiveSpec(t, h)
	done := h.fake.add(gatewayv1.State_SUCCEEDED, 3).GetId()
	running := h.fake.add(gatewayv1.State_RUNNING, 3).GetId()
	running2 := h.fake.add(gatewayv1.State_RUNNING, 3).GetId()
	json := []string{"Content-Type", "application/json"}
	page := []string{"Accept", "application/json"}
	good := []probe{
		{"POST", "/v1/documents", "/v1/documents", `{"content":"aGVsbG8=","contentType":"text/plain"}`, json},
		{"POST", "/v1/documents:upload?contentType=text/plain", "/v1/documents:upload", "hello", []string{"Content-Type", "application/octet-stream"}},
		{"GET", "/v1/documents?pageSize=10", "/v1/documents", "", nil},
		{"GET", "/v1/documents/" + done, "/v1/documents/{id}", "", nil},
		{"GET", "/v1/documents/" + done + "/result", "/v1/documents/{id}/result", "", nil},
		{"POST", "/v1/documents/" + running + ":cancel", "/v1/documents/{id}:cancel", "{}", json},
		{"GET", "/v1/documents/" + done + ":watch?waitSeconds=5", "/v1/documents/{id}:watch", "", page},
		{"GET", "/v1/documents/" + done + ":watch", "/v1/documents/{id}:watch", "", nil},                                     // NDJSON; the fake's watch ends
		{"GET", "/v1/documents/" + done + ":watch", "/v1/documents/{id}:watch", "", []string{"Accept", "text/event-stream"}}, // SSE
		{"GET", "/v1/claims/42", "/v1/claims/{claimId}", "", nil},
		{"POST", "/v1/claims/42:redeem", "/v1/claims/{claimId}:redeem", "{}", json},
		{"GET", "/v1/events:window", "/v1/events:window", "", nil},
		{"GET", "/v1/events:snapshot", "/v1/events:snapshot", "", nil},
		{"GET", "/v1/events:streamSnapshot", "/v1/events:streamSnapshot", "", nil},
		{"GET", "/v1/events:streamSnapshot?pageSize=1", "/v1/events:streamSnapshot", "", page},
		{"GET", "/v1/events:streamSnapshot", "/v1/events:streamSnapshot", "", []string{"Accept", "text/event-stream"}},
		{"GET", "/v1/events:subscribe?cursor=18&waitSeconds=5", "/v1/events:subscribe", "", page},
		{"POST", "/v1/events:ticket", "/v1/events:ticket", "", nil},
		{"GET", "/v1/operations", "/v1/operations", "", nil},
		{"GET", "/v1/operations/" + done, "/v1/operations/{id}", "", nil},
		{"POST", "/v1/operations/" + done + ":wait", "/v1/operations/{id}:wait", `{"timeout":"1s"}`, json},
		{"POST", "/v1/operations/" + running2 + ":cancel", "/v1/operations/{id}:cancel", "{}", json},
		{"GET", "/healthz", "/healthz", "", nil},
		{"GET", "/metrics", "/metrics", "", nil},
		{"GET", "/openapi.json", "/openapi.json", "", nil},
		{"GET", "/docs/", "/docs/", "", nil},
		{"GET", "/ui/", "/ui/", "", nil},
	}
	bad := []probe{
		{"POST", "/v1/documents", "/v1/documents", `{"bogus":1}`, json},
		{"POST", "/v1/documents", "/v1/documents", `{"content":"aGk=","requestId":"reused"}`, json},
		{"POST", "/v1/documents", "/v1/documents", `{"content":"` + strings.Repeat("A", 64<<10) + `"}`, json},
		{"POST", "/v1/documents:upload?bogus=1", "/v1/documents:upload", "x", nil},
		{"POST", "/v1/documents:upload?contentType=text/plain", "/v1/documents:upload", strings.Repeat("x", 2048), nil},
		{"POST", "/v1/documents:upload?contentType=text/plain&requestId=reused", "/v1/documents:upload", "x", nil},
		{"GET", "/v1/documents?pageSize=-1", "/v1/documents", "", nil},
		{"GET", "/v1/documents/nope", "/v1/documents/{id}", "", nil},
		{"GET", "/v1/documents/nope/result", "/v1/documents/{id}/result", "", nil},
		{"GET", "/v1/documents/" + running + "/result", "/v1/documents/{id}/result", "", nil},
		{"GET", "/v1/documents/" + done + "/result", "/v1/documents/{id}/result", "", []string{"Accept", "image/png"}},
		{"POST", "/v1/documents/nope:cancel", "/v1/documents/{id}:cancel", "{}", json},
		{"POST", "/v1/documents/" + done + ":cancel", "/v1/documents/{id}:cancel", "{}", json},
		{"GET", "/v1/documents/nope:watch", "/v1/documents/{id}:watch", "", nil},
		{"GET", "/v1/documents/nope:watch", "/v1/documents/{id}:watch", "", page},
		{"GET", "/v1/documents/nope:watch", "/v1/documents/{id}:watch", "", []string{"Accept", "text/event-stream"}},
		{"GET", "/v1/claims/9", "/v1/claims/{claimId}", "", nil},
		{"POST", "/v1/claims/9:redeem", "/v1/claims/{claimId}:redeem", "{}", json},
		{"POST", "/v1/claims/1:redeem", "/v1/claims/{claimId}:redeem", "{}", json},
		{"GET", "/v1/events:subscribe?cursor=999", "/v1/events:subscribe", "", nil},
		{"GET", "/v1/events:subscribe?cursor=999", "/v1/events:subscribe", "", page},
		{"GET", "/v1/events:subscribe?kinds=status", "/v1/events:subscribe", "", page},
		{"GET", "/v1/events/ws", "/v1/events/ws", "", nil},
		{"GET", "/v1/events/ws?cursor=x", "/v1/events/ws", "", nil},
		{"GET", "/v1/events/ws?bogus=1", "/v1/events/ws", "", []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version", "13"}},
		{"GET", "/v1/events/ws", "/v1/events/ws", "", []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version", "13", "Origin", "http://evil.example"}},
		{"GET", "/v1/events/ws", "/v1/events/ws", "", []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version", "7"}},
		{"GET", "/v1/operations?filter=x", "/v1/operations", "", nil},
		{"GET", "/v1/operations/nope", "/v1/operations/{id}", "", nil},
		{"POST", "/v1/operations/nope:wait", "/v1/operations/{id}:wait", "{}", json},
		{"POST", "/v1/operations/" + done + ":wait", "/v1/operations/{id}:wait", `{"timeout":"x"}`, json},
		{"POST", "/v1/operations/nope:cancel", "/v1/operations/{id}:cancel", "{}", json},
		{"DELETE", "/v1/operations/" + done, "/v1/operations/{id}", "", nil},
		{"GET", "/v1/nothing", "", "", nil},
		{"GET", "/v1/documents/%ff", "/v1/documents/{id}", "", nil},
	}
	// Every operation: an unknown query parameter, and a method it does not have.
	for tmpl, methods := range spec.paths {
		path := strings.NewReplacer("{id}", done, "{claimId}", "42").Replace(tmpl)
		for m := range methods.(map[string]any) {
			if !strings.HasPrefix(tmpl, "/v1/") {
				continue // /healthz, /metrics, the spec, docs and console ignore the query
			}
			bad = append(bad, probe{strings.ToUpper(m), path + "?bogus=1", tmpl, "{}", json})
		}
		if _, hasPut := methods.(map[string]any)["put"]; !hasPut && strings.HasPrefix(tmpl, "/v1/") {
			bad = append(bad, probe{"PUT", path, tmpl, "{}", json})
		}
	}
	answers := walk(t, h, spec, append(good, bad...))
	answers = append(answers, upgradeWebSocket(t, h, spec))

	checkUnknownParameters(t, answers)

	// Coverage: every operation answered a success, and every error
	// status it declares was seen or is one the walk cannot cause here.
	// 401 is walked by TestUnauthenticatedAnswersMatchTheSpec; limits
	// (429) and an unavailable bridge (503) by their own tests.
	unreachable := map[string]bool{"401": true, "429": true, "503": true, "default": true}
	seen := map[string]map[string]bool{}
	for _, a := range answers {
		if spec.op(a.tmpl, a.method) == nil {
			continue
		}
		k := a.method + " " + a.tmpl
		if seen[k] == nil {
			seen[k] = map[string]bool{}
		}
		seen[k][strconv.Itoa(a.code)] = true
	}
	for tmpl, methods := range spec.paths {
		for m, o := range methods.(map[string]any) {
			k := strings.ToUpper(m) + " " + tmpl
			if !seen[k]["200"] && !seen[k]["101"] && k != "DELETE /v1/operations/{id}" { // DeleteOperation is not supported (501)
				t.Errorf("%s: the walk saw no success (saw %v)", k, seen[k])
			}
			for code := range o.(map[string]any)["responses"].(map[string]any) {
				if code >= "400" && !unreachable[code] && !seen[k][code] {
					t.Errorf("%s: declares %s, which the walk never saw (saw %v): add a probe", k, code, seen[k])
				}
			}
		}
	}
}

// checkUnknownParameters: an unknown query parameter is refused with 400
// naming it, on every API operation (PUT and other methods a route lacks
// are refused before the query, 405; so is a WebSocket request that is no
// handshake, 426).
func checkUnknownParameters(t *testing.T, answers []answer) {
	t.Helper()
	for _, a := range answers {
		if !strings.HasSuffix(a.path, "?bogus=1") || a.method == "PUT" || a.hdr.Get("Allow") != "" || (a.tmpl == "/v1/events/ws" && a.code == http.StatusUpgradeRequired) {
			continue
		}
		if a.code != http.StatusBadRequest || !strings.Contains(string(a.body), "bogus") {
			t.Errorf("%s %s: HTTP %d %s, want 400 naming the unknown parameter", a.method, a.path, a.code, a.body)
		}
	}
}

// upgradeWebSocket is the walk's successful WebSocket upgrade, with a real
// WebSocket client: 101 with the client's X-Request-Id, then one event.
func upgradeWebSocket(t *testing.T, h *harness, spec liveSpec) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := probe{"GET", "/v1/events/ws?cursor=0", "/v1/events/ws", "", []string{"X-Request-Id", "walk-ws"}}
	c, resp, err := websocket.Dial(ctx, "ws://"+strings.TrimPrefix(h.base, "http://")+p.path,
		&websocket.DialOptions{HTTPHeader: http.Header{"X-Request-Id": {"walk-ws"}}})
	if err != nil {
		t.Fatalf("WebSocket upgrade: %v", err)
	}
	defer c.CloseNow()
	if _, _, err := c.Read(ctx); err != nil {
		t.Errorf("WebSocket: no first event: %v", err)
	}
	a := answer{probe: p, code: resp.StatusCode, hdr: resp.Header}
	where := fmt.Sprintf("GET %s -> %d", p.path, a.code)
	if got := resp.Header.Values("X-Request-Id"); len(got) != 1 || got[0] != "walk-ws" {
		t.Errorf("%s: X-Request-Id %v, want [walk-ws]", where, got)
	}
	checkAgainstSpec(t, spec, spec.op(p.tmpl, p.method), where, a)
	return a
}

// TestUnauthenticatedAnswersMatchTheSpec: with tokens configured, every
// API operation called without one answers 401 in the one error shape
// (reason MISSING_CREDENTIALS), as the spec declares, with X-Request-Id.
func TestUnauthenticatedAnswersMatchTheSpec(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string]string{"tok-a": "acme"})
	tf, err := gateway.LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Authenticator = tf })
	spec := loadLiveSpec(t, h)
	var probes []probe
	for tmpl, methods := range spec.paths {
		if !strings.HasPrefix(tmpl, "/v1/") {
			continue
		}
		p := strings.NewReplacer("{id}", "d1", "{claimId}", "42").Replace(tmpl)
		hdr := []string{"Content-Type", "application/json", "Accept", "application/json"}
		if tmpl == "/v1/events/ws" {
			hdr = []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version", "13"}
		}
		for m := range methods.(map[string]any) {
			probes = append(probes, probe{strings.ToUpper(m), p, tmpl, "{}", hdr})
		}
	}
	for _, a := range walk(t, h, spec, probes) {
		if a.code != http.StatusUnauthorized || !strings.Contains(string(a.body), gateway.ReasonMissingCredentials) {
			t.Errorf("%s %s without a token: HTTP %d %s, want 401 %s", a.method, a.path, a.code, a.body, gateway.ReasonMissingCredentials)
		}
	}
}
