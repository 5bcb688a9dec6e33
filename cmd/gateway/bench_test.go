package main_test

import (
	"strings"
	"testing"
)

// TestBenchHistoryFlags: `gateway bench --help` documents the history
// phase's flags, and a bad --history-docs is exit 2 with one line that
// says what a size looks like, before anything runs.
func TestBenchHistoryFlags(t *testing.T) {
	help, _, code := run(t, nil, "bench", "--help")
	for _, want := range []string{"-history-docs", "GATEWAY_BENCH_HISTORY_DOCS", "-history-dir", "GATEWAY_BENCH_HISTORY_DIR", "--only history"} {
		if code != 0 || !strings.Contains(help, want) {
			t.Errorf("bench --help: exit %d, lacks %q\n%s", code, want, help)
		}
	}
	for _, bad := range []string{"0,ten", "-5", "1,2M,3G"} {
		_, errOut, code := run(t, nil, "bench", "--only", "history", "--history-docs", bad)
		if code != 2 || !strings.Contains(errOut, "--history-docs") || !strings.Contains(errOut, "100k or 1M") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("bench --history-docs %q: exit %d, stderr %q; want exit 2 and one line naming the flag and the form", bad, code, errOut)
		}
	}
	_, errOut, code := run(t, nil, "bench", "--only", "history", "--history-docs", "1M,0")
	if code == 0 || !strings.Contains(errOut, "ascending") {
		t.Errorf("bench --history-docs 1M,0: exit %d, stderr %q; want a refusal that says the sizes must ascend", code, errOut)
	}
}
