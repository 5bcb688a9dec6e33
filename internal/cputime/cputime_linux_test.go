package cputime

import (
	"os"
	"testing"
)

// TestParseStat reads the fields the CPU sums use, also when the command
// name holds spaces and parentheses.
func TestParseStat(t *testing.T) {
	line := []byte("4242 (postgres: a (b) c) S 858 858 858 0 -1 4194560 100 0 0 0 1234 567 89 10 20 0 1 0 100 0 0")
	s, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if s.comm != "postgres: a (b) c" || s.ppid != 858 || s.utime != 1234 || s.stime != 567 || s.cutime != 89 || s.cstime != 10 {
		t.Errorf("parseStat: %+v; want comm %q, ppid 858, utime 1234, stime 567, cutime 89, cstime 10", s, "postgres: a (b) c")
	}
	for _, bad := range []string{"", "4242 postgres S", "4242 (x) S 1 2"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

// TestProcessCounts checks that Process grows with work this process does
// and that this process's own /proc line parses.
func TestProcessCounts(t *testing.T) {
	before := Process()
	x := 0
	for i := range 50_000_000 {
		x ^= i * i
	}
	if Process() <= before {
		t.Errorf("Process did not grow over a busy loop (%d)", x)
	}
	if cpu, err := Of(os.Getpid()); err != nil || cpu <= 0 {
		t.Errorf("Of(self): %v, %v; want the busy loop's CPU", cpu, err)
	}
	if s, err := readStat(os.Getpid()); err != nil || s.ppid != os.Getppid() {
		t.Errorf("readStat(self): %+v, %v; want ppid %d", s, err, os.Getppid())
	}
}
