package gateway

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pipestream/gateway/bridge"
)

// ReasonDiskFull is the ErrorInfo reason of a submission refused because
// the data directory's disk is (nearly) full: ResourceExhausted, HTTP 503,
// with RetryInfo / Retry-After.
const ReasonDiskFull = "DISK_FULL"

// diskMonitor watches the free space of the data directory (statfs every
// healthPollInterval): below Config.MinFreeDiskBytes /healthz reports low
// disk (503) and new documents are refused with DISK_FULL, before the disk
// is actually full, so the space left goes to the documents already
// acknowledged (their results retry until space returns: bridge/diskfull.go).
type diskMonitor struct {
	dir  string
	min  int64
	free atomic.Int64 // -1: unknown
}

func newDiskMonitor(dir string, min int64) *diskMonitor {
	m := &diskMonitor{dir: dir, min: min}
	m.free.Store(-1)
	m.poll()
	return m
}

// poll reads the free space now.
func (m *diskMonitor) poll() {
	if m == nil {
		return
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.dir, &st); err != nil {
		m.free.Store(-1)
		return
	}
	m.free.Store(int64(st.Bavail) * int64(st.Bsize))
}

// low returns an error when the free space is below the threshold.
func (m *diskMonitor) low() error {
	if m == nil || m.min <= 0 {
		return nil
	}
	free := m.free.Load()
	if free < 0 || free >= m.min {
		return nil
	}
	return fmt.Errorf("low disk: %d bytes free in %s, below --min-free-disk %d", free, m.dir, m.min)
}

// room checks, now, that an upload may write n more bytes: it must leave
// half of the threshold free (the rest of the threshold is for the
// results of documents already accepted, and the store).
func (m *diskMonitor) room(n int64) error {
	if m == nil || m.min <= 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(m.dir, &st); err != nil {
		return nil
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free-n < m.min/2 {
		return fmt.Errorf("the upload would leave %d bytes free in %s, below half of --min-free-disk %d", free-n, m.dir, m.min)
	}
	return nil
}

// diskFullError refuses a new document for lack of space.
func diskFullError(cause string) error {
	return limitError(ReasonDiskFull, diskRetryAfter, fmt.Sprintf(
		"disk full: the gateway has no room for new documents (%s); documents already accepted finish first; retry later", cause))
}

// admitDocument refuses a new document while the disk is low.
func (s *Server) admitDocument() error {
	s.disk.poll()
	if err := s.disk.low(); err != nil {
		s.metrics.rejected.WithLabelValues("disk").Inc()
		return diskFullError(err.Error())
	}
	return nil
}

// diskStatus maps a bridge error caused by a full disk to DISK_FULL.
func diskStatus(err error) (error, bool) {
	if bridge.IsDiskFull(err) {
		return diskFullError(err.Error()), true
	}
	return nil, false
}

// diskRetryAfter is the Retry-After of DISK_FULL: freeing space takes an
// operator, not milliseconds.
const diskRetryAfter = 30 * time.Second
