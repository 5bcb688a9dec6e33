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
	// exact: the rule is for the package from only, not its sub-folders,
	// and "itself" is that package only (bridge/store may not import its
	// backends beside it).
	exact bool
}

var rules = []rule{
	// bridge/store: the backend-neutral vocabulary and interfaces of the
	// durable store; it imports no backend (bridge/store/sqlite,
	// bridge/store/pgstore) and, by denied below, no database driver.
	{from: "bridge/store", allow: []string{"gen/"}, exact: true},
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

// denied lists, for one package, the import path prefixes its build (not
// its tests) must not depend on, directly or not: the neutral store links
// no database driver and no backend, and neither backend links the other.
var denied = []struct {
	pkg  string
	deps []string
}{
	{"bridge/store", []string{"database/sql", "modernc.org/", "github.com/jackc/", module + "/bridge/store/"}},
	{"bridge/store/sqlite", []string{"github.com/jackc/", module + "/bridge/store/pgstore"}},
	{"bridge/store/pgstore", []string{"modernc.org/", module + "/bridge/store/sqlite"}},
}

// deniedDeps returns the dependencies of the package rel that denied
// forbids.
func deniedDeps(rel string, deps []string) []string {
	var out []string
	for _, d := range denied {
		if d.pkg != rel {
			continue
		}
		for _, dep := range deps {
			for _, pre := range d.deps {
				if dep == strings.TrimSuffix(pre, "/") || strings.HasPrefix(dep, pre) {
					out = append(out, dep)
				}
			}
		}
	}
	return out
}

type pkg struct {
	ImportPath   string
	Deps         []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func TestLayering(t *testing.T) {
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Deps,Imports,TestImports,XTestImports", module+"/...")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, errb.String())
	}
	dec := json.NewDecoder(&out)
	checked := 0
	deniedSeen := map[string]bool{}
	for _, d := range denied {
		deniedSeen[d.pkg] = false
	}
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		for _, dep := range deniedDeps(rel, p.Deps) {
			t.Errorf("%s depends on %s, which it must not link (docs/architecture.md, Layers)", rel, dep)
		}
		if _, ok := deniedSeen[rel]; ok {
			deniedSeen[rel] = true
		}
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
	for rel, seen := range deniedSeen {
		if !seen {
			t.Errorf("package %s of the denied list was not found; update the list", rel)
		}
	}
}

func ruleFor(rel string) (rule, bool) {
	for _, r := range rules {
		if r.exact {
			if rel == r.from {
				return r, true
			}
			continue
		}
		if rel == strings.TrimSuffix(r.from, "/") || strings.HasPrefix(rel, strings.TrimSuffix(r.from, "/")+"/") {
			return r, true
		}
	}
	return rule{}, false
}

func allowed(r rule, target string) bool {
	if target == strings.TrimSuffix(r.from, "/") || (!r.exact && strings.HasPrefix(target, strings.TrimSuffix(r.from, "/")+"/")) {
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
		{"bridge/store", "bridge/store/sqlite", false},
		{"bridge/store", "bridge/store/pgstore", false},
		{"bridge/store", "bridge/eventlog", false},
		{"bridge/store", "bridge", false},
		{"bridge/store", "gen/pipestream/gateway/v1", true},
		{"bridge/store/sqlite", "bridge/store", true},
		{"bridge/store/pgstore", "bridge/store/internal/fence", true},
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

// TestDeniedCatchesDrivers proves the dependency check can fail: the
// neutral store linking a driver or a backend, and a backend linking the
// other.
func TestDeniedCatchesDrivers(t *testing.T) {
	cases := []struct {
		pkg, dep string
		bad      bool
	}{
		{"bridge/store", "database/sql", true},
		{"bridge/store", "modernc.org/sqlite", true},
		{"bridge/store", "github.com/jackc/pgx/v5", true},
		{"bridge/store", module + "/bridge/store/sqlite", true},
		{"bridge/store", module + "/bridge/store/internal/fence", true},
		{"bridge/store", "google.golang.org/protobuf/proto", false},
		{"bridge/store/pgstore", module + "/bridge/store/sqlite", true},
		{"bridge/store/pgstore", "github.com/jackc/pgx/v5", false},
		{"bridge/store/sqlite", "github.com/jackc/pgx/v5/pgconn", true},
		{"bridge/store/sqlite", "database/sql", false},
		{"bridge", "database/sql", false},
	}
	for _, c := range cases {
		if got := len(deniedDeps(c.pkg, []string{c.dep})) > 0; got != c.bad {
			t.Errorf("%s -> %s: denied=%v, want %v", c.pkg, c.dep, got, c.bad)
		}
	}
}
