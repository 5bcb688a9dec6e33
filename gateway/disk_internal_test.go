package gateway

import (
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestDiskFullStatus: a bridge error caused by a full disk (ENOSPC deep
// in a wrapped chain, or SQLite's "disk is full") is ResourceExhausted
// DISK_FULL with a retry delay, not Internal.
func TestDiskFullStatus(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("bridge: spool: %w", &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}),
		fmt.Errorf("store: commit: database or disk is full"),
	} {
		st := toStatus(err)
		if status.Code(st) != codes.ResourceExhausted || errorReason(st) != ReasonDiskFull {
			t.Errorf("toStatus(%v) = %v, want ResourceExhausted DISK_FULL", err, st)
		}
		if _, ok := retryDelay(st); !ok {
			t.Errorf("toStatus(%v) carries no retry delay", err)
		}
	}
}
