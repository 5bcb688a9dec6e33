//go:build !unix

package store_test

import "time"

// processCPU is not measured on this platform (cpu-ns metrics read 0).
func processCPU() time.Duration { return 0 }
