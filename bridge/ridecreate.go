package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// A small document's creation may ride with its result (docs/performance.md,
// "One commit per small document"): instead of committing the Create batch
// and only then dispatching, Submit dispatches the document at once with
// its content held in memory, waits up to Options.CreateHold
// (--create-hold) for it to finish, and commits whatever it then is
// (finished, or still running) in one Create batch: the document row in
// its newest state, every event from the creation on, the result, and the
// content only when the document is not finished. A document that
// finishes in time costs one commit instead of two (no update of its row,
// no content row written and deleted).
//
// Until that commit the document does not exist for anyone but its peer:
// no read, list or event shows it, and Submit has not answered, so a crash
// loses nothing that was accepted (the client retries). What the peer did
// is then lost with it, as any work on a document a failed Submit named.

// mayRideCreate reports whether this upload's creation may wait for its
// result: the content is whole and in memory, and no request id asks the
// store to deduplicate (a duplicate is found only at the commit, after the
// work).
func (u *upload) mayRideCreate() bool {
	return u.b.opts.CreateHold > 0 && u.inline != nil && u.pipe == nil && u.d.rec.Doc.GetRequestId() == ""
}

// commitRiding dispatches the document before its Create commits and
// commits it once it finished or Options.CreateHold passed, whichever is
// first.
func (u *upload) commitRiding(ctx context.Context, size int64, sum [32]byte) (*gatewayv1.Document, error) {
	b, d := u.b, u.d
	settled := u.dispatchUncommitted(size, sum)
	t := time.NewTimer(b.opts.CreateHold)
	select {
	case <-settled:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	if err := ctx.Err(); err != nil {
		// The client left before anything was committed: the document was
		// never accepted.
		u.dropUncommitted()
		return nil, err
	}
	d.lock()
	batch, snapRev, changes := u.takeCreateLocked(size, sum, true)
	took := docFlush{d: d, rev: snapRev, took: changes, final: d.terminal()}
	d.settled = nil
	d.unlock()
	// From here the outcome must be known: a commit that went through
	// after Submit gave up would leave a document no one drives.
	_, err := b.commit(context.WithoutCancel(ctx), batch)
	if err != nil {
		u.dropUncommitted()
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("document id %s exists: %w", d.id, ErrConflict)
		}
		return nil, fmt.Errorf("commit document: %w", err)
	}
	if took.final {
		b.m.ridingCreates.WithLabelValues("finished").Inc()
	} else {
		b.m.ridingCreates.WithLabelValues("unfinished").Inc()
	}
	d.lock()
	d.committed = true
	d.persistedRev = snapRev
	d.uploading = false
	d.pending = nil
	detach, _ := took.flushedLocked()
	d.unlock()
	// The answer is the document as committed (the store is done with
	// the batch: publicDoc copies it).
	out := b.publicDoc(batch.Create)
	runDetach(b, detach)
	b.kickFlush()
	return out, nil
}

// dispatchUncommitted registers the document and queues it for dispatch
// before its Create commits, its content held in memory (d.pending) for
// every send until then. It returns a channel closed when the document
// reaches a terminal state.
func (u *upload) dispatchUncommitted(size int64, sum [32]byte) <-chan struct{} {
	b, d := u.b, u.d
	d.lock()
	defer d.unlock()
	settled := make(chan struct{})
	d.settled = settled
	u.noteContentLocked(size, sum)
	d.pending = u.inline
	b.mu.Lock()
	b.docs[d.id] = d // a new id (newDocID): nothing else holds it
	b.mu.Unlock()
	b.m.running.Inc()
	d.enqueueLocked()
	return settled
}

// dropUncommitted undoes dispatchUncommitted after the Create failed:
// this process forgets the document (Upload then abandons its attempt and
// tells the peer to drop it). Its state becomes FAILED, without an event
// (nothing of it was ever committed), so nothing queues it again.
func (u *upload) dropUncommitted() {
	d := u.d
	d.env.m.ridingCreates.WithLabelValues("dropped").Inc()
	d.lock()
	d.pending, d.settled = nil, nil
	if !d.terminal() {
		d.env.m.running.Dec()
	}
	d.rec.Doc.State = gatewayv1.State_FAILED
	d.env.regLock()
	if d.queued {
		d.env.reg.unqueue(d)
		d.queued = false
	}
	d.env.reg.forget(d)
	d.env.regUnlock()
	d.unlock()
}
