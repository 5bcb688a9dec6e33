package main

import (
	"slices"
	"testing"
)

// Flags may follow arguments, as README shows for
// `gateway result <ID> -o out.txt`; `--` ends flag parsing.
func TestFlagsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		wantOut  string
		wantArgs []string
	}{
		{[]string{"ID", "-o", "out.txt"}, "out.txt", []string{"ID"}},
		{[]string{"-o", "out.txt", "ID"}, "out.txt", []string{"ID"}},
		{[]string{"A", "--o=x", "B"}, "x", []string{"A", "B"}},
		{[]string{"A", "--", "-o", "B"}, "", []string{"A", "-o", "B"}},
	} {
		fs := newFlags("t", "t [flags] ARG", "test")
		out := fs.String("o", "GATEWAY_TEST_O", "", "output")
		if code, ok := fs.parse(tc.args); !ok {
			t.Fatalf("%v: parse stopped with %d", tc.args, code)
		}
		if *out != tc.wantOut || !slices.Equal(fs.Args(), tc.wantArgs) {
			t.Fatalf("%v: -o %q args %q, want %q %q", tc.args, *out, fs.Args(), tc.wantOut, tc.wantArgs)
		}
	}
}
