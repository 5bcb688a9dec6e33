// Package gofatal is a vet analyzer: a test must not end itself from a
// goroutine other than the test's own. t.Fatal, t.FailNow, t.Skip (and
// their variants, on *testing.T, *testing.B, *testing.F or testing.TB) and
// testify's require call runtime.Goexit, which ends only the goroutine
// they run on: called on a worker goroutine they leave the test running
// with that worker gone, so a sender that feeds the workers blocks forever
// (issue 23: e2e/scaleout_test.go hung 19 minutes when a tool was missing).
// The testing package documents the rule: FailNow "must be called from the
// goroutine running the test or benchmark function".
//
// The analyzer reports every such call reachable from a function started
// with a go statement or handed to a Go method (sync.WaitGroup.Go,
// errgroup.Group.Go): in a function literal's body, or in a function or
// method that the started function calls, directly or through other
// functions, in this package or in another analyzed one (a test helper
// package: facts carry what its functions reach). Report the failure
// instead (t.Error and return, or collect errors and check them on the
// test's goroutine). Calls through function values and interfaces are not
// followed.
package gofatal

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Analyzer reports FailNow-family calls on goroutines other than the test's.
var Analyzer = &analysis.Analyzer{
	Name:      "gofatal",
	Doc:       "reports t.Fatal, t.FailNow, t.Skip and require calls that run on a goroutine the test started (they end only that goroutine)",
	Requires:  []*analysis.Analyzer{inspect.Analyzer},
	Run:       run,
	FactTypes: []analysis.Fact{new(failsNowFact)},
}

// failsNowFact marks a function of an analyzed package that reaches a
// FailNow-family call: Chain says how. Packages that import it (a test
// helper package such as storetest) see it through the fact.
type failsNowFact struct{ Chain string }

func (*failsNowFact) AFact() {}

func (f *failsNowFact) String() string { return "failsNow(" + f.Chain + ")" }

// failNow lists the testing methods that call runtime.Goexit.
var failNow = map[string]bool{
	"Fatal": true, "Fatalf": true, "FailNow": true,
	"Skip": true, "Skipf": true, "SkipNow": true,
}

func run(pass *analysis.Pass) (any, error) {
	decls := map[types.Object]*ast.BlockStmt{}
	var order []*types.Func // source order, so that reports do not vary
	for _, f := range pass.Files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				if fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func); ok {
					decls[fn] = fd.Body
					order = append(order, fn)
				}
			}
		}
		closures(pass, f, decls)
	}
	c := &checker{pass: pass, decls: decls, memo: map[types.Object]string{}}
	for _, fn := range order {
		if chain := c.reaches(fn); chain != "" {
			pass.ExportObjectFact(fn, &failsNowFact{Chain: chain})
		}
	}
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	ins.Preorder([]ast.Node{(*ast.GoStmt)(nil), (*ast.CallExpr)(nil)}, func(n ast.Node) {
		switch n := n.(type) {
		case *ast.GoStmt:
			c.started(n.Call.Fun, n.Call)
		case *ast.CallExpr:
			if isGoMethod(pass, n) {
				c.started(n.Args[0], nil)
			}
		}
	})
	return nil, nil
}

// closures adds to decls the variables of f that are given a function
// literal (fail := func() { t.Fatal(...) }; var f = func...): a call or a
// go statement through the variable runs that literal. A variable given
// several literals is known by its first.
func closures(pass *analysis.Pass, f *ast.File, decls map[types.Object]*ast.BlockStmt) {
	note := func(id *ast.Ident, rhs ast.Expr) {
		lit, ok := ast.Unparen(rhs).(*ast.FuncLit)
		if !ok || id.Name == "_" {
			return
		}
		obj := pass.TypesInfo.ObjectOf(id)
		if v, ok := obj.(*types.Var); ok && decls[v] == nil {
			decls[v] = lit.Body
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) == len(n.Rhs) {
				for i, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						note(id, n.Rhs[i])
					}
				}
			}
		case *ast.ValueSpec:
			if len(n.Names) == len(n.Values) {
				for i, id := range n.Names {
					note(id, n.Values[i])
				}
			}
		}
		return true
	})
}

// isGoMethod reports whether call hands a function to a Go method
// (sync.WaitGroup.Go, errgroup.Group.Go), which runs it on a new goroutine.
func isGoMethod(pass *analysis.Pass, call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Go" || len(call.Args) != 1 {
		return false
	}
	s := pass.TypesInfo.Selections[sel]
	return s != nil && s.Kind() == types.MethodVal
}

type checker struct {
	pass *analysis.Pass
	// decls: the bodies of the package's functions and methods
	// (*types.Func) and of its variables given a function literal
	// (*types.Var).
	decls map[types.Object]*ast.BlockStmt
	// memo: for a function of the package, the chain of calls by which it
	// reaches a FailNow-family call ("" when it does not); a function being
	// examined is marked "" first, which ends recursion.
	memo map[types.Object]string
}

// started checks fun, a function started on a new goroutine (call is the
// go statement's call, nil for a Go method's argument).
func (c *checker) started(fun ast.Expr, call *ast.CallExpr) {
	fun = ast.Unparen(fun)
	if lit, ok := fun.(*ast.FuncLit); ok {
		c.inBody(lit.Body)
		return
	}
	if fn := c.funcOf(fun); fn != nil {
		if chain := c.reaches(fn); chain != "" {
			pos := fun.Pos()
			if call != nil {
				pos = call.Pos()
			}
			c.pass.Reportf(pos, "%s runs on a new goroutine and calls %s, which ends only that goroutine: report with t.Error (or collect errors) and return", fn.Name(), chain)
		}
	}
}

// inBody reports each call in body (outside nested go statements) that
// fails the test now, or reaches a function that does.
func (c *checker) inBody(body *ast.BlockStmt) {
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			return false // checked as a goroutine of its own
		case *ast.CallExpr:
			if isGoMethod(c.pass, n) {
				return false // likewise
			}
			if name := c.failsNow(n); name != "" {
				c.pass.Reportf(n.Pos(), "%s on a goroutine the test started ends only that goroutine, not the test: report with t.Error (or collect errors) and return", name)
				return true
			}
			if fn := c.funcOf(n.Fun); fn != nil {
				if chain := c.reaches(fn); chain != "" {
					c.pass.Reportf(n.Pos(), "%s on a goroutine the test started calls %s, which ends only that goroutine: report with t.Error (or collect errors) and return", fn.Name(), chain)
				}
			}
		}
		return true
	})
}

// reaches returns how fn reaches a FailNow-family call ("" if it does not).
func (c *checker) reaches(fn types.Object) string {
	if chain, ok := c.memo[fn]; ok {
		return chain
	}
	c.memo[fn] = ""
	body := c.decls[fn]
	if body == nil {
		var f failsNowFact
		if _, ok := fn.(*types.Func); ok && c.pass.ImportObjectFact(fn, &f) {
			c.memo[fn] = f.Chain
			return f.Chain
		}
		return ""
	}
	chain := ""
	ast.Inspect(body, func(n ast.Node) bool {
		if chain != "" {
			return false
		}
		switch n := n.(type) {
		case *ast.GoStmt:
			return false
		case *ast.CallExpr:
			if isGoMethod(c.pass, n) {
				return false
			}
			if name := c.failsNow(n); name != "" {
				chain = name
			} else if g := c.funcOf(n.Fun); g != nil && g != fn {
				if sub := c.reaches(g); sub != "" {
					chain = g.Name() + " -> " + sub
				}
			}
		}
		return true
	})
	c.memo[fn] = chain
	return chain
}

// funcOf returns the function or method that a call expression's function
// denotes, of this package or of another one (whose facts say whether it
// fails the test now), or the variable holding a function literal; nil
// otherwise.
func (c *checker) funcOf(fun ast.Expr) types.Object {
	var id *ast.Ident
	switch f := ast.Unparen(fun).(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	case *ast.IndexExpr: // generic instantiation f[T]
		return c.funcOf(f.X)
	case *ast.IndexListExpr:
		return c.funcOf(f.X)
	default:
		return nil
	}
	switch obj := c.pass.TypesInfo.Uses[id].(type) {
	case *types.Func:
		return obj.Origin()
	case *types.Var:
		if c.decls[obj] != nil {
			return obj
		}
	}
	return nil
}

// failsNow names the call if it is a FailNow-family method of the testing
// package's types or a function of testify's require package.
func (c *checker) failsNow(call *ast.CallExpr) string {
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	fn, ok := c.pass.TypesInfo.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil {
		return ""
	}
	switch path := fn.Pkg().Path(); {
	case path == "testing" && failNow[fn.Name()]:
		return types.ExprString(sel)
	case strings.HasSuffix(path, "github.com/stretchr/testify/require"):
		return "require." + fn.Name()
	}
	return ""
}
