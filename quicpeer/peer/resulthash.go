package peer

import (
	"fmt"
	"hash"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Result hash of a dehydrated document (docs/profile.md 4.3). The result
// header carries payload-length and SHA-256 before the payload, so the
// peer hashes the children's outputs as they finish, in chunk-index order
// with a frontier (as noteInput does for inputs): when the last child is
// terminal both are known and rehydration reads the spool once, to stream
// it. A child output at the frontier is hashed from memory when it is
// spooled; one that finishes ahead of the frontier is hashed from its
// spool region when the frontier reaches it. The frontier follows the
// manifest: a chunk counts once it is resolved (a resolution is final, so
// a re-processed chunk cannot change what was hashed), and only COMPLETE
// chunks are parts of the result, exactly as rehydrate selects them.
//
// While every chunk so far is COMPLETE with an output that is its input as
// noted for the content hash (passthrough), the output hash is not fed at
// all: the content hash stands for it. The first chunk that breaks the
// streak (another output, a failed or skipped chunk) makes the frontier
// hash the outputs before it from the spool once and go on as usual.

// outFrontier is the running hash over the outputs of a document's
// children in chunk order, guarded by doc.omu.
type outFrontier struct {
	hash   hash.Hash
	len    int64  // octets of the parts accounted for
	next   uint64 // lowest chunk index not accounted for
	parts  int    // COMPLETE chunks accounted for
	lazy   bool   // all chunks below next are COMPLETE and same: hash not fed
	broken error  // a spool read failed: rehydration hashes the spool itself
}

// advanceOut moves d's output frontier over every resolved chunk, or
// leaves that to the goroutine already moving it: a child that settles
// while another holds the frontier (sending a result part, resultstream.go)
// does not wait there holding its payload; it flags the work (outKick) and
// returns, and the holder runs again before it lets go. mine and data are
// the spooled output of a child that was just resolved and its bytes (nil
// when none): taken from memory when the frontier reaches it here, else
// read back from the spool. data is not retained.
func (g *engine) advanceOut(d *doc, mine *spooled, data []byte) {
	d.outKick.Store(true)
	for d.outKick.Load() {
		if !d.omu.TryLock() {
			return // the holder sees outKick after its pass
		}
		d.outKick.Store(false)
		g.advanceOutLocked(d, mine, data)
		mine, data = nil, nil
		d.omu.Unlock()
	}
}

// advanceOutSync is advanceOut that returns only once the frontier has
// passed every chunk resolved before the call (rehydration needs it).
func (g *engine) advanceOutSync(d *doc) {
	d.omu.Lock()
	defer d.omu.Unlock()
	g.advanceOutLocked(d, nil, nil)
}

// advanceOutLocked is one pass of advanceOut. Caller holds d.omu.
func (g *engine) advanceOutLocked(d *doc, mine *spooled, data []byte) {
	o := &d.out
	var buf []byte
	for o.broken == nil {
		g.mu.Lock()
		cs := d.children[o.next]
		resolved := cs != nil && d.man.Resolved(cs.mid)
		var sp *spooled
		var e *entity
		if resolved {
			e = cs.e
			if st, _ := d.man.Status(cs.mid); st == wire.StatusComplete {
				sp = cs.out
				if sp == nil {
					o.broken = fmt.Errorf("chunk %d is COMPLETE without a spooled output", o.next)
				}
			}
		}
		g.mu.Unlock()
		if !resolved || o.broken != nil {
			return
		}
		if o.lazy && (sp == nil || !sp.same) {
			if err := g.feedSpooled(d, o.next); err != nil {
				o.broken = err
				return
			}
			o.lazy = false
		}
		if sp != nil {
			switch {
			case o.lazy:
			case sp == mine:
				o.hash.Write(data)
			default:
				if buf == nil {
					buf = make([]byte, spoolBufferBytes)
				}
				if _, err := d.copySpooled(o.hash, sp, buf); err != nil {
					o.broken = fmt.Errorf("spooled output of chunk %d: %w", o.next, err)
					return
				}
			}
			o.len += sp.size
			o.parts++
			if sp == mine {
				g.streamPart(d, e, sp, data)
			} else {
				g.streamPart(d, e, sp, nil)
			}
		}
		o.next++
	}
}

// feedSpooled feeds the output hash with the spooled outputs of the
// COMPLETE chunks below end (the lazy streak ends there). Caller holds
// d.omu.
func (g *engine) feedSpooled(d *doc, end uint64) error {
	var parts []*spooled
	g.mu.Lock()
	for i := range end {
		if cs := d.children[i]; cs != nil && cs.out != nil {
			if st, _ := d.man.Status(cs.mid); st == wire.StatusComplete {
				parts = append(parts, cs.out)
			}
		}
	}
	g.mu.Unlock()
	buf := make([]byte, spoolBufferBytes)
	for i, sp := range parts {
		if _, err := d.copySpooled(d.out.hash, sp, buf); err != nil {
			return fmt.Errorf("spooled output of part %d: %w", i, err)
		}
	}
	return nil
}

// resultSum returns the length and SHA-256 of the concatenation of parts
// (d's COMPLETE children in chunk order) from the output frontier; ok is
// false when the frontier cannot tell (a spool read failed, or the
// frontier disagrees with parts) and the caller must hash the spool.
func (g *engine) resultSum(d *doc, parts []part) (n int64, sum []byte, ok bool) {
	g.advanceOutSync(d) // the tail of children that finished out of order
	d.omu.Lock()
	defer d.omu.Unlock()
	o := &d.out
	var want int64
	for _, p := range parts {
		want += p.sp.size
	}
	if o.broken != nil || o.next != uint64(d.total) || o.parts != len(parts) || o.len != want {
		g.log.Debug("result hash not kept; hashing the spool", "entity", d.id, "next", o.next, "parts", o.parts, "want_parts", len(parts), "err", o.broken)
		return 0, nil, false
	}
	if o.lazy {
		d.hmu.Lock()
		intact := d.inBroken == nil && d.inNext == uint64(d.total) && d.inLen == uint64(o.len)
		if intact {
			sum = d.inHash.Sum(nil)
		}
		d.hmu.Unlock()
		if intact {
			return o.len, sum, true
		}
		if err := g.feedSpooled(d, o.next); err != nil {
			o.broken = err
			return 0, nil, false
		}
		o.lazy = false
	}
	return o.len, o.hash.Sum(nil), true
}
