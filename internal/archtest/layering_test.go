// Package archtest enforces the package layering of docs/architecture.md,
// "Layers".
package archtest

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/pipestream/gateway"

// rule says which project packages a folder's packages may import. Imports
// outside the module (standard library, third-party libraries) are always
// allowed.
type rule struct {
	from  string   // folder prefix, relative to the module root
	allow []string // folder prefixes it may import (itself is implied)
}

var rules = []rule{
	{from: "gen/", allow: []string{"gen/"}},
	{from: "openapi", allow: []string{"gen/"}},
	{from: "quicpeer", allow: []string{"gen/pipestream/protocol/"}},
	// internal/pgtest: the throwaway PostgreSQL cluster of the store's
	// tests; internal/cputime: CPU time for the store's benchmarks (both
	// import nothing of the project).
	{from: "bridge", allow: []string{"quicpeer", "gen/", "internal/pgtest", "internal/cputime"}},
	{from: "gateway", allow: []string{"bridge", "gen/", "openapi"}},
	{from: "e2e", allow: []string{"gen/"}},
	// internal/conformance: the reference suite's command contract, on
	// the wire codec only.
	{from: "internal/conformance", allow: []string{"quicpeer"}},
}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func TestLayering(t *testing.T) {
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports", module+"/...")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, errb.String())
	}
	dec := json.NewDecoder(&out)
	checked := 0
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		r, ok := ruleFor(rel)
		if !ok {
			continue // cmd/ and internal/ (serve, bench, archtest) may import everything
		}
		checked++
		imports := append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...)
		for _, imp := range imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			target := strings.TrimPrefix(imp, module+"/")
			if !allowed(r, target) {
				t.Errorf("%s imports %s: %s may import only %v (docs/architecture.md, Layers)", rel, target, r.from, r.allow)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no project packages found; is the module path right?")
	}
}

func ruleFor(rel string) (rule, bool) {
	for _, r := range rules {
		if rel == strings.TrimSuffix(r.from, "/") || strings.HasPrefix(rel, strings.TrimSuffix(r.from, "/")+"/") {
			return r, true
		}
	}
	return rule{}, false
}

func allowed(r rule, target string) bool {
	if target == strings.TrimSuffix(r.from, "/") || strings.HasPrefix(target, strings.TrimSuffix(r.from, "/")+"/") {
		return true
	}
	for _, a := range r.allow {
		a2 := strings.TrimSuffix(a, "/")
		if target == a2 || strings.HasPrefix(target, a2+"/") || (strings.HasSuffix(a, "/") && strings.HasPrefix(target, a)) {
			return true
		}
	}
	return false
}

// TestRulesCatchViolations proves the checker can fail.
func TestRulesCatchViolations(t *testing.T) {
	cases := []struct {
		from, to string
		ok       bool
	}{
		{"quicpeer/wire", "bridge", false},
		{"quicpeer", "gateway", false},
		{"quicpeer/peer", "gen/pipestream/gateway/v1", false},
		{"quicpeer/wire", "gen/pipestream/protocol/v1", true},
		{"bridge/store", "gateway", false},
		{"bridge", "quicpeer/wire", true},
		{"gateway", "quicpeer", false},
		{"gateway", "bridge/eventlog", true},
		{"e2e", "bridge", false},
		{"e2e", "gen/pipestream/gateway/v1", true},
		{"openapi", "bridge", false},
		{"bridge/store/pgstore", "internal/pgtest", true},
		{"quicpeer", "internal/pgtest", false},
		{"internal/conformance", "quicpeer/wire", true},
		{"internal/conformance", "bridge", false},
	}
	for _, c := range cases {
		r, ok := ruleFor(c.from)
		if !ok {
			t.Fatalf("no rule for %s", c.from)
		}
		if got := allowed(r, c.to); got != c.ok {
			t.Errorf("%s -> %s: allowed=%v, want %v", c.from, c.to, got, c.ok)
		}
	}
}
