// Package eventlog is the sequenced, resumable event log (docs/architecture.md,
// the event log): the AT sync draft's streaming semantics (seq, cursors, backfill
// window, #info OutdatedCursor, FutureCursor and ConsumerTooSlow errors) over
// the events the store commits, with the RRDP delta retention draft's
// client-driven retention. It commits through Store (store.go), the part of
// the durable store it needs, so any backend that keeps that contract works.
//
// # Data path
//
// Events are committed by bridge/store (Append is Commit; any Commit that
// carries events works the same). The store's event hook hands every
// committed transaction's events to the Log in seq order before the
// committing callers return; the Log decodes them once into a shared,
// bounded in-memory tail and wakes every waiting subscriber. Live
// subscribers read the tail through a cursor (a seq and a ring position):
// delivery never touches disk and costs no per-subscriber copy. A subscriber
// whose cursor is older than the tail replays from the store in pages, then
// switches to the tail without gap or duplicate.
//
// # Memory
//
// Per subscriber: a fixed struct (cursor, filter, a 64-pointer batch, about
// 1 KiB) and nothing else: no queue. A subscriber blocked in send holds no
// events; when it returns and its next seq has left the tail, it gets
// ErrConsumerTooSlow (if it had been live) or resumes from the store (if it
// was still catching up). Shared: the tail (Options.TailEvents,
// TailBytes) and the retention index (24 bytes per retained event).
//
// # Retention
//
// See docs/retention.md. The same engine (internal/retention) runs in the
// simulator, fed with a simulated clock.
package eventlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog/internal/retention"
	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Errors. The messages start with the AT sync draft's error names, which the
// gateway puts in error frames. bridge maps them to its own values of the
// same text (bridge.ErrFutureCursor, bridge.ErrConsumerTooSlow).
var (
	ErrFutureCursor    = errors.New("FutureCursor: cursor is ahead of the latest event")
	ErrConsumerTooSlow = errors.New("ConsumerTooSlow: subscriber fell too far behind")
	ErrClosed          = errors.New("eventlog: closed")
)

// Event kinds (docs/architecture.md, the event log).
const (
	KindStatus   = "#status"
	KindDocument = "#document"
	KindClaim    = "#claim"
	KindSync     = "#sync"
	KindInfo     = "#info"
	// InfoOutdatedCursor is the #info name sent before the whole window
	// when a cursor is older than the oldest retained event.
	InfoOutdatedCursor = "OutdatedCursor"
)

// Log is the event log. Safe for concurrent use.
type Log struct {
	st   Store
	opts Options
	ret  *retention.Retainer
	m    *retention.Metrics
	tail *tail
	fan  *fanout // workers serving pushed subscribers (push.go)

	pubMu   sync.Mutex // serializes publication (hook) with load and subscribe
	loading bool
	pending []*item

	floor     atomic.Uint64 // prune boundary announced before the store deletes
	snap      snapshotSize  // store.SnapshotBytes, last read (snapshot.go)
	sincePass atomic.Int64  // events appended since the last retention pass
	trigger   chan struct{}
	pruneMu   sync.Mutex

	subs      atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New opens the log over st: it loads the retained events' metadata (seq,
// time, size) for retention, installs the store's event hook and starts the
// retention pass (unless Options.DisablePruner). One Log per store.
func New(ctx context.Context, st Store, opts Options) (*Log, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg, tcfg, err := o.RetentionConfig()
	if err != nil {
		return nil, err
	}
	m := retention.NewMetrics(o.Registerer)
	l := &Log{
		st:      st,
		opts:    o,
		m:       m,
		ret:     retention.NewRetainer(cfg, tcfg, o.Now(), o.Logger, m),
		tail:    newTail(o.TailEvents, o.TailBytes),
		loading: true,
		trigger: make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	l.fan = newFanout(l)
	base := st.LastSeq() // every later seq reaches us through the hook
	st.SetEventHook(l.onCommit)
	if err := l.load(ctx, base); err != nil {
		st.SetEventHook(nil)
		return nil, err
	}
	// The snapshot size (the store's running total, one row) is read by
	// the first retention pass or the first Window.
	if !o.DisablePruner {
		l.wg.Add(1)
		go l.pruner()
		if _, ok := st.(PositionSharer); ok && !o.DisableAdaptive {
			l.wg.Add(1)
			go l.shareLoop()
		}
	}
	return l, nil
}

// load reads the metadata of every retained event into the retention index,
// then publishes what the hook queued meanwhile. base is LastSeq read before
// the hook was installed: the hook delivers everything above it, the read
// delivers what is retained below it, and the overlap is dropped by seq.
func (l *Log) load(ctx context.Context, base uint64) error {
	last, err := l.loadIndex(ctx)
	if err != nil {
		return fmt.Errorf("eventlog: load retained events: %w", err)
	}
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	l.tail.setLatest(max(base, last))
	pend := l.pending
	l.pending, l.loading = nil, false
	l.publishLocked(pend)
	return nil
}

// EventMetaReader and EventRangeReader are the optional readers of a
// store (both backends implement them; store.EventMetaReader and
// store.EventRangeReader document them).
type (
	EventMetaReader  = store.EventMetaReader
	EventRangeReader = store.EventRangeReader
)

// loadIndex feeds every retained event's metadata to the retention index
// and returns the last seq read: by seq range when more events are
// retained than half the index's buckets (the index would merge them into
// buckets anyway), else event by event.
func (l *Log) loadIndex(ctx context.Context) (last uint64, err error) {
	if rr, ok := l.st.(EventRangeReader); ok {
		st, err := l.st.EventStats(ctx)
		if err != nil {
			return 0, err
		}
		half := uint64(max(l.opts.IndexBuckets/2, 1))
		if st.Count > half {
			width := (st.LatestSeq - st.OldestSeq + half) / half
			err = rr.EachEventRange(ctx, st.OldestSeq, st.LatestSeq, width, func(r store.EventRange) error {
				l.ret.AppendedRange(r.First, r.Last, r.Count, r.Oldest, r.Newest, r.Bytes)
				last = r.Last
				return nil
			})
			return last, err
		}
	}
	if mr, ok := l.st.(EventMetaReader); ok {
		err = mr.EachEventMeta(ctx, func(seq uint64, t time.Time, size int) error {
			l.ret.Appended(seq, t, size)
			last = seq
			return nil
		})
		return last, err
	}
	from := uint64(0)
	for {
		recs, err := l.st.ReadEvents(ctx, store.EventQuery{From: from, Limit: 4096, AllTenants: true})
		if err != nil || len(recs) == 0 {
			return last, err
		}
		for i := range recs {
			l.ret.Appended(recs[i].Seq, recs[i].Time, recs[i].Size())
			last = recs[i].Seq
		}
		from = last + 1
	}
}

// onCommit is the store's event hook: it runs on the store's writer
// goroutine, once per transaction, in seq order, before Commit returns. It
// decodes each event once; subscribers share the decoded message.
func (l *Log) onCommit(recs []store.EventRecord) {
	if len(recs) == 0 {
		return
	}
	arr := make([]item, len(recs))
	items := make([]*item, len(recs))
	for i := range recs {
		r := &recs[i]
		ev, err := r.Decode()
		if err != nil { // the store encoded it; keep the envelope fields
			l.opts.Logger.Error("eventlog: undecodable event body", "seq", r.Seq, "err", err)
			ev = &gatewayv1.Event{Seq: r.Seq, Kind: r.Kind, DocumentId: r.DocID, Rev: r.Rev, Since: r.Since}
		}
		arr[i] = item{seq: r.Seq, tenant: r.Tenant, kind: r.Kind, doc: r.DocID, size: r.Size(), t: r.Time, ev: ev}
		items[i] = &arr[i]
	}
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	if l.loading {
		l.pending = append(l.pending, items...)
		return
	}
	l.publishLocked(items)
}

// publishLocked records items (ascending) in the retention index and puts
// them on the tail, dropping any at or below the latest published seq.
func (l *Log) publishLocked(items []*item) {
	latest := l.tail.latestSeq()
	out := items[:0] // in place, until a gap item must go in
	cloned := false
	n := 0
	for _, it := range items {
		if it.seq <= latest {
			continue
		}
		if it.seq > latest+1 {
			// Seqs are dense (Store): latest+1..it.seq-1 never reached us.
			if !cloned {
				out, cloned = slices.Clone(out), true
			}
			out = append(out, l.gapItem(latest+1, it.seq-1))
		}
		l.ret.Appended(it.seq, it.t, it.size)
		out = append(out, it)
		latest = it.seq
		n++
	}
	l.tail.publish(out)
	l.fan.wake()
	if l.m != nil {
		l.m.Appended.Add(float64(n))
	}
	if l.sincePass.Add(int64(n)) >= int64(l.opts.PruneEveryEvents) {
		select {
		case l.trigger <- struct{}{}:
		default:
		}
	}
}

// Append commits b through the store (group commit) and returns once it is
// durable; its events are already on the tail, with their seqs, when Append
// returns. Events of a batch get consecutive seqs (res.Seqs).
func (l *Log) Append(ctx context.Context, b *store.Batch) (store.CommitResult, error) {
	select {
	case <-l.done:
		return store.CommitResult{}, ErrClosed
	default:
	}
	return l.st.Commit(ctx, b)
}

// oldest is the oldest seq a subscriber may rely on: the retention index's
// oldest, raised by a prune in progress. Callers hold pubMu.
func (l *Log) oldestLocked() uint64 {
	o, _, _, _ := l.ret.Window()
	return max(o, l.floor.Load())
}

// isClosed reports whether Close was called.
func (l *Log) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Subscribers is the number of open subscriptions.
func (l *Log) Subscribers() int { return int(l.subs.Load()) }

// Latest is the newest committed seq (0 before the first event).
func (l *Log) Latest() uint64 { return l.tail.latestSeq() }

// Window reports the retained window: oldest and latest retained seq,
// retained events and bytes (the store's encoded size), the snapshot size
// (store.SnapshotBytes, the cap on retained bytes: the store's running
// total, exact as of its last commit) and the number of clients that
// currently count for retention. It plays the RRDP notification file's
// role.
func (l *Log) Window(ctx context.Context) (*gatewayv1.EventWindow, error) {
	select {
	case <-l.done:
		return nil, ErrClosed
	default:
	}
	oldest, latest, events, bytes := l.ret.Window()
	if f := l.floor.Load(); f > oldest && f <= latest {
		oldest = f
	}
	active := 0
	cfg := l.ret.Config()
	if cfg.Adaptive {
		l.ret.Tracker().Each(l.opts.Now(), cfg.InactiveAfter, func(retention.ClientView) { active++ })
	}
	return &gatewayv1.EventWindow{
		OldestSeq:      oldest,
		LatestSeq:      max(latest, l.Latest()),
		RetainedEvents: uint64(events),
		RetainedBytes:  bytes,
		SnapshotBytes:  uint64(l.snapshotBytes(ctx)),
		ActiveClients:  uint32(min(active, 1<<31)),
	}, nil
}

// Snapshot returns tenant's documents and the seq they are consistent with
// (every event up to and including Seq is reflected; resume with cursor
// Seq+1... or Seq, which replays that one event again). Entities are not
// included (GetDocument has them).
func (l *Log) Snapshot(ctx context.Context, tenant string) (*gatewayv1.Snapshot, error) {
	seq, recs, err := l.st.SnapshotDocuments(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("eventlog: snapshot: %w", err)
	}
	docs := make([]*gatewayv1.Document, len(recs))
	for i, r := range recs {
		docs[i] = r.Doc
	}
	return &gatewayv1.Snapshot{Seq: seq, Documents: docs}, nil
}

// StreamSnapshot calls fn with tenant's documents in pages of at most page
// documents and the seq they are all consistent with (one store read
// transaction; see Snapshot). fn is called at least once, with an empty
// page when tenant has none; its error ends the stream and is returned.
func (l *Log) StreamSnapshot(ctx context.Context, tenant string, page int, fn func(seq uint64, docs []*gatewayv1.Document) error) error {
	var docs []*gatewayv1.Document
	err := l.st.SnapshotPages(ctx, tenant, page, func(seq uint64, recs []*store.DocumentRecord) error {
		docs = docs[:0]
		for _, r := range recs {
			docs = append(docs, r.Doc)
		}
		return fn(seq, docs)
	})
	if err != nil {
		return fmt.Errorf("eventlog: snapshot: %w", err)
	}
	return nil
}

// rawSnapshotter is the optional fast read of StreamSnapshotRaw (the
// SQLite store has it): the documents as stored, not decoded.
type rawSnapshotter interface {
	SnapshotRaw(ctx context.Context, tenant string, after store.SnapshotKey, page int, fn func(seq uint64, docs []store.RawDocument) error) error
}

// StreamSnapshotRaw is StreamSnapshot with each document as its stored
// encoding (store.RawDocument), from after the key after on (zero: the
// start): the same pages, order and seq. A store without SnapshotRaw is
// read with SnapshotPages (from the start: the documents up to after are
// skipped) and its documents encoded here, so callers see one form
// whatever the backend.
func (l *Log) StreamSnapshotRaw(ctx context.Context, tenant string, after store.SnapshotKey, page int, fn func(seq uint64, docs []store.RawDocument) error) error {
	var err error
	if rs, ok := l.st.(rawSnapshotter); ok {
		err = rs.SnapshotRaw(ctx, tenant, after, page, fn)
	} else {
		var (
			raw  []store.RawDocument
			sent bool
			last uint64
		)
		err = l.st.SnapshotPages(ctx, tenant, page, func(seq uint64, recs []*store.DocumentRecord) error {
			raw, last = raw[:0], seq
			for _, r := range recs {
				d, err := store.EncodeRaw(r.Doc)
				if err != nil {
					return err
				}
				if after.ID == "" || d.CreateTime > after.CreateTime || d.CreateTime == after.CreateTime && d.ID > after.ID {
					raw = append(raw, d)
				}
			}
			if len(raw) == 0 {
				return nil // a page before the key
			}
			sent = true
			return fn(seq, raw)
		})
		if err == nil && !sent {
			err = fn(last, nil) // called at least once, as SnapshotRaw
		}
	}
	if err != nil {
		return fmt.Errorf("eventlog: snapshot: %w", err)
	}
	return nil
}

// Close stops the retention pass, removes the store hook and ends every
// subscription with ErrClosed. It does not close the store. Idempotent.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.st.SetEventHook(nil)
		l.tail.close() // subscribers wait on the tail's channel, not on done
		l.fan.close()  // parked subscribers go back to their goroutines
	})
	l.wg.Wait()
	return nil
}
