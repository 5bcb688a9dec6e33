//go:build !unix

package cputime

import "time"

// Process is 0 where getrusage does not exist: CPU figures then read 0.
func Process() time.Duration { return 0 }
