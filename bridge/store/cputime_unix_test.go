//go:build unix

package store_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) the process has used so far,
// for benchmarks that report CPU per operation next to wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
