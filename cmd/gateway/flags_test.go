package main

import (
	"os"
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

// A repeatable flag (--peer): its environment variable holds the values
// comma-separated; the command line, when it gives the flag, replaces them
// and may repeat it.
func TestStringsFlag(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want []string
	}{
		{"", nil, nil},
		{"a:1, b:2,", nil, []string{"a:1", "b:2"}},
		{"a:1,b:2", []string{"--peer", "c:3"}, []string{"c:3"}},
		{"", []string{"--peer", "a:1", "--peer", "b:2"}, []string{"a:1", "b:2"}},
	} {
		t.Setenv("GATEWAY_TEST_PEER", tc.env)
		if tc.env == "" {
			os.Unsetenv("GATEWAY_TEST_PEER")
		}
		fs := newFlags("t", "t [flags]", "test")
		got := fs.Strings("peer", "GATEWAY_TEST_PEER", "peer")
		if code, ok := fs.parse(tc.args); !ok {
			t.Fatalf("%v: parse stopped with %d", tc.args, code)
		}
		if !slices.Equal(*got, tc.want) {
			t.Errorf("env %q args %v: %q, want %q", tc.env, tc.args, *got, tc.want)
		}
	}
}
