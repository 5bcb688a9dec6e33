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
//
// A submission reads the free space afresh (one statfs, ~8 µs, 2% of a
// small document's CPU when it ran for every one) unless the last reading
// is recent and far from the threshold: younger than diskFreshAge, and
// with at least twice the threshold free after the bytes admitted since
// (fresh). Near the threshold, or with the age passed, every submission
// reads it again, so a submission is refused as soon as the space is low;
// far from it, the disk would have to fill by the threshold (256 MiB by
// default) within diskFreshAge unseen, which the uploads' own per-chunk
// check (room) does not allow for their bytes.
type diskMonitor struct {
	dir   string
	min   int64
	free  atomic.Int64 // -1: unknown
	at    atomic.Int64 // when free was read (nanoseconds since start)
	since atomic.Int64 // bytes admitted since free was read
	start time.Time
	// statfs is syscall.Statfs (tests count and script it).
	statfs func(path string, st *syscall.Statfs_t) error
}

func newDiskMonitor(dir string, min int64) *diskMonitor {
	m := &diskMonitor{dir: dir, min: min, start: time.Now(), statfs: syscall.Statfs}
	m.free.Store(-1)
	m.poll()
	return m
}

// poll reads the free space now.
func (m *diskMonitor) poll() {
	if m == nil {
		return
	}
	m.read()
}

// read reads the free space now and keeps the reading; ok false: statfs
// failed (the space is unknown).
func (m *diskMonitor) read() (free int64, ok bool) {
	var st syscall.Statfs_t
	if err := m.statfs(m.dir, &st); err != nil {
		m.free.Store(-1)
		return 0, false
	}
	free = int64(st.Bavail) * int64(st.Bsize)
	m.free.Store(free)
	m.since.Store(0)
	m.at.Store(int64(time.Since(m.start)))
	return free, true
}

// admit counts n bytes about to be written for a new document and reads
// the free space again unless the last reading still holds (fresh).
func (m *diskMonitor) admit(n int64) {
	if m == nil || m.min <= 0 {
		return
	}
	if !m.fresh(m.since.Add(n)) {
		m.poll()
	}
}

// fresh reports whether the last reading may stand in for a new one after
// since bytes were admitted: it is younger than diskFreshAge and leaves
// twice the threshold free after them.
func (m *diskMonitor) fresh(since int64) bool {
	free := m.free.Load()
	if free < 0 || free-since-m.min < m.min { // twice the threshold, without overflow
		return false
	}
	return time.Duration(int64(time.Since(m.start))-m.at.Load()) < diskFreshAge
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
	free, ok := m.read()
	if !ok {
		return nil
	}
	if free-n < m.min/2 {
		return fmt.Errorf("the upload would leave %d bytes free in %s, below half of --min-free-disk %d", free-n, m.dir, m.min)
	}
	return nil
}

// diskFullError refuses a new document for lack of space.
func diskFullError(cause string) error {
	return limitError(ReasonDiskFull, diskRetryAfter, fmt.Sprintf(
		"disk full: the gateway has no room for new documents (%s); documents already accepted finish first; retry later", cause))
}

// admitDocument refuses a new document of n bytes (0: not known yet, a
// stream: its chunks are checked by room) while the disk is low.
func (s *Server) admitDocument(n int64) error {
	s.disk.admit(n)
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
