package retention

import "time"

// entry is the metadata of one retained event: its seq, its (clamped
// monotonic) time and the cumulative byte count of every event appended up
// to and including it. 24 bytes per retained event.
type entry struct {
	seq uint64
	t   int64  // unix nanoseconds, never less than the previous entry's
	cum uint64 // total bytes appended through this event
}

// Index is the per-event metadata of the retained log (seq, time, size),
// enough to answer every question the policy asks in O(log n): the Nth
// newest seq, the first seq at or after a time, the bytes retained from a
// seq on. Seqs must be appended in increasing order (gaps allowed). It costs
// 24 bytes per retained event. Not safe for concurrent use; Retainer locks it.
type Index struct {
	ents  []entry // retained entries are ents[head:]
	head  int
	total uint64 // cumulative bytes ever appended
	base  uint64 // cumulative bytes before ents[head]
}

// Append records one event. seq must be greater than Latest(); a time
// earlier than the previous entry's is clamped to it, so times are monotonic
// for binary search.
func (x *Index) Append(seq uint64, t time.Time, size int) {
	n := t.UnixNano()
	if len(x.ents) > x.head {
		last := x.ents[len(x.ents)-1]
		if seq <= last.seq {
			return // duplicate or out of order: ignore (caller bug), never corrupt
		}
		if n < last.t {
			n = last.t
		}
	}
	if size < 0 {
		size = 0
	}
	x.total += uint64(size)
	x.ents = append(x.ents, entry{seq: seq, t: n, cum: x.total})
}

// Len is the number of retained events.
func (x *Index) Len() int { return len(x.ents) - x.head }

// Oldest is the oldest retained seq (0 when empty).
func (x *Index) Oldest() uint64 {
	if x.Len() == 0 {
		return 0
	}
	return x.ents[x.head].seq
}

// Latest is the newest retained seq (0 when empty).
func (x *Index) Latest() uint64 {
	if x.Len() == 0 {
		return 0
	}
	return x.ents[len(x.ents)-1].seq
}

// Bytes is the size of all retained events.
func (x *Index) Bytes() uint64 { return x.total - x.base }

// search returns the index (absolute, in ents) of the first retained entry
// with seq >= s; len(ents) when none.
func (x *Index) search(s uint64) int {
	lo, hi := x.head, len(x.ents)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.ents[m].seq < s {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// cumBefore is the cumulative byte count before absolute index i.
func (x *Index) cumBefore(i int) uint64 {
	if i <= x.head {
		return x.base
	}
	return x.ents[i-1].cum
}

// BytesFrom is the size of the retained events with seq >= s.
func (x *Index) BytesFrom(s uint64) uint64 {
	return x.total - x.cumBefore(x.search(s))
}

// CountFrom is the number of retained events with seq >= s.
func (x *Index) CountFrom(s uint64) int { return len(x.ents) - x.search(s) }

// next is the seq after the newest (Latest()+1), the "keep nothing" bound.
func (x *Index) next() uint64 { return x.Latest() + 1 }

// SeqKeepingBytes is the smallest retained seq s such that
// BytesFrom(s) <= max; Latest()+1 when even the newest event alone is larger.
func (x *Index) SeqKeepingBytes(max uint64) uint64 {
	if x.Bytes() <= max {
		return x.Oldest()
	}
	// Find the first absolute index i with total - cumBefore(i) <= max.
	lo, hi := x.head, len(x.ents)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.total-x.cumBefore(m) <= max {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == len(x.ents) {
		return x.next()
	}
	return x.ents[lo].seq
}

// NthNewest is the seq of the nth newest retained event (n >= 1); Oldest()
// when fewer are retained, Latest()+1 when n <= 0.
func (x *Index) NthNewest(n int) uint64 {
	if n <= 0 {
		return x.next()
	}
	if n >= x.Len() {
		return x.Oldest()
	}
	return x.ents[len(x.ents)-n].seq
}

// FirstAtOrAfter is the first retained seq whose time is >= t; Latest()+1
// when none.
func (x *Index) FirstAtOrAfter(t time.Time) uint64 {
	n := t.UnixNano()
	lo, hi := x.head, len(x.ents)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.ents[m].t < n {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(x.ents) {
		return x.next()
	}
	return x.ents[lo].seq
}

// TimeOf is the time of the retained event with the greatest seq <= s
// (false when s is below the oldest retained seq).
func (x *Index) TimeOf(s uint64) (time.Time, bool) {
	i := x.search(s)
	if i < len(x.ents) && x.ents[i].seq == s {
		return time.Unix(0, x.ents[i].t), true
	}
	if i == x.head {
		return time.Time{}, false
	}
	return time.Unix(0, x.ents[i-1].t), true
}

// PruneBefore drops every event with seq < s and returns how many events and
// bytes were dropped and the first and last dropped seq.
func (x *Index) PruneBefore(s uint64) (n int, bytes uint64, first, last uint64) {
	i := x.search(s)
	if i == x.head {
		return 0, 0, 0, 0
	}
	n = i - x.head
	first, last = x.ents[x.head].seq, x.ents[i-1].seq
	newBase := x.ents[i-1].cum
	bytes = newBase - x.base
	x.base = newBase
	x.head = i
	// Compact when the dead prefix dominates, so memory follows retention.
	if x.head > 1024 && x.head > len(x.ents)/2 {
		x.ents = append(x.ents[:0:0], x.ents[x.head:]...)
		x.head = 0
	}
	return n, bytes, first, last
}
