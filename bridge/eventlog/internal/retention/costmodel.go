package retention

import (
	"math"
	"slices"
	"time"
)

// The cost model (docs/retention.md, "Cost model"): a disconnected client's
// position holds the log back only while the bytes of its delta are less
// than the snapshot bytes its return is expected to save:
//
//	BytesFrom(pos) <= P(return while the delta is still smaller than the
//	                    snapshot | away for a so far) x snapshot bytes
//
// P is estimated from observed reconnects: the client's own last long
// absences, and the absences of every client (the pool) as a prior.

// ownAbsences is how many long absences a client remembers.
const ownAbsences = 8

// poolSamples is how many long absences (and expiries) the pool remembers.
const poolSamples = 4096

// priorWeight is the weight, in absences, of the pool against a client's
// own history.
const priorWeight = 2.0

// neverReturned marks a client that expired without coming back.
const neverReturned = math.MaxUint32

// absences is a ring of a client's last long absences in seconds.
type absences struct {
	s [ownAbsences]uint32
	n uint32 // absences recorded (the ring holds min(n, ownAbsences))
}

func (a *absences) add(sec uint32) {
	a.s[a.n%ownAbsences] = sec
	a.n++
}

func (a *absences) samples() []uint32 { return a.s[:min(a.n, ownAbsences)] }

// pool is a ring of the last long absences of every client, and a sorted
// copy refreshed once per retention pass.
type pool struct {
	s      []uint32
	next   int
	sorted []uint32
	dirty  bool
	// open are the current absences of the tracked disconnected clients
	// (sorted, refreshed each pass): censored samples, at risk but not
	// returned yet (Kaplan-Meier's risk set), so that clients still away
	// count against a return that the completed absences alone would
	// promise (early on, only the short absences have completed).
	open []uint32
}

func (p *pool) add(sec uint32) {
	if len(p.s) < poolSamples {
		p.s = append(p.s, sec)
	} else {
		p.s[p.next] = sec
		p.next = (p.next + 1) % poolSamples
	}
	p.dirty = true
}

// prepare sorts the samples for returnProb (once per pass).
func (p *pool) prepare() {
	if !p.dirty {
		return
	}
	p.sorted = append(p.sorted[:0], p.s...)
	slices.Sort(p.sorted)
	p.dirty = false
}

// returnProb is P(back within (a, a+h] | away > a) over the pool; ok is
// false when no pooled absence was that long (no evidence).
func (p *pool) returnProb(a, ah uint32) (float64, bool) {
	gt := len(p.sorted) - upper(p.sorted, a) + len(p.open) - upper(p.open, a)
	if gt == 0 {
		return 0, false
	}
	in := upper(p.sorted, ah) - upper(p.sorted, a)
	return float64(in) / float64(gt), true
}

// upper is the number of samples <= v.
func upper(s []uint32, v uint32) int {
	i, _ := slices.BinarySearchFunc(s, v, func(x, v uint32) int {
		if x <= v {
			return -1
		}
		return 1
	})
	return i
}

func seconds(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(d/time.Second, neverReturned-1))
}

// recordAbsenceLocked records c's absence ending at now (called when a
// disconnected client comes back). Caller holds t.mu.
func (t *Tracker) recordAbsenceLocked(c *Client, now time.Time) {
	if c.conns.Load() > 0 {
		return
	}
	away := now.Sub(time.Unix(0, c.last.Load()))
	long := t.cfg.LongAbsence
	if long <= 0 {
		long = time.Minute
	}
	if away < long {
		return
	}
	c.away.add(seconds(away))
	t.pool.add(seconds(away))
}

// returnProb estimates P(v comes back within h | away a so far): its own
// absences longer than a (the share of them that ended within a+h); when it
// was never away that long, the exponential tail of its own long absences
// (memoryless beyond what was seen); weighted against the pool's estimate
// (priorWeight absences). With no evidence at all it returns 1: keep.
// Caller holds t.mu (inside Each).
func (v ClientView) returnProb(p *pool, a, h time.Duration, long time.Duration) float64 {
	as, ahs := seconds(a), seconds(a+h)
	pp, ok := p.returnProb(as, ahs)
	if !ok {
		pp = 1
	}
	own := v.c.away.samples()
	if len(own) == 0 {
		return pp
	}
	gt, in, sum := 0, 0, 0.0
	for _, x := range own {
		sum += float64(x)
		if x > as {
			gt++
			if x <= ahs {
				in++
			}
		}
	}
	var po, w float64
	if gt > 0 {
		po, w = float64(in)/float64(gt), float64(gt)
	} else {
		mu := max(sum/float64(len(own))-long.Seconds(), 60)
		po, w = 1-math.Exp(-h.Seconds()/mu), float64(len(own))
	}
	return (w*po + priorWeight*pp) / (w + priorWeight)
}

// costInputs are the per-pass quantities of the cost model.
type costInputs struct {
	now      time.Time
	snapshot uint64
	rate     float64 // bytes appended per second, recently
	long     time.Duration
	pool     *pool // prepared; read under the tracker lock
}

// keepFor reports whether v's position is worth its delta: connected
// clients and clients away less than the floor always are.
func (r *Retainer) keepFor(v ClientView, in costInputs) bool {
	a := in.now.Sub(v.Last)
	if v.Connected || a < in.long {
		return true
	}
	d := r.idx.BytesFrom(v.Pos)
	if d >= in.snapshot {
		return false // the snapshot is cheaper whenever it comes back
	}
	// h: how long until the delta outgrows the snapshot at the recent rate.
	const forever = 100 * 365 * 24 * time.Hour
	h := forever
	if in.rate > 0 {
		h = time.Duration(min(float64(in.snapshot-d)/in.rate, forever.Seconds()) * float64(time.Second))
	}
	p := v.returnProb(in.pool, a, h, in.long)
	return float64(d) <= p*float64(in.snapshot)
}

// rateLocked is the recent append rate in bytes per second: the bytes of
// the last day (or of the whole retained window when shorter) over its
// length. Caller holds r.mu.
func (r *Retainer) rateLocked(now time.Time) float64 {
	if r.idx.Len() == 0 {
		return 0
	}
	span := min(now.Sub(r.idx.OldestTime()), 24*time.Hour)
	if span < time.Minute {
		span = time.Minute
	}
	return float64(r.idx.BytesFrom(r.idx.FirstAtOrAfter(now.Add(-span)))) / span.Seconds()
}
