package gateway

import (
	"fmt"
	"io/fs"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// scriptedDisk is a statfs that reports free bytes set by the test and
// counts its calls.
type scriptedDisk struct {
	free  int64
	calls int
}

func (d *scriptedDisk) statfs(_ string, st *syscall.Statfs_t) error {
	d.calls++
	st.Bsize, st.Bavail = 1, uint64(d.free)
	return nil
}

// TestDiskAdmitReadsWhenItMatters: a submission reads the free space again
// unless the last reading is younger than diskFreshAge and leaves twice
// the threshold free after the bytes admitted since; near the threshold
// every submission reads it, so a disk that becomes low is refused at the
// next submission, and a disk that fills unseen (no admitted bytes) is
// refused once the reading's age has passed.
func TestDiskAdmitReadsWhenItMatters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const min = 1000
		disk := &scriptedDisk{free: 10 * min}
		m := newDiskMonitor(t.TempDir(), min)
		m.statfs = disk.statfs
		m.poll()
		met, err := newGRPCMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{disk: m, metrics: met}
		admit := func(n int64) error { return s.admitDocument(n) }
		calls := func() int { c := disk.calls; disk.calls = 0; return c }
		calls()

		for range 5 {
			if err := admit(100); err != nil {
				t.Fatalf("admit with room: %v", err)
			}
		}
		if c := calls(); c != 0 {
			t.Errorf("5 small admissions far from the threshold read the disk %d times, want 0 (the reading is fresh)", c)
		}
		// 10,000 free - 500 admitted: one more of 7,600 leaves less than twice the threshold.
		if err := admit(7600); err != nil {
			t.Fatalf("admit: %v", err)
		}
		if c := calls(); c != 1 {
			t.Errorf("an admission bringing the reading under twice the threshold read the disk %d times, want 1", c)
		}

		time.Sleep(diskFreshAge)
		if err := admit(1); err != nil {
			t.Fatalf("admit: %v", err)
		}
		if c := calls(); c != 1 {
			t.Errorf("an admission after diskFreshAge read the disk %d times, want 1", c)
		}

		disk.free = 2*min - 1 // near the threshold: every admission reads
		time.Sleep(diskFreshAge)
		for range 3 {
			if err := admit(1); err != nil {
				t.Fatalf("admit above the threshold: %v", err)
			}
		}
		if c := calls(); c != 3 {
			t.Errorf("3 admissions near the threshold read the disk %d times, want 3", c)
		}
		disk.free = min - 1
		if err := admit(1); status.Code(err) != codes.ResourceExhausted || errorReason(err) != ReasonDiskFull {
			t.Errorf("the first admission once the disk is low: %v, want DISK_FULL", err)
		}

		// Far from the threshold the disk fills unseen: refused once the
		// reading's age has passed.
		disk.free = 10 * min
		time.Sleep(diskFreshAge)
		if err := admit(1); err != nil {
			t.Fatalf("admit with room again: %v", err)
		}
		disk.free = 0
		if err := admit(1); err != nil {
			t.Errorf("an admission within diskFreshAge of a reading far from the threshold: %v, want it admitted on that reading", err)
		}
		time.Sleep(diskFreshAge)
		if err := admit(1); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("an admission diskFreshAge after the disk filled: %v, want DISK_FULL", err)
		}

		off := &Server{disk: newDiskMonitor(t.TempDir(), 0), metrics: s.metrics}
		off.disk.statfs = disk.statfs
		calls()
		if err := off.admitDocument(1); err != nil || calls() != 0 {
			t.Errorf("with the threshold off: %v and %d reads, want nil and none", err, disk.calls)
		}
	})
}

// BenchmarkAdmitDocument: the disk check of one small submission far from
// the threshold, reading the free space every time (before) and on the
// fresh rule (admit).
func BenchmarkAdmitDocument(b *testing.B) {
	m := newDiskMonitor(b.TempDir(), 1)
	b.Run("path=statfs", func(b *testing.B) {
		for b.Loop() {
			m.poll()
			_ = m.low()
		}
	})
	b.Run("path=fresh", func(b *testing.B) {
		for b.Loop() {
			m.admit(4096)
			_ = m.low()
		}
	})
}
