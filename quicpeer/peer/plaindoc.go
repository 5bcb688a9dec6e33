package peer

import (
	"strconv"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Plain dehydration N:1 (docs/profile.md, plain use). A draft-02 client
// sends STATUS(R, DEHYDRATING) and then plain children: parent-id R,
// chunk-info {total-chunks, chunk-index, chunk-offset}, raw payloads, no
// profile marker, no root entity stream. total-chunks may be 0 (unknown)
// on all children but one; the non-zero value is N, and children that
// disagree on it, or name a chunk-index at or above it, fail R. The
// document reuses the profile's machinery (doc, manifest, spool, result
// hash); what differs is kept here: R becomes known when it was announced
// and a plain child arrived (a synthetic root header stands for the
// profile's summary root), R's completion policy is the first one a child
// carries (STRICT defaults without) while each child's retries, timeout
// and actions come from its own header (the session's retry budget knows
// no other), the merge processor is the one the children name
// (concatenation when they differ), and the result is one stream in the
// generic form (plainResultHeader), never result parts.
//
// Children of a parent that was not announced (yet) are processed at once
// like every child: they report their terminal statuses and never wait.
// Their outputs are held as an orphan document, bounded per session by
// Options.OrphanDocs and OrphanChildren (0x08 with FAILED beyond them) and
// by max-entities-per-scope, until the announcement comes, the client ends
// R (FAILED, ABANDONED), its cursor passes R, or the session ends.

// plainDoc is what a plain document keeps beyond the profile's doc,
// guarded by engine.mu.
type plainDoc struct {
	on     bool                   // a plain child arrived: the document is plain
	policy *wire.CompletionPolicy // the first completion-policy a child carried
	proc   string                 // the processor the children name
	mixed  bool                   // children name different processors
	broken string                 // why R must fail (set once)
}

// plainTotalLocked takes N from a plain child's chunk-info: the first
// non-zero total-chunks sets it, a different one later breaks R, and so
// does an N below a chunk-index already seen or one above
// max-entities-per-scope. It returns why the child itself is refused ("" to
// admit it). Caller holds g.mu.
func (g *engine) plainTotalLocked(d *doc, ci *wire.ChunkInfo) string {
	if !d.plain.on {
		d.plain.on = true
	}
	n := ci.TotalChunks
	if n == 0 {
		return ""
	}
	switch {
	case d.total >= 0 && uint64(d.total) != n:
		return g.breakPlainLocked(d, "children disagree on total-chunks: "+strconv.FormatInt(d.total, 10)+" and "+strconv.FormatUint(n, 10))
	case ci.ChunkIndex >= n:
		return g.breakPlainLocked(d, "chunk-index "+strconv.FormatUint(ci.ChunkIndex, 10)+" >= total-chunks "+strconv.FormatUint(n, 10))
	case n > g.neg.maxPerScope || n >= uint64(wire.IDModulus):
		return g.breakPlainLocked(d, "total-chunks "+strconv.FormatUint(n, 10)+" exceeds max-entities-per-scope")
	case d.total >= 0:
		return ""
	}
	d.total = int64(n)
	for idx := range d.children {
		if idx >= n {
			g.breakPlainLocked(d, "a child's chunk-index is >= total-chunks "+strconv.FormatUint(n, 10))
		}
	}
	return ""
}

// breakPlainLocked records why R must fail (the first reason wins) and
// returns it. Caller holds g.mu.
func (g *engine) breakPlainLocked(d *doc, why string) string {
	if d.plain.broken == "" {
		d.plain.broken = why
	}
	return why
}

// plainChildLocked records what a newly admitted plain child e tells about
// its document: the merge processor and the completion policy. Caller
// holds g.mu.
func (g *engine) plainChildLocked(d *doc, e *entity) {
	switch {
	case d.plain.proc == "":
		d.plain.proc = e.procName
	case d.plain.proc != e.procName:
		d.plain.mixed = true
	}
	if p := e.header.CompletionPolicy; p != nil && d.plain.policy == nil {
		d.plain.policy = p
		d.man.Policy = p // R's completion mode; each child runs by its own
	}
	g.plainAnnouncedLocked(d)
}

// plainAnnouncedLocked makes R known once it was announced DEHYDRATING and
// a plain child arrived: a synthetic root header (no envelope, no summary)
// stands for the profile's root entity. Caller holds g.mu.
func (g *engine) plainAnnouncedLocked(d *doc) {
	if !d.plain.on || !d.dehydrating || d.root != nil {
		return
	}
	d.root = &wire.EntityHeader{EntityID: d.id, CompletionPolicy: d.plain.policy}
	d.man.Policy = d.plain.policy
	d.rootEnt = &entity{id: d.id, header: d.root, chunk: -1, ctx: d.ctx, cancel: d.cancel, plain: true}
	g.unorphan(d)
	close(d.rootKnown)
}

// failBrokenLocked ends a broken plain document once R was announced: it
// leaves the readiness tracker (no rehydration) and is returned for
// failPlainRoot. Its children still running finish and report their own
// statuses; it stays in g.docs (later children are refused with FAILED)
// until the last of them is terminal (releaseBroken). Caller holds g.mu.
func (g *engine) failBrokenLocked(d *doc) *doc {
	g.plainAnnouncedLocked(d)
	if d.plain.broken == "" || d.root == nil || d.finishing || d.cancelled {
		return nil
	}
	d.finishing = true
	g.ready.Remove(docKey(d))
	return d
}

// failPlainRoot reports R FAILED for a document failBrokenLocked ended.
func (g *engine) failPlainRoot(d *doc) {
	g.mu.Lock()
	why, re := d.plain.broken, d.rootEnt
	g.mu.Unlock()
	g.log.Warn("entity finished", "entity", d.id, "kind", "plain parent", "status", wire.StatusFailed, "reason", why)
	g.send(re, wire.StatusFailed, nil)
	g.releaseBroken(d)
}

// releaseBroken forgets a failed plain document once none of its children
// is running any more (its spool goes with it).
func (g *engine) releaseBroken(d *doc) {
	g.mu.Lock()
	done := d.plain.broken != "" && d.finishing && d.man.Unresolved() == 0
	if done && g.docs[d.id] == d {
		delete(g.docs, d.id)
	}
	g.mu.Unlock()
	if done {
		d.cancel(nil)
	}
}

// dropOrphansBehind forgets orphan documents (children whose parent was
// never announced) whose root the client's cursor passed: the client
// resolved R, so no announcement can come. Only documents whose children
// all reported their terminal statuses are dropped (the others are looked
// at again on the next cursor update).
func (g *engine) dropOrphansBehind(cursor uint32) {
	g.mu.Lock()
	var gone []*doc
	if g.orphanDocs > 0 {
		for id, d := range g.docs {
			if d.orphan && d.man.Unresolved() == 0 && id != cursor && wire.IsBefore(id, cursor) {
				g.unorphan(d)
				delete(g.docs, id)
				g.ready.Remove(docKey(d))
				gone = append(gone, d)
			}
		}
	}
	g.mu.Unlock()
	for _, d := range gone {
		g.log.Info("orphan children dropped: the client's cursor passed their parent", "entity", d.id)
		d.cancel(nil)
	}
}

// mergeProcessor is the processor that merges d's children: the root's
// (profile 4.4) or, for a plain document, the one its children name
// (passthrough's concatenation when they differ). Caller holds g.mu.
func (g *engine) mergeProcessorLocked(d *doc) (string, Processor) {
	md := d.root.Metadata
	if d.plain.on {
		md = map[string]string{MetaProcessor: d.plain.proc}
		if d.plain.mixed {
			md = nil
		}
	}
	name, proc, err := g.procs.lookup(md)
	if err != nil { // checked on arrival (the root's, every child's)
		return "passthrough", Passthrough{}
	}
	return name, proc
}
