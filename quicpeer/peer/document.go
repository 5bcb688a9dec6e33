package peer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/pipestream/gateway/quicpeer/assembly"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// doc is a document the gateway dehydrated (docs/profile.md 4.2): root R in
// scope 0 and its children C_i (parent-id R). Children may arrive before
// the root envelope and before STATUS(R, DEHYDRATING); such a doc is an
// orphan and counts against the orphan bounds until R is known. Its
// Assembly Manifest (Section 9.2) records the children and their final
// statuses and evaluates the completion policy; the engine's readiness
// tracker (Section 9.6) holds it until rehydration. Fields are guarded by
// engine.mu unless noted. Child outputs and out-of-order inputs
// live in the spool directory dir (spool.go), removed when ctx ends.
// Lock order: omu, then hmu or engine.mu.
type doc struct {
	id        uint32
	ctx       context.Context
	cancel    context.CancelCauseFunc
	root      *wire.EntityHeader // root header once the envelope arrived
	env       *wire.PipeDoc
	rootEnt   *entity
	rootKnown chan struct{} // closed when root is set
	total     int64         // pipestream.total-chunks, -1 until known
	children  map[uint64]*childState
	// man is the Assembly Manifest: one child per chunk, keyed by the ID
	// of the chunk's first entity (childState.mid). Sealed once root,
	// DEHYDRATING and all total children are known.
	man *assembly.Manifest

	dehydrating bool // STATUS(R, DEHYDRATING) received
	profile     bool // a marked child or root arrived: the profile's N:1 (4.2)
	plain       plainDoc
	orphan      bool
	cancelled   bool
	finishing   bool // rehydration started (or the document failed)

	dir     string   // spool directory; immutable
	spool   outSpool // the output spool file in dir (own lock)
	wantSum []byte   // pipestream.content-sha256, nil when absent
	wantLen int64    // pipestream.content-length, -1 when absent

	// The content hash over the children's inputs in chunk order, guarded
	// by hmu (spool.go noteInput).
	hmu      sync.Mutex
	inHash   hash.Hash
	inLen    uint64
	inNext   uint64          // lowest chunk index not hashed yet
	inNoted  map[uint64]bool // inputs seen (hashed or spooled as .in)
	inBroken error           // a spool error made the hash unknowable

	// The result hash over the children's outputs in chunk order, guarded
	// by omu (resulthash.go).
	omu     sync.Mutex
	outKick atomic.Bool // a chunk settled: the frontier may move (advanceOut)
	out     outFrontier
	parts   resultParts // streamed result (resultstream.go), guarded by omu
}

// childState is one chunk of a document. Its resolution and final status
// live in the manifest under mid; e may be replaced by a claim redemption
// with a fresh ID (redeem.go), mid stays.
type childState struct {
	e   *entity
	mid uint32   // the chunk's child ID in doc.man
	out *spooled // the spooled output of a succeeded child
}

// docKey is the readiness-tracker key of a document (root scope).
func docKey(d *doc) assembly.Key { return assembly.Key{Scope: 0, Parent: d.id} }

func (d *doc) isCancelled(g *engine) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return d.cancelled
}

// docFor returns the document of root id, creating an orphan entry. It
// returns nil when the orphan bound is reached. Caller holds g.mu.
func (g *engine) docFor(id uint32) *doc {
	if d := g.docs[id]; d != nil {
		return d
	}
	if g.orphanDocs >= g.lim.orphanDocs {
		return nil
	}
	ctx, cancel := context.WithCancelCause(g.ctx)
	dir := filepath.Join(g.work, strconv.FormatUint(uint64(id), 10)+"-"+strconv.FormatUint(g.seq.Add(1), 10))
	d := &doc{id: id, ctx: ctx, cancel: cancel, rootKnown: make(chan struct{}), total: -1,
		children: map[uint64]*childState{}, orphan: true, dir: dir, wantLen: -1,
		inHash: sha256.New(), inNoted: map[uint64]bool{}, out: outFrontier{hash: sha256.New(), lazy: true},
		man: assembly.NewManifest(id, 0, nil, uint64(g.now().UnixMicro()))}
	d.spool.dir = dir
	if err := g.ready.Add(d.man); err != nil { // cannot happen: g.docs has no entry for id
		g.log.Error("readiness tracker out of step with the documents", "entity", id, "err", err)
		g.ready.Remove(docKey(d))
		_ = g.ready.Add(d.man)
	}
	context.AfterFunc(ctx, func() { // result sent, failed, cancelled, session gone
		d.spool.close()
		os.RemoveAll(dir)
	})
	g.orphanDocs++
	g.docs[id] = d
	return d
}

// unorphan stops counting d against the orphan bounds. Caller holds g.mu.
func (g *engine) unorphan(d *doc) {
	if d.orphan {
		d.orphan = false
		g.orphanDocs--
		g.orphanChildren -= len(d.children)
	}
}

// child handles a dehydration child C_i (docs/profile.md 4.2 step 4), or
// a plain child of a parent the client dehydrates (plaindoc.go).
func (g *engine) child(h *wire.EntityHeader, payload io.Reader, abort func(wire.ErrorCode)) {
	parent := *h.ParentID
	ci := h.ChunkInfo
	if ci == nil {
		g.reject(h, abort, wire.CodeEntityInvalid, "child entity without chunk-info")
		return
	}
	g.mu.Lock()
	a := g.acceptChildLocked(h)
	g.mu.Unlock()
	if a.failed != nil {
		g.failPlainRoot(a.failed)
	}
	for _, r := range a.ready {
		g.spawn(func() { g.rehydrate(r) })
	}
	if a.why != "" {
		g.reject(h, abort, a.code, a.why)
		return
	}
	e := a.e
	defer e.cancel(nil)

	if h.PayloadLength > uint64(g.lim.maxChunkBytes) {
		g.reject(h, abort, wire.CodeEntityTooLarge, fmt.Sprintf("payload-length %d exceeds the peer's chunk limit %d", h.PayloadLength, g.lim.maxChunkBytes))
		g.childFinished(e, outcomeFailed, nil)
		return
	}
	release, err := g.admit(e.ctx, h.PayloadLength)
	if err != nil {
		abort(wire.CodeNoError) // document cancelled or session gone
		return
	}
	defer release()
	g.log.Debug("entity received", "entity", e.id, "kind", "child", "parent", parent, "chunk", ci.ChunkIndex, "plain", e.plain, "processor", e.procName, "bytes", h.PayloadLength)
	g.send(e, wire.StatusProcessing, nil)
	raw, err := g.readPayload(h, payload, g.lim.maxChunkBytes)
	if err != nil {
		g.payloadFailed(e, abort, err)
		g.childFinished(e, outcomeFailed, nil)
		return
	}
	e.payload = raw // verified: nothing was committed before this point
	e.inputNoted = g.noteInput(e.doc, ci.ChunkIndex, raw)
	g.finishChild(e, g.run(e))
}

// admission is the outcome of acceptChildLocked: the admitted child e,
// or why not (code, why); failed is the root of a plain document that the
// child's chunk-info broke (report it FAILED: plaindoc.go), ready the
// documents a refused plain child's total-chunks made ready.
type admission struct {
	e      *entity
	failed *doc
	ready  []*doc
	code   wire.ErrorCode
	why    string
}

// acceptChildLocked admits child h into its parent's document (an orphan
// one while the parent is unknown). Caller holds g.mu.
func (g *engine) acceptChildLocked(h *wire.EntityHeader) (a admission) {
	ci := h.ChunkInfo
	d := g.docFor(*h.ParentID)
	plain := !isProfile(h)
	if d != nil && plain && !d.cancelled && !d.finishing && !d.profile {
		a.why = g.plainTotalLocked(d, ci)
		a.failed = g.failBrokenLocked(d)
	}
	if a.why == "" {
		a.code, a.why = g.childRefusal(d, h, plain)
	}
	if a.why == "" {
		a.e, a.code, a.why = g.newChildLocked(d, h)
	}
	if a.why != "" {
		if a.code == 0 {
			a.code = wire.CodeEntityInvalid
		}
		if d != nil && d.plain.on && !d.finishing { // its total-chunks may have completed d
			g.sealLocked(d)
			a.ready = g.popReadyLocked()
		}
		return a
	}
	e := a.e
	e.doc, e.chunk, e.plain = d, int(ci.ChunkIndex), plain
	d.children[ci.ChunkIndex] = &childState{e: e, mid: e.id}
	if d.orphan {
		g.orphanChildren++
	}
	if plain {
		g.plainChildLocked(d, e)
	} else {
		d.profile = true
	}
	g.sealLocked(d)
	return a
}

// newChildLocked makes the entity of child h of d and adds it to d's
// manifest. Caller holds g.mu.
func (g *engine) newChildLocked(d *doc, h *wire.EntityHeader) (*entity, wire.ErrorCode, string) {
	e, err := g.newEntity(d.ctx, h, h.Metadata)
	if err != nil {
		return nil, wire.CodeEntityInvalid, err.Error()
	}
	if err = g.ready.AddChild(docKey(d), h.EntityID); err != nil {
		e.cancel(nil) // e.g. two chunks with one entity ID
		return nil, wire.CodeEntityInvalid, err.Error()
	}
	return e, 0, ""
}

// childRefusal says why child h cannot join d ("" when it can).
func (g *engine) childRefusal(d *doc, h *wire.EntityHeader, plain bool) (wire.ErrorCode, string) {
	ci := h.ChunkInfo
	switch {
	case d == nil:
		return wire.CodeWindowExceeded, "orphan buffer full: too many documents without root"
	case d.cancelled:
		return wire.CodeNoError, "document already cancelled"
	case d.finishing && plain && d.plain.on:
		// A plain client keeps no cancel for it: the child gets FAILED.
		return wire.CodeEntityInvalid, "plain parent already finished or failed"
	case d.finishing:
		return wire.CodeNoError, "document already finished or cancelled"
	case plain && d.profile, !plain && d.plain.on:
		return wire.CodeEntityInvalid, "profile and plain children under one parent"
	case d.total >= 0 && ci.ChunkIndex >= uint64(d.total):
		return wire.CodeEntityInvalid, "chunk-index " + strconv.FormatUint(ci.ChunkIndex, 10) + " >= total-chunks " + strconv.FormatInt(d.total, 10)
	case d.children[ci.ChunkIndex] != nil:
		return wire.CodeEntityInvalid, "duplicate chunk-index " + strconv.FormatUint(ci.ChunkIndex, 10)
	case uint64(len(d.children)) >= g.neg.maxPerScope:
		// max-entities-per-scope is a size limit: 0x06, as in the session
		// (docs/conformance.md decisions); 0x08 is the window.
		return wire.CodeEntityTooLarge, "more children than max-entities-per-scope"
	case d.orphan && g.orphanChildren >= g.lim.orphanChildren:
		return wire.CodeWindowExceeded, "orphan buffer full: too many children before their root"
	}
	return 0, ""
}

// finishChild spools the output of a succeeded child and reports COMPLETE
// (FAILED when the spool cannot be written), then records the outcome.
func (g *engine) finishChild(e *entity, res result) {
	switch res.kind {
	case resultSucceeded:
		sp, err := g.spoolOutput(e, res.out)
		if err != nil {
			if e.doc.ctx.Err() == nil {
				g.log.Error("child output not spooled; failing the child", "entity", e.id, "chunk", e.chunk, "err", err)
				g.send(e, wire.StatusFailed, nil)
			}
			g.childFinished(e, outcomeFailed, nil)
			return
		}
		if g.send(e, wire.StatusComplete, nil) {
			g.log.Debug("entity finished", "entity", e.id, "parent", e.doc.id, "status", wire.StatusComplete)
		}
		g.settleChild(e, outcomeSucceeded, sp, res.out.Data)
	case resultFailed:
		g.childFinished(e, outcomeFailed, nil)
	case resultSkipped:
		g.childFinished(e, outcomeSkipped, nil)
	case resultAbandoned:
		g.childFinished(e, outcomeAbandoned, nil)
	case resultDeferred:
		g.detachIfWaitingOnClaims(e.doc)
	}
}

// childFinished records the terminal outcome of child e in the manifest
// (a decrease-key in the readiness tracker) and starts the rehydration of
// every document that became ready.
func (g *engine) childFinished(e *entity, o childOutcome, out *spooled) {
	g.settleChild(e, o, out, nil)
}

// settleChild is childFinished with the bytes of the spooled output out,
// which the result hash takes from memory when the chunk is at its
// frontier (resulthash.go). data is not retained.
func (g *engine) settleChild(e *entity, o childOutcome, out *spooled, data []byte) {
	g.mu.Lock()
	d := e.doc
	cs := d.children[uint64(e.chunk)]
	if cs == nil || d.man.Resolved(cs.mid) {
		g.mu.Unlock()
		return
	}
	cs.out = out
	e.payload = nil // inputs are not kept; outputs are spooled
	g.settleLocked(d, cs.mid, o.status())
	ready := g.popReadyLocked()
	broken := d.plain.broken != "" && d.finishing
	g.mu.Unlock()
	if broken {
		g.releaseBroken(d)
	}
	g.advanceOut(d, out, data)
	for _, r := range ready {
		g.spawn(func() { g.rehydrate(r) })
	}
	if !slices.Contains(ready, d) {
		g.detachIfWaitingOnClaims(d)
	}
}

// settleLocked records the final status of child mid of d: through the
// readiness tracker while d is in it (decrease-key), else in the manifest
// alone (a cancelled or finished document). Caller holds g.mu.
func (g *engine) settleLocked(d *doc, mid uint32, final wire.Status) {
	var err error
	if m, tracked := g.ready.Get(docKey(d)); tracked && m == d.man {
		err = g.ready.Settle(docKey(d), mid, final)
	} else {
		_, err = d.man.Settle(mid, final)
	}
	if err != nil {
		g.log.Debug("child outcome not recorded", "entity", mid, "parent", d.id, "err", err)
	}
}

// sealLocked seals d's manifest once the root envelope, STATUS(R,
// DEHYDRATING) and all total-chunks children are known: from then on only
// resolutions lower its key. Caller holds g.mu.
func (g *engine) sealLocked(d *doc) {
	if d.cancelled || d.finishing || d.root == nil || !d.dehydrating || int64(len(d.children)) != d.total || d.man.Sealed() {
		return
	}
	if err := g.ready.Seal(docKey(d)); err != nil {
		g.log.Debug("manifest not sealed", "entity", d.id, "err", err)
	}
}

// popReadyLocked extracts every document whose manifest is ready (sealed,
// every child resolved) from the readiness tracker, oldest first, and
// marks it finishing: each is returned once. Caller holds g.mu.
func (g *engine) popReadyLocked() []*doc {
	var out []*doc
	for {
		m, ok := g.ready.PopReady()
		if !ok {
			return out
		}
		d := g.docs[m.ParentID]
		if d == nil || d.man != m || d.cancelled || d.finishing {
			continue
		}
		d.finishing = true
		out = append(out, d)
	}
}

// detachIfWaitingOnClaims detaches root R from the session's GOAWAY drain
// when every child that is not terminal is DEFERRED with a persisted claim:
// nothing on this session can finish R before a redemption (docs/profile.md
// 6, 7). A redemption re-attaches it.
func (g *engine) detachIfWaitingOnClaims(d *doc) {
	g.mu.Lock()
	ok := d.root != nil && !d.cancelled && !d.finishing && int64(len(d.children)) == d.total
	waiting := 0
	for _, cs := range d.children {
		if !ok {
			break
		}
		if !d.man.Resolved(cs.mid) {
			ok = cs.e.claim != nil && g.deferred[cs.e.id] == cs.e
			waiting++
		}
	}
	g.mu.Unlock()
	if ok && waiting > 0 {
		if err := g.c.SetDetached(0, d.id, true); err != nil {
			g.log.Debug("root not detached", "entity", d.id, "err", err)
			return
		}
		g.log.Debug("root detached: it waits only for claim redemptions", "entity", d.id, "deferred", waiting)
	}
}

// spawn runs fn on a tracked goroutine unless the engine is closing.
func (g *engine) spawn(fn func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
}

// takesRoot reports whether d may still get its profile root envelope:
// not full (nil), not known, finished or plain yet. Caller holds g.mu.
func (d *doc) takesRoot() bool {
	return d != nil && d.root == nil && !d.cancelled && !d.finishing && !d.plain.on
}

// dehydratedRoot handles the root envelope of a dehydrated document
// (docs/profile.md 4.2 step 3).
func (g *engine) dehydratedRoot(h *wire.EntityHeader, payload io.Reader, abort func(wire.ErrorCode)) {
	total, err := strconv.ParseUint(h.Metadata[MetaTotalChunks], 10, 32)
	if err != nil {
		g.reject(h, abort, wire.CodeEntityInvalid, MetaTotalChunks+" is not a 32-bit decimal integer")
		return
	}
	var contentLen uint64
	wantLen := int64(-1)
	if s := h.Metadata[MetaContentLength]; s != "" {
		if contentLen, err = strconv.ParseUint(s, 10, 63); err != nil {
			g.reject(h, abort, wire.CodeEntityInvalid, MetaContentLength+" is not a decimal integer")
			return
		}
		wantLen = int64(contentLen)
	}
	var wantSum []byte
	if s := h.Metadata[MetaContentSHA256]; s != "" {
		if wantSum, err = hex.DecodeString(s); err != nil || len(wantSum) != sha256.Size {
			g.reject(h, abort, wire.CodeEntityInvalid, MetaContentSHA256+" is not 64 hex digits (SHA-256)")
			return
		}
	}
	// The envelope carries no blob: read without the payload budget, so
	// that children holding the budget while they wait for the root's
	// completion policy cannot starve it.
	raw, err := g.readPayload(h, payload, g.lim.maxEntityBytes)
	if err != nil {
		g.payloadFailed(&entity{id: h.EntityID, header: h}, abort, err)
		return
	}
	env, err := g.decodeEnvelope(h, raw)
	if err != nil {
		g.reject(h, nil, wire.CodeOf(err), err.Error())
		return
	}
	if _, _, err := g.procs.lookup(h.Metadata); err != nil {
		g.reject(h, nil, wire.CodeEntityInvalid, err.Error())
		return
	}
	g.mu.Lock()
	d := g.docFor(h.EntityID)
	if !d.takesRoot() {
		g.mu.Unlock()
		g.reject(h, nil, wire.CodeEntityInvalid, "root entity for a document that is full, known, finished or plain")
		return
	}
	d.root, d.env, d.total, d.profile = h, env, int64(total), true
	d.man.Policy = h.CompletionPolicy
	d.wantSum, d.wantLen = wantSum, wantLen
	d.rootEnt = &entity{id: h.EntityID, header: h, chunk: -1, ctx: d.ctx, cancel: d.cancel}
	g.unorphan(d)
	close(d.rootKnown)
	var why string
	code := wire.CodeEntityTooLarge
	switch {
	case total > g.neg.maxPerScope:
		why = "total-chunks exceeds max-entities-per-scope"
	case total > g.allowedChildren(contentLen):
		why = "total-chunks exceeds the amplification ratio (children per MB of content)"
	}
	for idx := range d.children {
		if idx >= total {
			code, why = wire.CodeEntityInvalid, "a child's chunk-index is >= total-chunks"
		}
	}
	var ready []*doc
	if why != "" {
		d.finishing = true
		delete(g.docs, d.id)
		g.ready.Remove(docKey(d))
	} else {
		g.sealLocked(d)
		ready = g.popReadyLocked()
	}
	pol := effectivePolicy(h.CompletionPolicy)
	var running []*entity
	for _, cs := range d.children {
		if !d.man.Resolved(cs.mid) && cs.e.header.CompletionPolicy == nil {
			running = append(running, cs.e)
		}
	}
	g.mu.Unlock()
	g.log.Info("entity received", "entity", h.EntityID, "kind", "dehydrated root", "doc", env.DocID, "total_chunks", total)
	if why != "" {
		g.log.Warn("document rejected", "entity", h.EntityID, "doc", env.DocID, "code", code, "reason", why)
		g.send(d.rootEnt, wire.StatusFailed, nil)
		d.cancel(errCancelled)
		return
	}
	for _, e := range running { // the root's timeout-ms now applies to them
		g.armTimeout(e, pol.timeout)
	}
	self := false
	for _, r := range ready {
		if r == d {
			self = true
			continue
		}
		g.spawn(func() { g.rehydrate(r) })
	}
	if self {
		g.rehydrate(d)
	} else {
		g.detachIfWaitingOnClaims(d)
	}
}

// rehydrate evaluates the completion policy and reports REHYDRATING, checks
// the root's content summary, sends the result (children outputs in
// chunk-index order, streamed from the spool) and COMPLETE, or FAILED
// (docs/profile.md 4.2 step 4, 4.3, 5).
func (g *engine) rehydrate(d *doc) {
	defer d.cancel(nil) // removes the spool
	g.mu.Lock()
	var parts []part
	for i := range uint64(d.total) {
		cs := d.children[i]
		if st, _ := d.man.Status(cs.mid); st == wire.StatusComplete {
			parts = append(parts, part{idx: i, sp: cs.out})
		}
	}
	docID, re, plain := "", d.rootEnt, d.plain.on
	if d.env != nil {
		docID = d.env.DocID
	}
	name, proc := g.mergeProcessorLocked(d)
	delete(g.docs, d.id)
	v, err := d.man.Evaluate() // ready: popped from the tracker
	g.mu.Unlock()
	if err != nil {
		g.log.Error("rehydration of a manifest that is not ready", "entity", d.id, "err", err)
		g.send(re, wire.StatusFailed, nil)
		return
	}

	complete := v.ParentStatus == wire.StatusComplete
	if !g.send(re, wire.StatusRehydrating, nil) {
		return
	}
	g.log.Info("document rehydrating", "entity", d.id, "doc", docID, "succeeded", v.Succeeded, "total", v.Total, "complete", complete, "state", v.State.String())
	if !complete {
		g.send(re, wire.StatusFailed, nil)
		g.log.Info("entity finished", "entity", d.id, "doc", docID, "status", wire.StatusFailed, "reason", "completion policy not met")
		return
	}
	if why := g.verifyContent(d); why != "" {
		g.send(re, wire.StatusFailed, nil)
		g.log.Warn("entity finished", "entity", d.id, "doc", docID, "status", wire.StatusFailed, "reason", why)
		return
	}
	re.proc, re.procName = proc, name
	counts := [2]int{v.Succeeded, v.Total}
	var n int64
	if c, ok := proc.(Concatenator); ok {
		var streamed bool
		if n, streamed, err = g.sendSummary(d, c, parts, counts); err == nil && !streamed {
			n, err = g.sendConcat(re.ctx, d, c, parts, counts, plain)
		}
	} else {
		var outs []*Output
		if outs, err = g.loadParts(d, parts); err == nil {
			var out *Output
			out, err = g.call(re, func() (*Output, error) { return proc.Rehydrate(re.ctx, outs) })
			if err == nil {
				n, err = int64(len(out.Data)), g.sendResult(re.ctx, d.id, out, &counts, plain)
			}
		}
	}
	if err != nil {
		g.log.Warn("rehydration failed", "entity", d.id, "doc", docID, "err", err)
		g.send(re, wire.StatusFailed, nil)
		return
	}
	if g.send(re, wire.StatusComplete, nil) {
		g.log.Info("entity finished", "entity", d.id, "doc", docID, "status", wire.StatusComplete, "bytes", n, "children", v.Total)
	}
}
