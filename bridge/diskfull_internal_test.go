package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// fullDisk is a writer whose first fails writes take half the bytes and
// fail with ENOSPC (as a file on a full disk does).
type fullDisk struct {
	buf   bytes.Buffer
	fails int
}

func (f *fullDisk) Write(p []byte) (int, error) {
	if f.fails > 0 {
		f.fails--
		n := len(p) / 2
		f.buf.Write(p[:n])
		return n, &fs.PathError{Op: "write", Path: "result.tmp", Err: syscall.ENOSPC}
	}
	return f.buf.Write(p)
}

// TestDiskRetryWriter: writes that fail for lack of space are retried
// from where they stopped until they go through (every byte once, in
// order), waiting before each retry and reporting the recovery; other
// errors and a waiter that gives up fail at once.
func TestDiskRetryWriter(t *testing.T) {
	fd := &fullDisk{fails: 3}
	var waits []int
	recovered := 0
	w := diskRetryWriter{w: fd, r: diskRetry{
		wait:      func(attempt int, err error) bool { waits = append(waits, attempt); return IsDiskFull(err) },
		recovered: func() { recovered++ },
	}}
	data := []byte("0123456789abcdef")
	if n, err := w.Write(data); err != nil || n != len(data) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(data))
	}
	if !bytes.Equal(fd.buf.Bytes(), data) {
		t.Errorf("wrote %q, want %q", fd.buf.Bytes(), data)
	}
	if fmt.Sprint(waits) != "[0 1 2]" || recovered != 1 {
		t.Errorf("waits %v, recovered %d; want [0 1 2] and 1", waits, recovered)
	}

	gaveUp := diskRetryWriter{w: &fullDisk{fails: 5}, r: diskRetry{wait: func(int, error) bool { return false }, recovered: func() {}}}
	if _, err := gaveUp.Write(data); !IsDiskFull(err) {
		t.Errorf("a waiter that gives up: %v, want the ENOSPC error", err)
	}
	other := diskRetry{wait: func(int, error) bool { t.Error("waited for a non-space error"); return true }, recovered: func() {}}
	if err := other.do(func() error { return syscall.EIO }); !errors.Is(err, syscall.EIO) {
		t.Errorf("EIO: %v", err)
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{{syscall.ENOSPC, true}, {syscall.EDQUOT, true}, {errors.New("sqlite: database or disk is full (13)"), true}, {syscall.EIO, false}, {nil, false}} {
		if got := IsDiskFull(tc.err); got != tc.want {
			t.Errorf("IsDiskFull(%v) = %v", tc.err, got)
		}
	}
}
