package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/pipestream/gateway/bridge/store"
)

// Full disk (issue 11): the gateway's own writes of a result never fail a
// document for lack of space. A write that fails with ENOSPC or EDQUOT
// is retried with backoff (diskRetryFirst doubling to diskRetryMax) until
// space returns or the bridge closes; reading the peer's result stream
// pauses meanwhile (QUIC flow control holds the peer). While it waits the
// document's error says "disk full", so nobody takes the delay for a peer
// failure. Store commits already retry on their own (flush).

const (
	diskRetryFirst = 100 * time.Millisecond
	diskRetryMax   = 5 * time.Second
	// storeReserveBytes is left free by result writes for the store:
	// a result waits while less would remain, so the store can still
	// commit the states (the "disk full" error included) that readers see.
	storeReserveBytes = 4 << 20
)

// errReserve is the lack of space a result write meets when it would eat
// into storeReserveBytes.
var errReserve = fmt.Errorf("less than %d bytes would stay free for the store: %w", storeReserveBytes, syscall.ENOSPC)

// freeSpace is the space available to the gateway in dir (-1: unknown).
func freeSpace(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// IsDiskFull reports whether err is a lack of space or quota: ENOSPC,
// EDQUOT, or SQLite's "database or disk is full".
func IsDiskFull(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(err.Error(), "disk is full"))
}

// diskRetry is how a document's result writes wait out a full disk.
type diskRetry struct {
	// wait is called before retry attempt (0, 1, ...) of a write that
	// failed with err for lack of space; false: give up (bridge closing).
	wait func(attempt int, err error) bool
	// recovered is called when a write succeeds after waiting.
	recovered func()
}

// do runs op until it succeeds, fails otherwise than for lack of space, or
// wait gives up.
func (r diskRetry) do(op func() error) error {
	for attempt := 0; ; attempt++ {
		err := op()
		if err == nil {
			if attempt > 0 {
				r.recovered()
			}
			return nil
		}
		if !IsDiskFull(err) || !r.wait(attempt, err) {
			return err
		}
	}
}

// diskRetryWriter retries writes to w that fail for lack of space (see
// above), continuing after what a partial write took. With dir set, a
// write that would leave less than storeReserveBytes free in dir counts
// as lacking space too.
type diskRetryWriter struct {
	w   io.Writer
	r   diskRetry
	dir string
}

func (d diskRetryWriter) Write(p []byte) (int, error) {
	written := 0
	err := d.r.do(func() error {
		if d.dir != "" {
			if free := freeSpace(d.dir); free >= 0 && free-int64(len(p)-written) < storeReserveBytes {
				return errReserve
			}
		}
		n, err := d.w.Write(p[written:])
		written += n
		return err
	})
	return written, err
}

// createResultRetrying is Store.CreatePayload of a result, retried on a
// full disk.
func createResultRetrying(ctx context.Context, st Store, docID string, r diskRetry) (pf store.PayloadWriter, err error) {
	err = r.do(func() error {
		pf, err = st.CreatePayload(ctx, docID, store.PayloadResult)
		return err
	})
	return pf, err
}

// diskFullPrefix starts the document error of a result waiting for space.
const diskFullPrefix = "disk full: "

// diskRetryFor is the diskRetry of document d's result: while it waits,
// the document's error says "disk full" (set at the first attempt, one
// event), cleared again once the write went through; the backoff sleeps
// outside the bridge's lock.
func (d *docRun) diskRetryFor() diskRetry {
	return diskRetry{
		wait: func(attempt int, err error) bool {
			d.lock()
			d.env.regLock()
			closing := d.env.reg.closing
			d.env.regUnlock()
			if attempt == 0 && !closing && !d.terminal() {
				d.env.log.Warn("bridge: disk full while storing a result; retrying until space returns", "doc", d.id, "err", err)
				d.setState(d.rec.Doc.State, fmt.Sprintf(diskFullPrefix+"storing the result on the gateway failed (%v); retrying until space returns (a local failure, not the peer's)", err))
				d.env.kickFlush()
			}
			d.unlock()
			if closing {
				return false
			}
			time.Sleep(min(diskRetryFirst<<min(attempt, 6), diskRetryMax))
			return true
		},
		recovered: func() {
			d.lock()
			defer d.unlock()
			if !d.terminal() && strings.HasPrefix(d.rec.Doc.Error, diskFullPrefix) {
				d.rec.Doc.Error = ""
				d.out.markDirty(time.Now())
				d.env.kickFlush()
			}
		},
	}
}
