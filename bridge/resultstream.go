package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"sync"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Streamed results (docs/profile.md 4.3.1): the peer sends the result of a
// dehydrated document in parts while its children complete, each part an
// entity stream of the root with role "result-part" and chunk-info
// {chunk-index: part number, chunk-offset: result offset}, then a summary
// stream with role "result", an empty payload and the whole result's part
// count, length and SHA-256 in metadata (the draft's "final summary
// entity", Section 10.2). The bridge appends the parts in part order to one
// result file while hashing them, so the result is on disk when the last
// child completes instead of crossing QUIC after it.

// Profile metadata keys of streamed results.
const (
	roleResult       = "result"
	roleResultPart   = "result-part"
	metaResultParts  = "pipestream.result-parts"
	metaResultLength = "pipestream.result-length"
	metaResultSHA    = "pipestream.result-sha256"
)

// resultStream assembles one attempt's streamed result. The attempt holds
// it under the document's lock; its own fields are guarded by mu.
type resultStream struct {
	docID string

	mu     sync.Mutex
	cond   *sync.Cond
	next   uint64 // number of the next part to append
	off    int64  // octets appended so far
	busy   bool   // the part numbered next is being copied (without mu)
	pf     store.PayloadWriter
	sum    hash.Hash
	err    error // the assembly failed: later parts and the summary fail
	closed bool  // the attempt is over; the file is (being) removed
	synced bool  // the summary committed the file
}

func newResultStream(docID string) *resultStream {
	rs := &resultStream{docID: docID, sum: sha256.New()}
	rs.cond = sync.NewCond(&rs.mu)
	return rs
}

// errResultStreamClosed: the attempt the stream belonged to is over.
var errResultStreamClosed = errors.New("the result stream's attempt is over")

// waitTurnLocked waits until part k may be appended (k == next and no copy
// in flight) and returns nil, or returns why it never will.
func (rs *resultStream) waitTurnLocked(k uint64) error {
	if k > rs.next+maxResultPartsAhead {
		return fmt.Errorf("result part %d arrived while part %d is still missing (more than %d ahead)", k, rs.next, maxResultPartsAhead)
	}
	for rs.err == nil && !rs.closed && (rs.next != k || rs.busy) {
		if k < rs.next {
			return fmt.Errorf("result part %d arrived twice", k)
		}
		rs.cond.Wait()
	}
	if rs.closed {
		return errResultStreamClosed
	}
	return rs.err
}

// failLocked records the first failure and wakes every waiter.
func (rs *resultStream) failLocked(err error) {
	if rs.err == nil {
		rs.err = err
	}
	rs.cond.Broadcast()
}

// appendPart copies part k (offset off, payload r) to the result file once
// every earlier part is in. r's checksum and length are verified by the
// session's payload reader; a verification failure fails the assembly.
func (rs *resultStream) appendPart(ctx context.Context, st Store, k uint64, off uint64, r io.Reader, disk diskRetry, dir string) (int64, error) {
	rs.mu.Lock()
	if err := rs.waitTurnLocked(k); err != nil {
		rs.failLocked(err)
		rs.mu.Unlock()
		return 0, err
	}
	if off != uint64(rs.off) {
		err := fmt.Errorf("result part %d starts at offset %d, the parts before it end at %d", k, off, rs.off)
		rs.failLocked(err)
		rs.mu.Unlock()
		return 0, err
	}
	if rs.pf == nil {
		pf, err := createResultRetrying(ctx, st, rs.docID, disk)
		if err != nil {
			rs.failLocked(err)
			rs.mu.Unlock()
			return 0, err
		}
		rs.pf = pf
	}
	rs.busy = true
	pf, sum := rs.pf, rs.sum
	rs.mu.Unlock()

	n, err := io.Copy(io.MultiWriter(diskRetryWriter{w: pf, r: disk, dir: dir}, sum), r)

	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.busy = false
	if rs.closed {
		rs.abortFileLocked()
		return n, errResultStreamClosed
	}
	if err != nil {
		rs.failLocked(fmt.Errorf("result part %d: %w", k, err))
		return n, err
	}
	rs.next++
	rs.off += n
	rs.cond.Broadcast()
	return n, nil
}

// finish checks the summary against the appended parts once all of them
// are in, and makes the result payload durable. It reports whether there
// is one (false for an empty result: no parts).
func (rs *resultStream) finish(parts uint64, length uint64, want []byte) (bool, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if err := rs.waitTurnLocked(parts); err != nil {
		rs.failLocked(err)
		return false, err
	}
	var err error
	switch got := rs.sum.Sum(nil); {
	case uint64(rs.off) != length:
		err = wire.Errorf(wire.CodeIntegrityError, "the %d result parts hold %d octets, the summary says %d", parts, rs.off, length)
	case string(got) != string(want):
		err = wire.Errorf(wire.CodeIntegrityError, "the SHA-256 of the result parts is %x, the summary says %x", got, want)
	}
	if err != nil {
		rs.failLocked(err)
		return false, err
	}
	rs.err = errors.New("a result part arrived after the summary") // nothing may follow
	if rs.pf == nil {
		return false, nil
	}
	// fsync without mu: close (under the document's lock) must not wait for the disk.
	rs.busy = true
	pf := rs.pf
	rs.mu.Unlock()
	err = pf.Sync()
	rs.mu.Lock()
	rs.busy = false
	if err != nil {
		return false, err
	}
	rs.synced = true
	return true, nil
}

// close ends the assembly of an attempt that is over: waiters give up and
// the unfinished file is removed (a committed one stays: it is the
// document's result).
func (rs *resultStream) close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.closed = true
	if !rs.busy {
		rs.abortFileLocked()
	}
	rs.cond.Broadcast()
}

func (rs *resultStream) abortFileLocked() {
	if rs.pf != nil && !rs.synced {
		_ = rs.pf.Abort()
	}
}

// resultStreamLocked returns a's assembly, creating it.
func (a *attempt) resultStreamLocked() *resultStream {
	if a.rstream == nil {
		a.rstream = newResultStream(a.d.id)
	}
	return a.rstream
}

// dropResultStreamLocked ends a's assembly, if any (attempt over, or
// document finished).
func (a *attempt) dropResultStreamLocked() {
	if a.rstream != nil {
		a.rstream.close()
		a.rstream = nil
	}
}

// onResultPart appends one part of a's streamed result.
func (a *attempt) onResultPart(e *quicpeer.IncomingEntity) {
	h, d := e.Header, a.d
	a.d.lock()
	if !a.newest() {
		a.d.unlock()
		_, _ = io.Copy(io.Discard, e.Payload)
		return
	}
	rs := a.resultStreamLocked()
	a.d.unlock()
	var n int64
	err := errors.New("a result part without chunk-info (part number and offset)")
	if h.ChunkInfo != nil {
		n, err = rs.appendPart(a.d.env.ctx, a.d.env.st, h.ChunkInfo.ChunkIndex, h.ChunkInfo.ChunkOffset, e.Payload, d.diskRetryFor(), a.d.env.opts.DataDir)
	}
	a.d.env.m.bytesOut.Add(float64(n))
	if err != nil {
		_, _ = io.Copy(io.Discard, e.Payload)
		a.resultFailed(err)
		return
	}
	a.d.env.m.resultParts.Inc()
}

// onResultSummary completes a's streamed result from its summary entity.
func (a *attempt) onResultSummary(e *quicpeer.IncomingEntity) {
	h, d := e.Header, a.d
	_, _ = io.Copy(io.Discard, e.Payload)
	parts, err1 := strconv.ParseUint(h.Metadata[metaResultParts], 10, 64)
	length, err2 := strconv.ParseUint(h.Metadata[metaResultLength], 10, 64)
	want, err3 := hex.DecodeString(h.Metadata[metaResultSHA])
	a.d.lock()
	if !a.newest() {
		a.d.unlock()
		return
	}
	rs := a.resultStreamLocked()
	a.d.unlock()
	var stored bool
	var err error
	switch {
	case h.PayloadLength != 0:
		err = fmt.Errorf("the result summary carries %d payload octets, it must carry none", h.PayloadLength)
	case err1 != nil || err2 != nil || err3 != nil || len(want) != sha256.Size:
		err = fmt.Errorf("the result summary's %s, %s or %s is malformed", metaResultParts, metaResultLength, metaResultSHA)
	default:
		stored, err = rs.finish(parts, length, want)
	}
	if err != nil {
		rs.mu.Lock()
		rs.failLocked(err)
		rs.mu.Unlock()
		a.resultFailed(err)
		return
	}
	a.d.lock()
	defer a.d.unlock()
	if !a.newest() {
		return
	}
	if a.rstream == rs {
		a.rstream = nil
	}
	a.resultReady = true
	d.rec.ResultPayload = stored
	if !stored {
		d.out.result = []byte{} // an empty result is committed inline
	}
	d.rec.ResultContentType = h.ContentType
	d.rec.Doc.ResultSizeBytes = length
	d.maybeFinishLocked()
	a.d.env.kickFlush()
}

// resultFailed records that a's streamed result failed.
func (a *attempt) resultFailed(err error) {
	a.d.lock()
	defer a.d.unlock()
	if !a.newest() || a.resultErr != "" || errors.Is(err, errResultStreamClosed) {
		return
	}
	a.d.resultFailedLocked(err, "the streamed result failed")
}

// resultFailedLocked records why d's current result failed: verification
// (a wire error: the peer sent bad bytes) or what (storage, protocol), and
// finishes d if its root already completed. Caller holds mu.
func (d *docRun) resultFailedLocked(err error, what string) {
	if d.att.ended || d.terminal() {
		return // the attempt is over (its document runs again) or d finished
	}
	if quicpeer.ConnectionLost(err) {
		// The session ended under the result (the peer shut down or was
		// lost): not the document's fault nor the result's. The session's
		// HandleClose aborts the attempt and dispatches the document again.
		d.env.log.Info("bridge: the session ended while a result arrived; the document runs again", "doc", d.id, "err", err)
		return
	}
	if IsDiskFull(err) {
		// A local failure that outlived the write retries (e.g. the final
		// fsync): the peer did its part, so the document is dispatched
		// again (not counted against its attempts) instead of failing
		// acknowledged work (issue 11, docs/security.md).
		d.env.log.Warn("bridge: storing a result failed for lack of space; dispatching the document again", "doc", d.id, "err", err)
		d.abortAttemptLocked(diskFullPrefix+what+": "+err.Error()+" (a local failure, not the peer's; dispatching again)", false)
		return
	}
	if errors.Is(err, store.ErrUnavailable) {
		// The database went away while the result was stored (a restart,
		// a failover): the peer did its part, so the document is
		// dispatched again, not counted, as after a full disk.
		d.env.log.Warn("bridge: storing a result failed, the store is unavailable; dispatching the document again", "doc", d.id, "err", err)
		d.abortAttemptLocked(what+": "+err.Error()+" (the store was unavailable, not the peer's fault; dispatching again)", false)
		return
	}
	a := d.att
	var we *wire.Error
	if errors.As(err, &we) {
		a.resultErr = fmt.Sprintf("the result failed verification (%v); resubmit the document", err)
	} else {
		a.resultErr = fmt.Sprintf("%s: %v", what, err)
	}
	d.env.log.Error("bridge: result stream failed", "doc", d.id, "err", err)
	if a.rootComplete {
		d.maybeFinishLocked()
	}
}
