package bridge

import (
	"context"
	"errors"
	"time"

	"github.com/pipestream/gateway/bridge/store"
)

// Leaser is the optional part of a Store shared by several gateway
// replicas (pgstore): document ownership through leases
// (docs/scale-out.md, Leases and fencing). The bridge checks for it; the
// SQLite store, one process by construction (the data-dir lock), does not
// implement it and keeps its behaviour: every non-terminal document is
// recovered at start.
//
// With a Leaser, the bridge drives only documents whose lease its store
// holds: those it created, and those AcquireLeases hands it (at start and
// by the takeover scan every leaseScanInterval), which it recovers like a
// restart (a new dispatch attempt). A Commit refused by the lease check
// answers a *store.LeaseLostError; the bridge then drops those documents
// from memory without retrying, as it does when the store's hook reports
// them lost.
type Leaser interface {
	// AcquireLeases takes over up to limit non-terminal documents whose
	// lease expired or that have none, and returns them as
	// Store.ListNonTerminal does.
	AcquireLeases(ctx context.Context, limit int) ([]*store.DocumentRecord, error)
	// SetLeaseLostHook sets the function told which documents the store
	// stopped driving (taken over, or not renewed before its local
	// deadline). It is called without store locks held.
	SetLeaseLostHook(func(docIDs []string))
}

// listRecoverable returns the documents this bridge should drive at start:
// every non-terminal one, or with a Leaser those whose lease it acquired.
func (b *Bridge) listRecoverable(ctx context.Context) ([]*recoverable, error) {
	l, ok := b.st.(Leaser)
	if !ok {
		recs, err := b.st.ListNonTerminal(ctx)
		return wrapRecs(recs), err
	}
	l.SetLeaseLostHook(b.leaseLost)
	if n, ok := b.st.(ClaimNotifier); ok {
		n.SetClaimRedeemedHook(b.redeemedElsewhere)
	}
	if f, ok := b.st.(CancelForwarder); ok {
		f.SetCancelRequestedHook(b.cancelRequested)
	}
	recs, err := l.AcquireLeases(ctx, leaseAcquireBatch)
	return wrapRecs(recs), err
}

// recoverable is one document record to recover.
type recoverable struct{ rec *store.DocumentRecord }

func wrapRecs(recs []*store.DocumentRecord) []*recoverable {
	out := make([]*recoverable, len(recs))
	for i, r := range recs {
		out[i] = &recoverable{rec: r}
	}
	return out
}

// takeoverLoop is the takeover scan (Leaser only): every
// leaseScanInterval it acquires documents whose lease expired (their
// replica died or was cut off) and recovers them with a new attempt.
func (b *Bridge) takeoverLoop(ctx context.Context, l Leaser) {
	defer b.wg.Done()
	t := time.NewTicker(leaseScanInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		recs, err := l.AcquireLeases(ctx, leaseAcquireBatch)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, store.ErrClosed) {
				b.log.Warn("bridge: takeover scan failed", "err", err)
			}
			continue
		}
		if len(recs) == 0 {
			continue
		}
		b.log.Info("bridge: took over documents whose lease expired", "count", len(recs))
		b.recoverRecords(ctx, wrapRecs(recs))
	}
}

// leaseLost is the store's hook: the documents ids are driven elsewhere now
// (or will be), so this bridge forgets them.
func (b *Bridge) leaseLost(ids []string) {
	for _, id := range ids {
		d := lockDocOf(b.reg, func() *docRun { return b.docs[id] })
		if d != nil {
			d.dropLocked("lease lost")
		}
		unlockFound(d)
	}
}

// dropLocked stops driving d without changing its durable state: sending
// stops, the peer is told to give up on the root, pending changes are
// discarded (another replica owns the document now), and d leaves memory.
// Results and timers of its attempt find d.dropped and do nothing.
func (d *docRun) dropLocked(why string) {
	if d.dropped {
		return
	}
	d.dropped = true
	a := d.att
	if ss := d.sess(); ss != nil {
		if !d.leaveSession(ss) {
			d.env.sendCancelLocked(ss, d)
		}
		d.leftSession(ss)
	}
	releaseSessLocked(a)
	a.stopSending()
	a.stopFinishTimer()
	a.dropPlainLocked()
	a.ended = true
	d.env.regLock()
	if d.queued {
		d.env.reg.unqueue(d)
		d.queued = false
	}
	forgot := d.env.reg.forget(d)
	d.env.regUnlock()
	if forgot && !d.terminal() {
		d.env.m.running.Dec()
	}
	d.env.log.Warn("bridge: stopped driving a document; another replica takes it over", "doc", d.id, "why", why)
}
