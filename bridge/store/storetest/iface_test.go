package storetest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store/storetest"
)

// methods returns the method set of the interface type I as "Name func(...)"
// strings, sorted.
func methods[I any]() map[string]string {
	t := reflect.TypeFor[I]()
	out := map[string]string{}
	for i := range t.NumMethod() {
		m := t.Method(i)
		out[m.Name] = m.Type.String()
	}
	return out
}

// union merges method sets; a name declared twice with different
// signatures is reported by the caller's comparison (the last wins).
func union(sets ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, s := range sets {
		for k, v := range s {
			out[k] = v
		}
	}
	return out
}

// diff lists the methods that are in one set and not in the other, or
// whose signatures differ.
func diff(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, "only in the suite: "+k+" "+v)
		} else if v != w {
			out = append(out, "signature differs: "+k+": suite "+v+", bridge "+w)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, "only in the bridge: "+k+" "+v)
		}
	}
	sort.Strings(out)
	return out
}

// TestInterfaceIsTheBridges fails when the suite's interface
// (storetest.Store) and what the bridge and the event log need of a store
// (bridge.Store, which includes eventlog.Store, and the event log's
// optional readers) differ, so that a method the bridge relies on cannot
// go unchecked by the suite, and when a method of the interface is never
// called by the suite's code.
func TestInterfaceIsTheBridges(t *testing.T) {
	suite := methods[storetest.Store]()
	need := union(methods[bridge.Store](), methods[eventlog.Store](),
		methods[eventlog.EventMetaReader](), methods[eventlog.EventRangeReader]())
	for _, d := range diff(suite, need) {
		t.Error(d)
	}
	if len(suite) < 20 {
		t.Fatalf("storetest.Store has %d methods; the reflection read the wrong type", len(suite))
	}

	called := suiteCalls(t)
	for name := range suite {
		if !called[name] {
			t.Errorf("storetest.Store.%s is never called by the suite: add a conformance test for it", name)
		}
	}
}

// suiteCalls returns the names of every method called (x.Name(...)) in the
// suite's non-test source files.
func suiteCalls(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	called := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
					called[sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	if len(called) == 0 {
		t.Fatal("no calls found in the suite's sources")
	}
	return called
}

// TestInterfaceDiffCanFail proves the comparison reports a method the
// bridge needs that the suite lacks, one the suite has that the bridge
// does not, and a changed signature.
func TestInterfaceDiffCanFail(t *testing.T) {
	type small interface{ Close() error }
	type other interface {
		Close() error
		LastSeq() uint64
	}
	type changed interface{ Close() bool }
	if d := diff(methods[small](), methods[other]()); len(d) != 1 || !strings.Contains(d[0], "only in the bridge: LastSeq") {
		t.Errorf("diff(small, other) = %v, want LastSeq only in the bridge", d)
	}
	if d := diff(methods[other](), methods[small]()); len(d) != 1 || !strings.Contains(d[0], "only in the suite: LastSeq") {
		t.Errorf("diff(other, small) = %v, want LastSeq only in the suite", d)
	}
	if d := diff(methods[small](), methods[changed]()); len(d) != 1 || !strings.Contains(d[0], "signature differs: Close") {
		t.Errorf("diff(small, changed) = %v, want Close's signature", d)
	}
}
