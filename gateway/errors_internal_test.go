package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestErrorReasonsAreDocumented: docs/errors.md lists every ErrorInfo
// reason the package defines: its Reason* constants, the literal reasons
// given to statusError, and the generic reasons of every code.
func TestErrorReasonsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "errors.md"))
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{} // reason -> where it is defined
	files, _ := filepath.Glob("*.go")
	literal := regexp.MustCompile(`statusError\(codes\.\w+, "(\w+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range literal.FindAllSubmatch(src, -1) {
			reasons[string(m[1])] = f
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					reasons[v] = f + " " + name.Name
				}
			}
			return true
		})
	}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		reasons[codeReasons[c]] = "codeReasons " + c.String()
	}
	if len(reasons) < 30 {
		t.Fatalf("found only %d reasons: the scan is broken", len(reasons))
	}
	for r, where := range reasons {
		if r == "" || !strings.Contains(string(doc), "| `"+r+"` |") {
			t.Errorf("reason %q (%s) is not in the table of docs/errors.md", r, where)
		}
	}
}

// TestShapeError: every error leaves with an ErrorInfo and without a
// leaked "rpc error:" prefix; a reason it had is kept.
func TestShapeError(t *testing.T) {
	leaked := status.Errorf(codes.InvalidArgument, "%v", status.Error(codes.InvalidArgument, "unknown query parameter \"x\""))
	for _, tc := range []struct {
		in          error
		reason, msg string
		code        codes.Code
	}{
		{leaked, "INVALID_ARGUMENT", `unknown query parameter "x"`, codes.InvalidArgument},
		{status.Error(codes.NotFound, "no such document"), "NOT_FOUND", "no such document", codes.NotFound},
		{statusError(codes.FailedPrecondition, ReasonClaimExpired, "expired"), ReasonClaimExpired, "expired", codes.FailedPrecondition},
		{limitError(ReasonRateLimited, 1, "slow down"), ReasonRateLimited, "slow down", codes.ResourceExhausted},
		{os.ErrNotExist, "UNKNOWN", os.ErrNotExist.Error(), codes.Unknown},
	} {
		out := shapeError(tc.in)
		st := status.Convert(out)
		if st.Code() != tc.code || st.Message() != tc.msg || errorReason(out) != tc.reason {
			t.Errorf("shapeError(%v) = %v %q reason %q; want %v %q reason %q", tc.in, st.Code(), st.Message(), errorReason(out), tc.code, tc.msg, tc.reason)
		}
	}
	if _, ok := retryDelay(shapeError(limitError(ReasonRateLimited, 1, "x"))); !ok {
		t.Error("shapeError dropped the RetryInfo of a limit error")
	}
	if shapeError(nil) != nil {
		t.Error("shapeError(nil) is not nil")
	}
}

// BenchmarkShapeError: the cost shapeError adds to every error leaving an
// edge: an error made by statusError (already shaped: the common case),
// and one made elsewhere that gets its ErrorInfo.
func BenchmarkShapeError(b *testing.B) {
	shaped := statusError(codes.NotFound, "", "document \"x\" not found")
	bare := status.Error(codes.NotFound, "document \"x\" not found")
	b.Run("shaped", func(b *testing.B) {
		for b.Loop() {
			_ = shapeError(shaped)
		}
	})
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			_ = shapeError(bare)
		}
	})
}
