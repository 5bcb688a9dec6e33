package e2e

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"mime"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// swaggerVersion is the go-swagger release that generates the client
// (.ci/setup.sh, run by .ci/test.sh). v0.31 and older do not build with Go 1.26.
const swaggerVersion = "v0.36.7"

var toolSwagger = tool{
	name: "go-swagger", env: "E2E_SWAGGER", candidates: []string{"swagger"},
	install: "go install github.com/go-swagger/go-swagger/cmd/swagger@" + swaggerVersion,
}

// genclientMain is the program that drives the generated client
// (testdata/genclient/main.go); it is compiled next to the generated
// packages in a temporary module.
//
//go:embed testdata/genclient/main.go
var genclientMain []byte

// genclientReport is what testdata/genclient prints.
type genclientReport struct {
	Input      []byte            `json:"input"`
	Operations map[string]string `json:"operations"`
	Results    []struct {
		Processor   string `json:"processor"`
		ID          string `json:"id"`
		State       string `json:"state"`
		ContentType string `json:"contentType"`
		Size        int64  `json:"size"`
		Bytes       []byte `json:"bytes"`
	} `json:"results"`
	Messages map[string]int `json:"messages"`
}

// servedSpec is what the test reads of GET /openapi.json.
type servedSpec struct {
	Paths map[string]map[string]struct {
		OperationID string   `json:"operationId"`
		Produces    []string `json:"produces"`
	} `json:"paths"`
	Definitions map[string]struct {
		Properties map[string]struct {
			Enum []string `json:"enum"`
		} `json:"properties"`
	} `json:"definitions"`
}

// TestGeneratedClient generates a Go client with go-swagger from the spec
// the running gateway serves (GET /openapi.json), compiles it, and runs
// every operation of that spec through it (testdata/genclient): submit,
// upload, get, list, watch (long-polled JSON pages), result, cancel, claim
// checks, the event window, snapshot (and the streamed snapshot as JSON
// pages with nextPageToken), the subscription (JSON pages), WebSocket
// ticket and upgrade, health, metrics, the spec, docs and console; typed
// errors (404, 400) decode into their google.rpc.Status. Every processor
// the spec lists runs end to end (the fault processor through its claim
// check) and its result, downloaded through the generated client, is
// compared byte for byte with curl's download and with what the processor
// makes of the input. The client is generated into a temporary directory
// on every run (about a minute on 2 busy cores, most of it go-swagger and
// fetching go-openapi through the module proxy), so the check follows the
// spec as served, not a stale copy.
func TestGeneratedClient(t *testing.T) {
	swagger := need(t, toolSwagger)
	g := shared(t)
	specResp := curl(t, "GET", g.baseURL()+"/openapi.json", nil)
	wantOK(t, "GET /openapi.json", specResp)
	var spec servedSpec
	if err := json.Unmarshal(specResp.body, &spec); err != nil {
		t.Fatalf("served spec is not JSON: %v", err)
	}
	processors := spec.Definitions["SplitOptions"].Properties["processor"].Enum
	if len(processors) == 0 {
		t.Fatal("the served spec lists no processors (SplitOptions.processor enum): a client cannot know what to ask for")
	}
	checkProcessorsComplete(t, g, processors)

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "openapi.json"), specResp.body)
	writeFile(t, filepath.Join(dir, "go.mod"), []byte("module pipestream.test/genclient\n\ngo 1.26\n"))
	writeFile(t, filepath.Join(dir, "main.go"), genclientMain)
	step := func(what string, timeout time.Duration, bin string, args ...string) []byte {
		t.Helper()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", what, err, stderr.Bytes(), tail(stdout.Bytes(), 4000))
		}
		t.Logf("%s: %v", what, time.Since(start).Round(100*time.Millisecond))
		return stdout.Bytes()
	}
	step("swagger generate client", 5*time.Minute, swagger, "generate", "client", "-f", "openapi.json", "-A", "pipestream", "-t", ".", "-q")
	step("go mod tidy", 5*time.Minute, "go", "mod", "tidy")
	step("go build", 5*time.Minute, "go", "build", "-o", "genclient", ".")
	procs := append([]string(nil), processors...)
	out := step("generated client against the gateway", 3*time.Minute, filepath.Join(dir, "genclient"),
		"-base", g.baseURL(), "-processors", strings.Join(procs, ","))
	var rep genclientReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("genclient report is not JSON: %v\n%s", err, tail(out, 4000))
	}
	checkOperations(t, spec, rep)
	checkResults(t, g, spec, rep, processors)
}

// checkProcessorsComplete: the server's own list (the 400 for an unknown
// processor names every processor it accepts) is the spec's enum.
func checkProcessorsComplete(t *testing.T, g *gatewayProc, processors []string) {
	t.Helper()
	r := curlJSON(t, "POST", g.baseURL()+"/v1/documents", map[string]any{
		"content": b64([]byte("x")), "split": map[string]any{"processor": "no-such-processor"}})
	st := wantError(t, "unknown processor", r, 400, 3, "", "processor")
	for _, p := range processors {
		if !strings.Contains(st.Message, p) {
			t.Errorf("the gateway's processors (%q) do not include %s, which the spec lists", st.Message, p)
		}
	}
	if n := strings.Count(st.Message, ",") + strings.Count(st.Message, " or "); n+1 != len(processors) {
		t.Errorf("the gateway names %d processors (%q), the spec %d (%v)", n+1, st.Message, len(processors), processors)
	}
}

// checkOperations: every operation of the served spec ran and succeeded;
// the driver ran none the spec does not have.
func checkOperations(t *testing.T, spec servedSpec, rep genclientReport) {
	t.Helper()
	var want []string
	for _, methods := range spec.Paths {
		for _, op := range methods {
			want = append(want, op.OperationID)
		}
	}
	sort.Strings(want)
	for _, id := range want {
		switch outcome, ran := rep.Operations[id]; {
		case !ran:
			t.Errorf("operation %s of the served spec never ran through the generated client: extend e2e/testdata/genclient", id)
		case outcome != "ok":
			t.Errorf("operation %s through the generated client: %s", id, outcome)
		}
	}
	for id := range rep.Operations {
		if !containsStr(want, id) {
			t.Errorf("the driver ran %s, which the served spec does not have", id)
		}
	}
	if rep.Messages["DocumentService_WatchDocument"] == 0 || rep.Messages["EventService_SubscribeEvents"] != 3 ||
		rep.Messages["EventService_StreamSnapshot"] < 3 {
		t.Errorf("stream messages read as JSON pages through the generated client: %v, want watch > 0, subscribe 3, snapshot documents >= 3 (pages of 2)", rep.Messages)
	}
	t.Logf("%d operations ran through the generated client", len(want))
}

// checkResults: every processor's document SUCCEEDED, and its result as
// the generated client got it (application/octet-stream: the client lists
// it in Accept) equals curl's download (the result's own type, which the
// spec must list) and what the processor makes of the input.
func checkResults(t *testing.T, g *gatewayProc, spec servedSpec, rep genclientReport, processors []string) {
	t.Helper()
	produces := spec.Paths["/v1/documents/{id}/result"]["get"].Produces
	seen := map[string]bool{}
	for _, r := range rep.Results {
		seen[r.Processor] = true
		if r.State != "SUCCEEDED" {
			t.Errorf("%s: document %s ended %s, want SUCCEEDED", r.Processor, r.ID, r.State)
			continue
		}
		if r.ContentType != "application/octet-stream" || r.Size != int64(len(r.Bytes)) || len(r.Bytes) == 0 {
			t.Errorf("%s: generated client got %d bytes as %q with Content-Length %d, want the bytes as application/octet-stream",
				r.Processor, len(r.Bytes), r.ContentType, r.Size)
		}
		c := curl(t, "GET", g.baseURL()+"/v1/documents/"+r.ID+"/result", nil)
		wantOK(t, "curl result of "+r.Processor, c)
		if !bytes.Equal(c.body, r.Bytes) {
			t.Errorf("%s: generated client got %q, curl %q", r.Processor, tail(r.Bytes, 300), tail(c.body, 300))
		}
		ct := headerOf(c.headers, "Content-Type")
		if mt, _, err := mime.ParseMediaType(ct); err != nil || !containsStr(produces, mt) {
			t.Errorf("%s: the result is served as %q, which the spec's produces %v does not list", r.Processor, ct, produces)
		}
		checkProcessorOutput(t, r.Processor, rep.Input, r.Bytes)
	}
	for _, p := range processors {
		if !seen[p] {
			t.Errorf("processor %s: no result through the generated client", p)
		}
	}
}

// checkProcessorOutput compares a result with what its processor makes of
// the input (docs/profile.md 4.4).
func checkProcessorOutput(t *testing.T, processor string, input, got []byte) {
	t.Helper()
	switch processor {
	case "passthrough", "fault": // fault: the deferred entity, redeemed, passes through
		if !bytes.Equal(got, input) {
			t.Errorf("%s: result %q, want the input %q", processor, got, input)
		}
	case "sentences":
		want := "Generated clients work.\nThe spec tells the truth!\nDoes every result arrive?\n"
		if string(got) != want {
			t.Errorf("sentences: result %q, want %q", got, want)
		}
	case "textstats":
		var st struct{ Bytes, Words, Sentences int }
		if err := json.Unmarshal(got, &st); err != nil || st.Bytes != len(input) || st.Words != 12 || st.Sentences != 3 {
			t.Errorf("textstats: result %s (%v), want bytes %d, words 12, sentences 3", got, err, len(input))
		}
	default:
		t.Errorf("processor %s: the test does not know its output; add it to checkProcessorOutput", processor)
	}
}

// headerOf returns the last value of header name in curl's -D dump.
func headerOf(dump, name string) string {
	v := ""
	for _, line := range strings.Split(dump, "\n") {
		k, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(k)) == textproto.CanonicalMIMEHeaderKey(name) {
			v = strings.TrimSpace(val)
		}
	}
	return v
}

func containsStr(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
