package retention

import "time"

// DefaultIndexBuckets bounds the index when Index.MaxBuckets is 0: 16,384
// buckets of 56 bytes, under 1 MiB whatever the number of retained events.
const DefaultIndexBuckets = 16384

// bucket summarizes a run of consecutive retained events: their first and
// last seq, how many there are, their (clamped monotonic) latest time and
// the cumulative count and byte size of every event appended through the
// bucket's last one. 56 bytes.
type bucket struct {
	first, last uint64
	tmax        int64  // unix nanoseconds of the bucket's newest event
	tmin        int64  // unix nanoseconds of its oldest event
	n           uint64 // events in the bucket
	cumN        uint64 // events appended through this bucket
	cum         uint64 // bytes appended through this bucket
}

// Index is the metadata of the retained log (seq, time, size), enough to
// answer every question the policy asks in O(log n): the Nth newest seq,
// the first seq at or after a time, the bytes retained from a seq on. Seqs
// must be appended in increasing order (gaps allowed).
//
// Its memory is bounded by MaxBuckets, not by the number of retained
// events: events are kept in buckets of consecutive seqs, one event per
// bucket while fewer than MaxBuckets events are retained (every answer
// exact), and when the buckets run out adjacent pairs merge (halving the
// count, doubling the width of later buckets). Answers are then rounded to
// bucket boundaries, always towards keeping more: a boundary inside a
// bucket becomes the bucket's first seq, so the policy never prunes part of
// a bucket and the store's boundary and the index's agree. Not safe for
// concurrent use; Retainer locks it.
type Index struct {
	// MaxBuckets bounds the index (0: DefaultIndexBuckets; at least 4).
	MaxBuckets int

	bs     []bucket // retained buckets are bs[head:]
	head   int
	width  uint64 // events per new bucket (>= 1)
	total  uint64 // bytes ever appended
	totalN uint64 // events ever appended
	base   uint64 // bytes before bs[head]
	baseN  uint64 // events before bs[head]
}

func (x *Index) maxBuckets() int {
	if x.MaxBuckets <= 0 {
		return DefaultIndexBuckets
	}
	return max(x.MaxBuckets, 4)
}

// Buckets is the number of buckets in use (for tests and metrics).
func (x *Index) Buckets() int { return len(x.bs) - x.head }

// Append records one event. seq must be greater than Latest(); a time
// earlier than the previous event's is clamped to it, so times are monotonic
// for binary search.
func (x *Index) Append(seq uint64, t time.Time, size int) {
	n := t.UnixNano()
	had := x.Len() > 0
	if had {
		last := &x.bs[len(x.bs)-1]
		if seq <= last.last {
			return // duplicate or out of order: ignore (caller bug), never corrupt
		}
		n = max(n, last.tmax)
	}
	size = max(size, 0)
	x.total += uint64(size)
	x.totalN++
	if x.width == 0 {
		x.width = 1
	}
	if had {
		if last := &x.bs[len(x.bs)-1]; last.n < x.width {
			last.last, last.tmax, last.n, last.cumN, last.cum = seq, n, last.n+1, x.totalN, x.total
			return
		}
	}
	if x.Buckets() >= x.maxBuckets() {
		x.merge()
	} else if x.width > 1 && x.Buckets() < x.maxBuckets()/4 {
		x.width /= 2 // pruning freed most buckets: finer again for new events
	}
	x.bs = append(x.bs, bucket{first: seq, last: seq, tmin: n, tmax: n, n: 1, cumN: x.totalN, cum: x.total})
}

// AppendRange records count events with seqs first..last (ascending after
// Latest(), gaps allowed), times oldest..newest and bytes in total, as one
// bucket: how a large log is loaded at start (store.EachEventRange) without
// a row per event. Later buckets are at least count events wide, so the
// bucket bound holds.
func (x *Index) AppendRange(first, last, count uint64, oldest, newest time.Time, bytes uint64) {
	if count == 0 || last < first {
		return
	}
	if count == 1 {
		x.Append(first, newest, int(min(bytes, 1<<62)))
		return
	}
	tmin, tmax := oldest.UnixNano(), newest.UnixNano()
	if x.Len() > 0 {
		prev := x.bs[len(x.bs)-1]
		if first <= prev.last {
			return
		}
		tmin, tmax = max(tmin, prev.tmax), max(tmax, prev.tmax)
	}
	if x.Buckets() >= x.maxBuckets() {
		x.merge()
	}
	x.total += bytes
	x.totalN += count
	x.width = max(x.width, count)
	x.bs = append(x.bs, bucket{first: first, last: last, tmin: tmin, tmax: max(tmin, tmax), n: count, cumN: x.totalN, cum: x.total})
}

// merge halves the number of buckets by merging adjacent pairs (in place)
// and doubles the width of new buckets.
func (x *Index) merge() {
	live := x.bs[x.head:]
	j := 0
	for i := 0; i < len(live); i += 2 {
		b := live[i]
		if i+1 < len(live) {
			c := live[i+1]
			b.last, b.tmax, b.n, b.cumN, b.cum = c.last, c.tmax, b.n+c.n, c.cumN, c.cum
		}
		live[j] = b
		j++
	}
	clear(live[j:])
	x.bs = append(x.bs[:0], live[:j]...)
	x.head = 0
	x.width *= 2
}

// Len is the number of retained events.
func (x *Index) Len() int { return int(x.totalN - x.baseN) }

// Oldest is the oldest retained seq (0 when empty).
func (x *Index) Oldest() uint64 {
	if x.Len() == 0 {
		return 0
	}
	return x.bs[x.head].first
}

// Latest is the newest retained seq (0 when empty).
func (x *Index) Latest() uint64 {
	if x.Len() == 0 {
		return 0
	}
	return x.bs[len(x.bs)-1].last
}

// Bytes is the size of all retained events.
func (x *Index) Bytes() uint64 { return x.total - x.base }

// search returns the index (absolute, in bs) of the first retained bucket
// whose last seq is >= s (the bucket holding s, or the next one);
// len(bs) when none.
func (x *Index) search(s uint64) int {
	lo, hi := x.head, len(x.bs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.bs[m].last < s {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// before returns the cumulative bytes and events before absolute index i.
func (x *Index) before(i int) (bytes, events uint64) {
	if i <= x.head {
		return x.base, x.baseN
	}
	return x.bs[i-1].cum, x.bs[i-1].cumN
}

// Floor is the seq the index can keep from when asked to keep from s: the
// first seq of the bucket holding s (s itself while buckets hold one event
// each), Latest()+1 above the newest.
func (x *Index) Floor(s uint64) uint64 {
	i := x.search(s)
	if i == len(x.bs) {
		return x.next()
	}
	return min(s, x.bs[i].first)
}

// BytesFrom is the size of the retained events kept when keeping from s
// (the whole bucket holding s).
func (x *Index) BytesFrom(s uint64) uint64 {
	b, _ := x.before(x.search(s))
	return x.total - b
}

// CountFrom is the number of retained events kept when keeping from s.
func (x *Index) CountFrom(s uint64) int {
	_, n := x.before(x.search(s))
	return int(x.totalN - n)
}

// next is the seq after the newest (Latest()+1), the "keep nothing" bound.
func (x *Index) next() uint64 { return x.Latest() + 1 }

// SeqKeepingBytes is the smallest bucket start s such that BytesFrom(s) <=
// max; Latest()+1 when even the newest bucket alone is larger.
func (x *Index) SeqKeepingBytes(max uint64) uint64 {
	if x.Bytes() <= max {
		return x.Oldest()
	}
	lo, hi := x.head, len(x.bs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if b, _ := x.before(m); x.total-b <= max {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == len(x.bs) {
		return x.next()
	}
	return x.bs[lo].first
}

// NthNewest is the start of the bucket holding the nth newest retained
// event (n >= 1); Oldest() when fewer are retained, Latest()+1 when n <= 0.
func (x *Index) NthNewest(n int) uint64 {
	if n <= 0 {
		return x.next()
	}
	if n >= x.Len() {
		return x.Oldest()
	}
	// Last absolute index i with totalN - before(i) >= n.
	lo, hi := x.head, len(x.bs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if _, c := x.before(m); x.totalN-c >= uint64(n) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return x.bs[lo-1].first
}

// FirstAtOrAfter is the start of the first retained bucket whose newest
// event's time is >= t (so every event at or after t is kept); Latest()+1
// when none.
func (x *Index) FirstAtOrAfter(t time.Time) uint64 {
	n := t.UnixNano()
	lo, hi := x.head, len(x.bs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.bs[m].tmax < n {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(x.bs) {
		return x.next()
	}
	return x.bs[lo].first
}

// TimeOf is the time of the retained event with the greatest seq <= s, to
// the index's granularity: the newest time of its bucket (false when s is
// below the oldest retained seq).
func (x *Index) TimeOf(s uint64) (time.Time, bool) {
	i := x.search(s)
	if i < len(x.bs) && x.bs[i].first <= s {
		return time.Unix(0, x.bs[i].tmax), true
	}
	if i == x.head {
		return time.Time{}, false
	}
	return time.Unix(0, x.bs[i-1].tmax), true
}

// OldestTime is the time of the oldest retained event (zero when empty).
func (x *Index) OldestTime() time.Time {
	if x.Len() == 0 {
		return time.Time{}
	}
	return time.Unix(0, x.bs[x.head].tmin)
}

// PruneBefore drops every bucket that ends below s (a bucket holding s is
// kept whole: callers prune at Floor boundaries) and returns how many
// events and bytes were dropped and the first and last dropped seq.
func (x *Index) PruneBefore(s uint64) (n int, bytes uint64, first, last uint64) {
	i := x.search(s)
	if i == x.head {
		return 0, 0, 0, 0
	}
	first, last = x.bs[x.head].first, x.bs[i-1].last
	newBase, newBaseN := x.bs[i-1].cum, x.bs[i-1].cumN
	bytes, n = newBase-x.base, int(newBaseN-x.baseN)
	x.base, x.baseN = newBase, newBaseN
	clear(x.bs[x.head:i])
	x.head = i
	// Compact when the dead prefix dominates, so memory follows retention.
	if x.head > 1024 && x.head > len(x.bs)/2 {
		x.bs = append(x.bs[:0:0], x.bs[x.head:]...)
		x.head = 0
	}
	return n, bytes, first, last
}
