package eventlog

import (
	"sync"
	"sync/atomic"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// item is one published event in the shared tail. Immutable once published;
// every subscriber reads the same *item and the same *Event.
type item struct {
	seq    uint64
	tenant string
	kind   string
	doc    string
	size   int
	t      time.Time
	ev     *gatewayv1.Event
	// gapTo > 0 marks a gap item: the seqs seq..gapTo were committed but
	// never reached this log (another replica pruned them before this
	// one's store delivered them, gap.go). ev is nil; every subscriber is
	// told (#info OutdatedCursor) whatever its filter.
	gapTo uint64
}

// last is the highest seq the item stands for.
func (it *item) last() uint64 {
	if it.gapTo > 0 {
		return it.gapTo
	}
	return it.seq
}

// tail is the shared in-memory ring of the most recent events, bounded by
// count and bytes. Items live at ring positions [start, end); position p is
// in buf[p&mask]. Seqs increase with position but may have gaps, so
// subscribers look up positions by binary search (or a hint).
//
// A caught-up subscriber's check (waitFor) takes no lock: latest and wake
// are atomics, and publish stores latest before it swaps and closes wake,
// so a subscriber that read the old channel and then an old latest is
// woken by that close (issue 25: at 1,000 subscribers, the read lock's
// shared counter was one more contended cache line per wake).
type tail struct {
	mu       sync.RWMutex
	buf      []*item
	mask     uint64
	start    uint64 // oldest position held
	end      uint64 // next position to write
	bytes    int64
	maxBytes int64
	latest   atomic.Uint64                 // newest published seq (0 before the first); written under mu
	wake     atomic.Pointer[chan struct{}] // closed and replaced on every publish; written under mu
	closed   bool                          // close was called: wake stays closed
}

func newTail(events int, maxBytes int64) *tail {
	n := 1
	for n < events {
		n <<= 1
	}
	t := &tail{buf: make([]*item, n), mask: uint64(n - 1), maxBytes: maxBytes}
	w := make(chan struct{})
	t.wake.Store(&w)
	return t
}

// publish appends items (ascending seq, all above latest) and wakes every
// waiting subscriber. Oldest items are evicted beyond the bounds; the newest
// item always stays.
func (t *tail) publish(items []*item) {
	if len(items) == 0 {
		return
	}
	t.mu.Lock()
	for _, it := range items {
		if t.end-t.start == uint64(len(t.buf)) {
			t.evictLocked()
		}
		t.buf[t.end&t.mask] = it
		t.end++
		t.bytes += int64(it.size)
		t.latest.Store(it.last())
	}
	for t.bytes > t.maxBytes && t.end-t.start > 1 {
		t.evictLocked()
	}
	t.wakeLocked()
	t.mu.Unlock()
}

// setLatest records the newest seq loaded from the store (before any
// publish).
func (t *tail) setLatest(seq uint64) {
	t.mu.Lock()
	t.latest.Store(seq)
	t.mu.Unlock()
}

// wakeLocked wakes every subscriber waiting on the current channel: a new
// one goes in first (latest is already stored), then the old one closes.
func (t *tail) wakeLocked() {
	if t.closed {
		return // wake stays closed: every waiter returns at once
	}
	w := make(chan struct{})
	close(*t.wake.Swap(&w))
}

// close wakes every subscriber for good: waitFor then reports closed.
func (t *tail) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	close(*t.wake.Load())
}

// waitFor reports whether an item at or after next is published; if not,
// it returns the channel that the next publish (or close) closes. No lock
// (see tail).
func (t *tail) waitFor(next uint64) (ready bool, wake <-chan struct{}) {
	w := t.wake.Load()
	if next <= t.latest.Load() {
		return true, nil
	}
	return false, *w
}

func (t *tail) evictLocked() {
	i := t.start & t.mask
	t.bytes -= int64(t.buf[i].size)
	t.buf[i] = nil
	t.start++
}

// readResult says what a subscriber found.
type readResult int

const (
	readItems    readResult = iota // n items copied
	readCaughtUp                   // nothing at or after next yet; wait on the channel
	readBehind                     // next is older than the tail holds
)

// read copies up to len(dst) items with seq >= next into dst. hint is the
// position the caller expects next at (from its previous read); the returned
// position is the hint for the following read. When caught up it returns
// the channel that the next publish closes (read under the same lock, so no
// wake-up is lost).
func (t *tail) read(next, hint uint64, dst []*item) (n int, pos uint64, res readResult, wake <-chan struct{}) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if next > t.latest.Load() {
		return 0, t.end, readCaughtUp, *t.wake.Load()
	}
	if t.start == t.end || next < t.buf[t.start&t.mask].seq {
		return 0, 0, readBehind, nil
	}
	// Positions are found by each item's last seq: a gap item that covers
	// next is the one to read (it announces the gap), not the event after it.
	p := hint
	if p < t.start || p >= t.end || t.buf[p&t.mask].last() < next ||
		(p > t.start && t.buf[(p-1)&t.mask].last() >= next) {
		lo, hi := t.start, t.end
		for lo < hi {
			m := lo + (hi-lo)/2
			if t.buf[m&t.mask].last() < next {
				lo = m + 1
			} else {
				hi = m
			}
		}
		p = lo
	}
	for p < t.end && n < len(dst) {
		dst[n] = t.buf[p&t.mask]
		n++
		p++
	}
	return n, p, readItems, nil
}

// latestSeq is the newest published (or loaded) seq.
func (t *tail) latestSeq() uint64 { return t.latest.Load() }
