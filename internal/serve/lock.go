package serve

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockFileName is the exclusive lock of a data directory.
const lockFileName = "LOCK"

// DirLock is a held lock on a data directory: flock(LOCK_EX) on
// <dir>/LOCK, which also holds the holder's pid. The kernel releases it
// when the process ends, however it ends (kill -9 included), so a stale
// file never blocks a restart.
type DirLock struct{ f *os.File }

// ErrDirLocked is wrapped by LockDataDir when another process holds dir.
var ErrDirLocked = errors.New("data directory is in use")

// LockDataDir takes the exclusive lock of dir (creating dir if needed)
// before anything else in it is touched. If another process holds it, it
// fails at once, naming the holder's pid from the lock file; it never
// waits and never changes the file then.
func LockDataDir(dir, flagName string) (*DirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagName, dir, err)
	}
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s %s: open the lock file: %w", flagName, dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := lockHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s %s is locked by %s (%s); stop that process or choose another %s",
				ErrDirLocked, flagName, dir, holder, path, flagName)
		}
		return nil, fmt.Errorf("%s %s: lock %s: %w", flagName, dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		_ = f.Sync()
	}
	return &DirLock{f: f}, nil
}

// lockHolder describes the process named in a held lock file.
func lockHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:n])))
	if err != nil || pid <= 0 {
		return "another process (its pid is not written yet)"
	}
	return "pid " + strconv.Itoa(pid)
}

// Release unlocks the directory (the process exit does it as well). The
// file stays: removing it would race with a process that just opened it.
func (l *DirLock) Release() {
	if l != nil && l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}
