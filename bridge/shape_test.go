package bridge_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shape of the package's document code (issue 21 item 1,
// docs/architecture.md "Concurrency"): behaviour about one document lives on
// the document (docRun) or its attempt, and document code reaches only its
// docEnv, never the Bridge, so it cannot call back up into the bridge's API
// or loops.

// docSide are the types whose methods are document code or what it may
// reach: they must never name the Bridge, nor the types that hold one.
var docSide = map[string]bool{
	"docRun": true, "attempt": true, "docEnv": true, "registry": true,
	"profileMode": true, "plainMode": true, "draft04Mode": true,
}

// bridgeHolders are the only types allowed a field that names the Bridge:
// the session handler, an upload in progress and the event log's API
// adapter (events), which call into documents or the log from above.
var bridgeHolders = map[string]bool{"Bridge": true, "handler": true, "upload": true, "events": true}

// shapeViolations reports every breach of the rules in one parsed file.
func shapeViolations(fset *token.FileSet, f *ast.File) []string {
	var out []string
	at := func(n ast.Node, msg string) {
		out = append(out, fset.Position(n.Pos()).String()+": "+msg)
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			recv := recvType(d)
			if recv == "Bridge" && d.Type.Params.NumFields() > 0 {
				if t := starName(d.Type.Params.List[0].Type); t == "docRun" || t == "attempt" {
					at(d, "(*Bridge)."+d.Name.Name+" takes a *"+t+" first: make it a method of "+t)
				}
			}
			if docSide[recv] {
				sel := map[*ast.Ident]bool{} // field and method names are not the types
				ast.Inspect(d, func(n ast.Node) bool {
					if se, ok := n.(*ast.SelectorExpr); ok {
						sel[se.Sel] = true
					}
					if id, ok := n.(*ast.Ident); ok && bridgeHolders[id.Name] && !sel[id] {
						at(id, recv+"."+d.Name.Name+" names "+id.Name+": document code reaches its docEnv, never the Bridge")
					}
					return true
				})
			}
			lockViolations(d, recv, at)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				ts, ok := spec.(*ast.TypeSpec)
				if !ok || bridgeHolders[ts.Name.Name] {
					continue
				}
				ast.Inspect(ts.Type, func(n ast.Node) bool {
					if id, ok := n.(*ast.Ident); ok && id.Name == "Bridge" {
						at(id, "type "+ts.Name.Name+" holds the Bridge: document code could reach it through one")
					}
					return true
				})
			}
		}
	}
	return out
}

// lockViolations: a ...Locked function (one called under a lock) takes
// no document's lock (the order is document, then registry), and a
// registry method calls nothing but builtins (a leaf).
func lockViolations(d *ast.FuncDecl, recv string, at func(ast.Node, string)) {
	if d.Body == nil {
		return
	}
	if strings.HasSuffix(d.Name.Name, "Locked") {
		ast.Inspect(d.Body, func(n ast.Node) bool {
			if _, ok := n.(*ast.FuncLit); ok {
				return false // a timer's or goroutine's body: it runs later, holding nothing
			}
			if c, ok := n.(*ast.CallExpr); ok && takesDocLock(c) {
				at(c, d.Name.Name+" takes a document's lock: a ...Locked function runs under locks already, and a document's is taken before the registry's, never under it (doclock.go)")
			}
			return true
		})
	}
	if recv == "registry" {
		ast.Inspect(d.Body, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if id, ok := c.Fun.(*ast.Ident); !ok || !leafCalls[id.Name] {
					at(c, "registry."+d.Name.Name+" calls out: the registry's methods are leaves (no lock, no document, no network)")
				}
			}
			return true
		})
	}
}

// takesDocLock reports whether c takes a document's lock: d.lock(),
// lockFound or eachDoc (doclock.go).
func takesDocLock(c *ast.CallExpr) bool {
	switch f := c.Fun.(type) {
	case *ast.SelectorExpr:
		return f.Sel.Name == "lock"
	case *ast.Ident:
		return f.Name == "lockFound" || f.Name == "eachDoc"
	}
	return false
}

// leafCalls are the only calls a registry method makes: builtins.
var leafCalls = map[string]bool{"append": true, "len": true, "delete": true, "make": true, "min": true, "max": true}

func recvType(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	if s := starName(t); s != "" {
		return s
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func starName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		if id, ok := s.X.(*ast.Ident); ok {
			return id.Name
		}
	}
	return ""
}

// TestDocumentCodeStaysDown fails if a *Bridge method takes a document or
// an attempt first, or if the methods of a document, an attempt, the
// docEnv, the registry or a peer mode name the Bridge (or a type holding
// it), or if another type holds the Bridge, or if a registry method calls
// anything but a builtin (it is a leaf: it locks nothing, touches no
// document, writes nothing to the network), or if a ...Locked function
// (one called under a lock) takes a document's lock: the lock order is
// document, then registry (doclock.go).
func TestDocumentCodeStaysDown(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		n++
		for _, v := range shapeViolations(fset, f) {
			t.Error(v)
		}
	}
	if n < 20 {
		t.Fatalf("parsed %d files of package bridge; expected its sources here", n)
	}
}

// TestShapeRulesCatchViolations proves each rule can fail.
func TestShapeRulesCatchViolations(t *testing.T) {
	src := `package bridge
type Bridge struct{ mu int }
type docRun struct{ env *docEnv }
type docEnv struct{}
type attempt struct{ d *docRun }
type sneaky struct{ b *Bridge }
func (b *Bridge) finishLocked(d *docRun, msg string) {}
func (b *Bridge) fine(id string, d *docRun) {}
func (d *docRun) up(b *Bridge) {}
func (a *attempt) up2() { var x Bridge; _ = x }
func (e *docEnv) viaUpload(u *upload) {}
func (plainMode) send(b *Bridge) {}
func (r *registry) push(d *docRun) { r.queue = append(r.queue, d); r.mu.Lock() }
func (d *docRun) fieldNamed() { d.out.events = nil; d.handler() }
func (d *docRun) finishLocked() { d.att.d.lock() }
func (b *Bridge) sweepLocked() { eachDoc(b.reg, nil, nil, nil); _ = lockFound(b.reg, nil) }
func (d *docRun) relock() { d.unlock(); d.lock() }
func (d *docRun) armLocked() { time.AfterFunc(0, func() { d.lock() }) }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "bad.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(shapeViolations(fset, f), "\n")
	for _, want := range []string{
		"(*Bridge).finishLocked takes a *docRun first",
		"docRun.up names Bridge",
		"attempt.up2 names Bridge",
		"docEnv.viaUpload names upload",
		"plainMode.send names Bridge",
		"type sneaky holds the Bridge",
		"registry.push calls out",
		"finishLocked takes a document's lock",
		"sweepLocked takes a document's lock",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the rules missed %q; they reported:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "sweepLocked takes"); n != 2 {
		t.Errorf("eachDoc and lockFound under a lock: %d reports, want 2:\n%s", n, got)
	}
	if strings.Contains(got, "fine") || strings.Contains(got, "fieldNamed") || strings.Contains(got, "relock") || strings.Contains(got, "armLocked") {
		t.Errorf("reported a *Bridge method taking a document later than first, or a field or method that shares a type's name:\n%s", got)
	}
	if _, err := os.Stat("shape_test.go"); err != nil {
		t.Fatalf("run from the package directory: %v", err)
	}
}
