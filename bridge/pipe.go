package bridge

import (
	"context"
	"io"

	"github.com/pipestream/gateway/bridge/internal/split"
)

// pipe hands chunks from an Upload to the attempt that sends them while the
// upload is still streaming (profile 4.2). The channel is unbuffered: the
// producer blocks until the sender took the previous chunk, so one chunk is
// being cut while one is in flight, and the client's upload is paced by the
// peer (QUIC flow control) instead of filling memory.
type pipe struct {
	ch      chan split.Chunk
	dead    chan struct{} // closed when the sending attempt has ended
	stopped chan struct{}
	fin     chan pipeSummary
	n       uint64
}

type pipeSummary struct {
	size int64
	sum  [32]byte
}

// startPipe starts a pipelined attempt for d on the active session, or
// returns nil when no session is up (the upload then only spools).
func (d *docRun) startPipe() *pipe {
	d.lock()
	defer d.unlock()
	d.env.regLock()
	ss := d.env.pickSessionRegLocked(false, d.plan.needsMetadata() != "")
	if ss == nil || d.env.reg.closing || !ss.mode.pipelined() {
		d.env.regUnlock()
		return nil // plain documents are sent from the spool (docs/profile.md 9)
	}
	d.uploading = true
	j, prev := d.placeRegLocked(ss)
	d.env.regUnlock()
	d.attemptStartedLocked(prev)
	p := &pipe{ch: make(chan split.Chunk), dead: make(chan struct{}), stopped: make(chan struct{}), fin: make(chan pipeSummary, 1)}
	d.env.wg.Add(1)
	go func() {
		defer d.env.wg.Done()
		defer close(p.dead)
		j.runAttempt(p)
	}()
	return p
}

// put hands c to the sender; it returns at once if the sender is gone.
func (p *pipe) put(ctx context.Context, c split.Chunk) {
	select {
	case p.ch <- c:
	case <-p.dead:
	case <-ctx.Done():
	}
}

// endChunks tells the sender that every chunk was handed over.
func (p *pipe) endChunks(sp *split.Splitter) {
	p.n = sp.Count()
	close(p.ch)
}

// finish lets the sender send the root envelope once the document is
// committed.
func (p *pipe) finish(size int64, sum [32]byte) { p.fin <- pipeSummary{size, sum} }

// stop releases a sender waiting for finish (upload failed or not pipelined).
func (p *pipe) stop() {
	select {
	case <-p.stopped:
	default:
		close(p.stopped)
	}
}

func (p *pipe) alive() bool {
	select {
	case <-p.dead:
		return false
	default:
		return true
	}
}

// next implements chunkSource.
func (p *pipe) next(ctx context.Context) (split.Chunk, error) {
	select {
	case c, ok := <-p.ch:
		if !ok {
			return split.Chunk{}, io.EOF
		}
		return c, nil
	case <-p.stopped:
		return split.Chunk{}, context.Canceled
	case <-ctx.Done():
		return split.Chunk{}, ctx.Err()
	}
}

// summary implements chunkSource: it waits until the upload committed.
func (p *pipe) summary(ctx context.Context) (int64, [32]byte, uint64, error) {
	select {
	case s := <-p.fin:
		return s.size, s.sum, p.n, nil
	case <-p.stopped:
		return 0, [32]byte{}, 0, context.Canceled
	case <-ctx.Done():
		return 0, [32]byte{}, 0, ctx.Err()
	}
}
