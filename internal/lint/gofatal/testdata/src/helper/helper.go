// Package helper is a test helper package of the gofatal sample: its
// functions are analyzed in their own package and known to sample
// through facts.
package helper

import "testing"

// Need ends the test when a tool is missing.
func Need(t testing.TB) {
	t.Helper()
	t.Fatal("missing tool")
}
