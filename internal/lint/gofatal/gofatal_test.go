package gofatal_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/pipestream/gateway/internal/lint/gofatal"
)

// TestAnalyzer runs the analyzer over testdata/src/sample, whose "want"
// comments list the reports it must make (a missing or an extra report
// fails the test): FailNow-family calls in goroutine literals, through
// functions and methods of the package, in functions started by name and
// by a Go method, and none on the test's own goroutine.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), gofatal.Analyzer, "sample")
}
