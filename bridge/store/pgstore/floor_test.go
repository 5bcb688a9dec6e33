package pgstore_test

import (
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/pipestream/gateway/internal/pgtest"
)

// TestFloorScriptRuns runs scripts/pg-floor.sh (docs/performance.md, the
// server's floor) briefly against a database this package migrated: its
// SQL must stay valid for the schema it copies, and each script's line
// must report documents written and the server's CPU per document.
func TestFloorScriptRuns(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	open(t, dsn) // migrates; closed at cleanup
	out, err := exec.Command("../../../scripts/pg-floor.sh", dsn, "1", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("pg-floor.sh: %v\n%s", err, out)
	}
	for _, script := range []string{"current", "lean"} {
		m := regexp.MustCompile(`round 1 ` + script + ` +(\d+) docs +server CPU +\d+ ms +\d+ µs/doc`).FindSubmatch(out)
		if m == nil {
			t.Errorf("no line for %s.sql in:\n%s", script, out)
			continue
		}
		if docs, _ := strconv.Atoi(string(m[1])); docs == 0 {
			t.Errorf("%s.sql wrote no documents:\n%s", script, out)
		}
	}
}
