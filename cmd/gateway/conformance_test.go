package main_test

import (
	"strings"
	"testing"
)

// TestConformanceVerb: `gateway conformance` and its two subcommands print
// their help (usage, example, every flag's variable), and bad use is exit
// 2 with one line that says what to fix.
func TestConformanceVerb(t *testing.T) {
	for sub, envs := range map[string][]string{
		"serve": {"GATEWAY_CONFORMANCE_BIND", "GATEWAY_CONFORMANCE_CERT", "GATEWAY_CONFORMANCE_KEY", "GATEWAY_CONFORMANCE_OUTPUT_DIR",
			"GATEWAY_CONFORMANCE_READY_FILE", "GATEWAY_CONFORMANCE_ONCE", "GATEWAY_CONFORMANCE_MAX_PAYLOAD", "GATEWAY_CONFORMANCE_TIMEOUT"},
		"send": {"GATEWAY_CONFORMANCE_CONNECT", "GATEWAY_CONFORMANCE_CA", "GATEWAY_CONFORMANCE_SERVER_NAME", "GATEWAY_CONFORMANCE_ENTITY_ID",
			"GATEWAY_CONFORMANCE_PARENT_ID", "GATEWAY_CONFORMANCE_INPUT", "GATEWAY_CONFORMANCE_CONTENT_TYPE"},
	} {
		help, _, code := run(t, nil, "conformance", sub, "--help")
		if code != 0 || !strings.Contains(help, "Usage: gateway conformance "+sub) || !strings.Contains(help, "Example:") {
			t.Errorf("conformance %s --help: exit %d\n%s", sub, code, help)
		}
		for _, env := range envs {
			if !strings.Contains(help, "$"+env+"]") {
				t.Errorf("conformance %s --help does not name %s", sub, env)
			}
		}
	}
	if help, _, code := run(t, nil, "help", "conformance"); code != 0 || !strings.Contains(help, "Usage: gateway conformance") || !strings.Contains(help, "--ready-file") {
		t.Errorf("gateway help conformance: exit %d\n%s", code, help)
	}
	for _, args := range [][]string{
		{"conformance"},
		{"conformance", "frobnicate"},
		{"conformance", "serve", "--output-dir", t.TempDir()},                            // no --cert/--key
		{"conformance", "send", "--connect", "127.0.0.1:1", "--ca", "x", "--input", "x"}, // no --entity-id
		{"conformance", "send", "--connect", "127.0.0.1:1", "--ca", "x", "--input", "x", "--entity-id", "4294967293"},
		{"conformance", "send", "--entity-id", "1", "--parent-id", "0", "--connect", "127.0.0.1:1", "--ca", "x", "--input", "x"},
	} {
		out, errb, code := run(t, nil, args...)
		if code != 2 || out != "" || strings.Count(errb, "\n") != 1 {
			t.Errorf("%v: exit %d stdout %q stderr %q, want exit 2 and one line on stderr", args, code, out, errb)
		}
	}
	// a missing certificate is a run-time failure (exit 1) that names the file
	if _, errb, code := run(t, nil, "conformance", "serve", "--cert", "/nonexistent.crt", "--key", "/nonexistent.key", "--output-dir", t.TempDir()); code != 1 || !strings.Contains(errb, "/nonexistent.crt") {
		t.Errorf("serve with a missing certificate: exit %d stderr %q, want 1 naming the file", code, errb)
	}
}
