package bridge_test

import (
	"go/ast"
	"go/token"
	"go/types"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// The lock split of issue 21 item 1 (doclock.go, docs/architecture.md
// "Concurrency"): document code runs under its document's lock alone and
// takes the registry's mu only for short leaf sections; code holding the
// registry's mu runs no document code. These rules are checked on the
// type-checked package, so a field reached through an embedded type or a
// chain of selectors counts as well.

// registryGuarded are the fields the registry's mu guards, per type (nil:
// every field but mu). registry.peers is fixed after New, and a session's
// identity (pc, s, n, codec, mode), its control outbox (own mutex) and a
// peer's address, index, metrics and wake-up channels are fixed once the
// session or peer is published: those are read freely.
var registryGuarded = map[string]map[string]bool{
	"registry": nil,
	"sessState": {"ents": true, "scopes": true, "dehyd": true, "lastDehyd": true, "waiters": true, "guessLog": true,
		"docs": true, "goaway": true, "closed": true, "closedAt": true, "closeErr": true, "upAt": true, "proven": true},
	"peerConn": {"framing": true, "lastErr": true, "errAt": true, "ok": true, "worked": true, "delay": true, "retryAt": true,
		"shortSessions": true, "dialing": true, "sentEntity": true, "absentStreak": true, "sending": true, "active": true,
		"sessWake": true, "tls": true, "caPEM": true, "ep": true},
	"Bridge": {"holdTimer": true, "holdAt": true, "flushed": true},
}

// registryFixed are registry fields that never change after New.
var registryFixed = map[string]bool{"mu": true, "peers": true}

// docCode are the types whose methods are document code: they run under
// their document's lock alone (or none), never under the registry's.
var docCode = map[string]bool{
	"docRun": true, "attempt": true, "docEnv": true, "statusApply": true, "docFlush": true, "claimRun": true,
	"profileMode": true, "plainMode": true, "draft04Mode": true,
}

// registryCode are the types whose ...Locked methods run under the
// registry's mu.
var registryCode = map[string]bool{"Bridge": true, "handler": true, "peerConn": true, "sessState": true, "registry": true}

// registryType are the types whose every method runs under the
// registry's mu (their callers hold it).
var registryType = map[string]bool{"registry": true, "sessState": true, "peerConn": true}

// underRegistryAllowed are the document methods code holding the
// registry's mu may call: they read the document (or a mode's constant)
// and take no lock, or (kick, kickFlush, endDraft04) only wake a loop or
// start a goroutine.
var underRegistryAllowed = map[string]bool{
	"terminal": true, "current": true, "newest": true, "sess": true, "pipelined": true, "name": true,
	"endMeansPeerDown": true, "carriesMetadata": true, "capacity": true, "kick": true, "kickFlush": true, "endDraft04": true,
}

// lockSection reports, for a position in a function body, whether the
// registry's mu is held there by a section written in that body:
// regLock()/regUnlock(), or Lock()/Unlock() on the mu of the Bridge or
// the registry (a deferred unlock holds to the end).
type lockSection []lockEvent

// lockEvent is where a section begins (held) or ends.
type lockEvent struct {
	pos  token.Pos
	held bool
}

func sectionsOf(info *types.Info, body *ast.BlockStmt) lockSection {
	early := earlyExitUnlocks(body)
	var s lockSection
	ast.Inspect(body, func(n ast.Node) bool {
		if _, ok := n.(*ast.DeferStmt); ok {
			return false
		}
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		se, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if early[c] {
			return true
		}
		switch se.Sel.Name {
		case "regLock", "regUnlock":
			s = append(s, lockEvent{c.Pos(), se.Sel.Name == "regLock"})
		case "Lock", "Unlock":
			mu, ok := se.X.(*ast.SelectorExpr)
			if !ok || mu.Sel.Name != "mu" {
				return true
			}
			if tv, ok := info.Types[mu.X]; ok && (typeNamed(tv.Type, "Bridge") || typeNamed(tv.Type, "registry")) {
				s = append(s, lockEvent{c.Pos(), se.Sel.Name == "Lock"})
			}
		}
		return true
	})
	return s
}

// earlyExitUnlocks are the unlocks of blocks that end in a return,
// break or continue (`if x { mu.Unlock(); return }`): the code after
// the block still holds the lock.
func earlyExitUnlocks(body *ast.BlockStmt) map[*ast.CallExpr]bool {
	out := map[*ast.CallExpr]bool{}
	ast.Inspect(body, func(n ast.Node) bool {
		b, ok := n.(*ast.BlockStmt)
		if !ok || b == body || len(b.List) == 0 {
			return true
		}
		switch b.List[len(b.List)-1].(type) {
		case *ast.ReturnStmt, *ast.BranchStmt:
		default:
			return true
		}
		for _, st := range b.List {
			if es, ok := st.(*ast.ExprStmt); ok {
				if c, ok := es.X.(*ast.CallExpr); ok {
					if se, ok := c.Fun.(*ast.SelectorExpr); ok && (se.Sel.Name == "Unlock" || se.Sel.Name == "regUnlock") {
						out[c] = true
					}
				}
			}
		}
		return true
	})
	return out
}

func (s lockSection) held(pos token.Pos) bool {
	h := false
	for _, e := range s {
		if e.pos < pos {
			h = e.held
		}
	}
	return h
}

func typeNamed(t types.Type, name string) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Name() == name
}

// guardedFields are the *types.Var of every registry-guarded field.
func guardedFields(pkg *types.Package) map[*types.Var]string {
	out := map[*types.Var]string{}
	for tn, only := range registryGuarded {
		st := pkg.Scope().Lookup(tn).Type().Underlying().(*types.Struct)
		for i := range st.NumFields() {
			f := st.Field(i)
			if (only == nil && !registryFixed[f.Name()]) || only[f.Name()] {
				out[f] = tn
			}
		}
	}
	return out
}

// lockSplitViolations checks every function of the package against the
// two rules.
func lockSplitViolations(p *packages.Package) []string {
	guarded := guardedFields(p.Types)
	var out []string
	for _, f := range p.Syntax {
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			recv := recvType(fd)
			name := fd.Name.Name
			regLocked := strings.HasSuffix(name, "RegLocked")
			sec := sectionsOf(p.TypesInfo, fd.Body)
			at := func(n ast.Node, msg string) {
				pos := p.Fset.Position(n.Pos())
				out = append(out, filepath.Base(pos.Filename)+":"+strconv.Itoa(pos.Line)+": "+recv+"."+name+" "+msg)
			}
			underReg := registryCode[recv] && strings.HasSuffix(name, "Locked") || regLocked
			if !underReg && !registryType[recv] {
				// Registry code's function literals are find functions
				// (run under the registry's mu by lockFound) or goroutines
				// and timers that take their locks themselves.
				touchViolations(p.TypesInfo, fd.Body, guarded, sec, !docCode[recv] && recv != "", at)
			}
			callViolations(p.TypesInfo, fd.Body, sec, underReg, at)
		}
	}
	return out
}

// touchViolations: code that does not run under the registry's mu (all
// but registry-side ...Locked and ...RegLocked functions) reads or writes
// a registry-guarded field only inside a section holding it.
func touchViolations(info *types.Info, body *ast.BlockStmt, guarded map[*types.Var]string, sec lockSection, skipLits bool, at func(ast.Node, string)) {
	ast.Inspect(body, func(n ast.Node) bool {
		if _, ok := n.(*ast.FuncLit); ok && skipLits {
			return false
		}
		se, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		sel := info.Selections[se]
		if sel == nil || sel.Kind() != types.FieldVal {
			return true
		}
		v, _ := sel.Obj().(*types.Var)
		if tn, ok := guarded[v]; ok && !sec.held(se.Pos()) {
			at(se, "touches "+tn+"."+se.Sel.Name+" outside a registry section: take the registry's mu for a short leaf section (regLock, b.mu.Lock, or a ...RegLocked function)")
		}
		return true
	})
}

// callViolations: code holding the registry's mu (a registry-side
// ...Locked function, a ...RegLocked one, or a section) calls no document
// code but ...RegLocked functions and lock-free readers.
func callViolations(info *types.Info, body *ast.BlockStmt, sec lockSection, underReg bool, at func(ast.Node, string)) {
	ast.Inspect(body, func(n ast.Node) bool {
		if _, ok := n.(*ast.FuncLit); ok {
			return false // a find function, timer or goroutine: checked where it runs, not here
		}
		c, ok := n.(*ast.CallExpr)
		if !ok || !(underReg || sec.held(c.Pos())) {
			return true
		}
		if id, ok := c.Fun.(*ast.Ident); ok {
			if fn, ok := info.Uses[id].(*types.Func); ok && strings.HasSuffix(id.Name, "Locked") && !strings.HasSuffix(id.Name, "RegLocked") && fn.Pkg() != nil && fn.Pkg().Name() == "bridge" {
				at(c, "calls "+id.Name+" holding the registry's mu: document code runs under its document's lock alone (the registry's is a leaf)")
			}
			return true
		}
		se, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		sel := info.Selections[se]
		if sel == nil || sel.Kind() != types.MethodVal {
			return true
		}
		m := se.Sel.Name
		if strings.HasSuffix(m, "RegLocked") || underRegistryAllowed[m] || m == "regUnlock" {
			return true
		}
		for tn := range docCode {
			if typeNamed(sel.Recv(), tn) || (tn == "docRun" && typeNamed(sel.Recv(), "peerMode")) {
				at(c, "calls "+tn+"."+m+" holding the registry's mu: document code runs under its document's lock alone (the registry's is a leaf)")
				return true
			}
		}
		return true
	})
}

// loadBridge type-checks package bridge (sources without tests), with
// overlay files added.
func loadBridge(t *testing.T, overlay map[string][]byte) *packages.Package {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &packages.Config{
		Mode:    packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:     dir,
		Overlay: overlay,
	}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != 1 || len(pkgs[0].Errors) > 0 || pkgs[0].Types.Scope().Lookup("registry") == nil {
		t.Fatalf("loading package bridge: %d packages, errors %v", len(pkgs), pkgs[0].Errors)
	}
	return pkgs[0]
}

// TestDocumentCodeTakesTheRegistryBriefly fails if document code (the
// methods of a document, an attempt, the docEnv or a peer mode, and the
// package's functions) touches a field the registry's mu guards outside a
// section that holds it, or if code holding the registry's mu calls
// document code other than a ...RegLocked function or a lock-free reader:
// the registry's mu guards only the registry, and documents serialise on
// their own locks (issue 21 item 1; doclock.go).
func TestDocumentCodeTakesTheRegistryBriefly(t *testing.T) {
	p := loadBridge(t, nil)
	for _, v := range lockSplitViolations(p) {
		t.Error(v)
	}
	if len(guardedFields(p.Types)) < 30 {
		t.Fatalf("found %d guarded fields; the lists above no longer name the package's types", len(guardedFields(p.Types)))
	}
}

// TestLockSplitRulesCatchViolations proves both rules can fail.
func TestLockSplitRulesCatchViolations(t *testing.T) {
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	src := `package bridge

func (d *docRun) touchesQueue() int { return len(d.env.reg.queue) }
func (d *docRun) touchesInSection() int { d.env.regLock(); defer d.env.regUnlock(); return len(d.env.reg.queue) }
func (a *attempt) touchesSession() bool { return a.ss.closed }
func (b *Bridge) finishesUnderRegLocked(d *docRun) { d.finishLocked(0, "") }
func (b *Bridge) finishesInSection(d *docRun) { b.mu.Lock(); d.enqueueLocked(); b.mu.Unlock(); d.enqueueLocked() }
func (b *Bridge) waitsUnlocked(d *docRun) chan struct{} { d.lock(); defer d.unlock(); return b.flushed }
func (b *Bridge) earlyExit() chan struct{} { b.mu.Lock(); if b.closing { b.mu.Unlock(); return nil }; defer b.mu.Unlock(); return b.flushed }
`
	p := loadBridge(t, map[string][]byte{filepath.Join(dir, "zz_violations.go"): []byte(src)})
	var got []string
	for _, v := range lockSplitViolations(p) {
		if strings.HasPrefix(v, "zz_violations.go:") {
			got = append(got, v)
		}
	}
	want := []string{
		"zz_violations.go:3: docRun.touchesQueue touches registry.queue",
		"zz_violations.go:5: attempt.touchesSession touches sessState.closed",
		"zz_violations.go:6: Bridge.finishesUnderRegLocked calls docRun.finishLocked",
		"zz_violations.go:7: Bridge.finishesInSection calls docRun.enqueueLocked",
		"zz_violations.go:8: Bridge.waitsUnlocked touches Bridge.flushed",
	}
	if len(got) != len(want) {
		t.Fatalf("violations found:\n%s\nwant %d (one per line of %v)", strings.Join(got, "\n"), len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("violation %d: %s\nwant it to start with %s", i, got[i], w)
		}
	}
}
