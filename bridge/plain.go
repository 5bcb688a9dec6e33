package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pipestream/gateway/bridge/internal/split"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Plain documents (docs/profile.md 9): toward a peer without this
// project's profile the gateway sends plain draft-02 entities. A document
// sent whole is one root entity whose payload is the content; a larger one
// (draft-02) is STATUS(R, DEHYDRATING) and plain chunk children, the last
// one carrying total-chunks. A draft-04 peer gets every document whole, on
// a connection of its own, with the six-member header. Results are the
// entities the peer sends back, matched to the document's entities by the
// attribution rules (plainMode.attributeRegLocked in mode_plain.go, profile
// 9.4: parent-id first): one
// for R is the whole result, ones for chunks are rehydrated in chunk
// order; none gives SUCCEEDED with an absent result.

// plainPart is a chunk's result from a plain peer, spooled to a file.
type plainPart struct {
	path string
	n    int64
}

// dropPlainLocked removes an attempt's spooled chunk results and stops its
// settle timer.
func (a *attempt) dropPlainLocked() {
	for _, p := range a.plainParts {
		_ = os.Remove(p.path)
	}
	a.plainParts = nil
	if a.plainSettle != nil {
		a.plainSettle.Stop()
		a.plainSettle = nil
	}
}

// sendPlain performs one plain attempt from the spool or inline content:
// as chunks, or whole (with the profile's metadata and the completion
// policy in the header when meta, draft-02; without, draft-04).
func (j *attempt) sendPlain(chunks, meta bool) error {
	f, ok := j.openAttemptContent()
	if !ok {
		return nil
	}
	defer f.Close()
	if chunks {
		return j.sendPlainChunks(f)
	}
	return j.sendPlainWhole(f, meta)
}

// sendPlainWhole sends the content as one plain root entity, streamed.
func (j *attempt) sendPlainWhole(f contentReader, meta bool) error {
	d, ss := j.d, j.ss
	id, err := ss.s.AssignID(j.ctx)
	if err != nil {
		return err
	}
	j.d.lock()
	if !j.current() {
		j.d.unlock()
		return context.Canceled
	}
	j.registerRootLocked(id)
	j.d.unlock()
	h := &wire.EntityHeader{EntityID: id, Layer: 0, ContentType: d.rec.Doc.ContentType,
		PayloadLength: uint64(d.size), Checksum: append([]byte(nil), d.sum[:]...)}
	if meta {
		h.Metadata, h.CompletionPolicy = d.plan.rootMetadata(false), d.plan.wirePolicy()
	}
	return ss.s.SendEntity(j.ctx, h, io.NewSectionReader(f, 0, d.size))
}

// sendPlainChunks sends STATUS(R, DEHYDRATING) and the chunks as plain
// children. One chunk is held back so that the last one carries
// total-chunks (a plain peer learns N from it).
func (j *attempt) sendPlainChunks(f contentReader) error {
	d := j.d
	rootID, err := j.startDehydration()
	if err != nil {
		return err
	}
	sp, err := split.New(f, d.plan.splitStrategy(), d.plan.chunkBytes)
	if err != nil {
		return err
	}
	var bufs [2][]byte
	cur, err := sp.Next(bufs[0])
	for i := 1; err == nil; i++ {
		next, nerr := sp.Next(bufs[i%2])
		total := uint64(0)
		if errors.Is(nerr, io.EOF) {
			total = cur.Index + 1
			j.d.lock()
			j.plainTotal = int(total)
			j.d.unlock()
		} else if nerr != nil {
			return nerr
		}
		if err := j.sendChunk(rootID, cur, total, d.plan.childMetadata(cur.Index, false)); err != nil {
			return err
		}
		bufs[(i-1)%2] = cur.Data[:0]
		cur, err = next, nerr
	}
	if !errors.Is(err, io.EOF) {
		return err
	}
	j.d.lock()
	if j.current() {
		d.checkPlainChildrenLocked()
	}
	j.d.unlock()
	return nil
}

// startDehydration assigns R, registers it and its policy, and sends
// STATUS(R, DEHYDRATING) (profile 4.2 step 1; plain use the same).
func (j *attempt) startDehydration() (uint32, error) {
	d, ss, ctx := j.d, j.ss, j.ctx
	rootID, err := ss.s.AssignID(ctx)
	if err != nil {
		return 0, err
	}
	j.d.lock()
	if !j.current() {
		j.d.unlock()
		return 0, context.Canceled
	}
	j.registerRootLocked(rootID)
	j.d.unlock()
	// The children carry the policy; register it for R too, so the
	// session knows the children's retry budget (FAILED -> RETRYING).
	if err := ss.s.SetPolicy(rootID, d.plan.wirePolicy()); err != nil {
		return 0, fmt.Errorf("register completion policy: %w", err)
	}
	if err := ss.s.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: rootID}); err != nil {
		return 0, fmt.Errorf("send DEHYDRATING: %w", err)
	}
	j.d.lock()
	if j.current() {
		e := j.ents[rootKey(rootID)]
		e.Status = gatewayv1.EntityStatus_ENTITY_STATUS_DEHYDRATING
		d.setEntity(rootKey(rootID), e)
		j.d.env.kickFlush()
	}
	j.d.unlock()
	return rootID, nil
}

// sendChunk sends chunk c of R as a child entity with metadata md.
func (j *attempt) sendChunk(rootID uint32, c split.Chunk, total uint64, md map[string]string) error {
	d, ss, ctx := j.d, j.ss, j.ctx
	id, err := ss.s.AssignID(ctx)
	if err != nil {
		return err
	}
	parent := rootID
	h := &wire.EntityHeader{
		EntityID: id, ParentID: &parent, Layer: 0, ContentType: d.rec.Doc.ContentType,
		PayloadLength: uint64(len(c.Data)), Checksum: append([]byte(nil), c.Sum[:]...),
		Metadata:         md,
		ChunkInfo:        &wire.ChunkInfo{TotalChunks: total, ChunkIndex: c.Index, ChunkOffset: c.Offset},
		CompletionPolicy: d.plan.wirePolicy(),
	}
	j.d.lock()
	if !j.current() {
		j.d.unlock()
		return context.Canceled
	}
	k := rootKey(id)
	j.d.env.regLock()
	bindEntRegLocked(ss, k, &entRef{att: j, key: k})
	j.d.env.regUnlock()
	d.setEntity(k, &gatewayv1.Entity{EntityId: id, ParentId: rootID, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PENDING,
		ChunkIndex: uint32(c.Index), ChunkOffset: c.Offset, SizeBytes: uint64(len(c.Data)), Checksum: hexSum(c.Sum[:])})
	j.entSince[k] = time.Now()
	j.d.unlock()
	if err := ss.s.SendEntity(ctx, h, bytes.NewReader(c.Data)); err != nil {
		return fmt.Errorf("send chunk %d: %w", c.Index, err)
	}
	return nil
}

// onPlainResult reads an entity a plain peer sent, which attribution
// matched to ref (plainMode.attributeRegLocked, docs/profile.md 9.4; it
// counts as being read from there, plainActive): R's result is the
// document's result and a chunk's is spooled until the document is
// rehydrated.
func (env *docEnv) onPlainResult(ref *entRef, e *quicpeer.IncomingEntity) {
	ref.att.d.lock()
	a, key := ref.att, ref.key
	isRoot := key == rootKey(a.rootID)
	var idx uint64
	if ent := a.ents[key]; ent != nil {
		idx = uint64(ent.ChunkIndex)
	}
	ref.att.d.unlock()
	if isRoot {
		a.storePlainRootResult(e)
	} else {
		a.storePlainPart(idx, e)
	}
}

// storePlainRootResult stores a whole result for R (as a profile result).
func (a *attempt) storePlainRootResult(e *quicpeer.IncomingEntity) {
	d := a.d
	inline, spooled, n, err := a.d.env.readResult(d.id, e.Payload, e.Header.PayloadLength, d.diskRetryFor())
	a.d.env.m.bytesOut.Add(float64(n))
	a.d.lock()
	defer a.d.unlock()
	if !a.newest() {
		return
	}
	d.plainResultStoredLocked(storedResult{inline, spooled, n, e.Header.ContentType}, err, "storing the result failed")
}

// storedResult is a result as readResult stored it.
type storedResult struct {
	inline      []byte
	spooled     bool
	n           int64
	contentType string
}

// plainResultStoredLocked ends a result read of d's current attempt: the
// result is d's, or err fails it (what says which step).
func (d *docRun) plainResultStoredLocked(r storedResult, err error, what string) {
	d.att.plainActive--
	if err != nil {
		d.resultFailedLocked(err, what)
		return
	}
	d.att.resultReady, d.out.result = true, r.inline
	d.rec.ResultPayload, d.rec.ResultContentType = r.spooled, r.contentType
	d.rec.Doc.ResultSizeBytes = uint64(r.n)
	d.maybeFinishLocked()
	d.env.kickFlush()
}

// storePlainPart spools chunk idx's result; a part that fails its
// checksum is dropped (logged): the chunk then contributes nothing.
func (a *attempt) storePlainPart(idx uint64, e *quicpeer.IncomingEntity) {
	d := a.d
	p, err := spoolPart(filepath.Join(a.d.env.opts.DataDir, plainPartsDir), d.id, e.Payload)
	a.d.env.m.bytesOut.Add(float64(p.n))
	a.d.lock()
	defer a.d.unlock()
	stale := !a.newest()
	if !stale {
		a.plainActive--
	}
	if err != nil || stale {
		if err != nil {
			a.d.env.log.Warn("bridge: dropping a chunk result from a plain peer", "doc", d.id, "chunk", idx, "err", err)
		}
		_ = os.Remove(p.path)
		return
	}
	if a.plainParts == nil {
		a.plainParts = map[uint64]plainPart{}
	}
	a.plainParts[idx] = p // attribution admits one result per chunk
	if a.rootComplete {
		d.maybeFinishLocked()
	}
}

// spoolPart writes r to a new file in dir.
func spoolPart(dir, docID string, r io.Reader) (plainPart, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return plainPart{}, err
	}
	f, err := os.CreateTemp(dir, docID+"-*")
	if err != nil {
		return plainPart{}, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return plainPart{path: f.Name(), n: n}, err
}

// checkPlainChildrenLocked runs after a chunk of a plain dehydrated
// document changed: once every chunk is terminal and the peer has said
// nothing more about R, the gateway waits plainSettleWait for the peer's
// own rehydration (this project's peer reports REHYDRATING at once), then
// rehydrates itself (rehydratePlainLocked).
func (d *docRun) checkPlainChildrenLocked() {
	a := d.att
	if a.plainTotal == 0 || d.terminal() || a.rootComplete {
		return
	}
	if a.countPlainDone() < a.plainTotal {
		return
	}
	root := a.ents[rootKey(a.rootID)]
	if root == nil || root.Status != gatewayv1.EntityStatus_ENTITY_STATUS_DEHYDRATING {
		return // the peer took R further: it rehydrates itself
	}
	d.armPlainSettleLocked((*docRun).rehydratePlainLocked, plainSettleWait)
}

// countPlainDone counts the terminal chunks of the attempt.
func (a *attempt) countPlainDone() int {
	n := 0
	for k, e := range a.ents {
		if k.scope == 0 && k.id != a.rootID && terminalEntity(e.Status) {
			n++
		}
	}
	return n
}

// armPlainSettleLocked runs then (under the lock) after wait, unless the
// attempt ended; while result streams are being read it waits another
// round of plainSettleWait.
func (d *docRun) armPlainSettleLocked(then func(*docRun), wait time.Duration) {
	a := d.att
	if a.plainSettle != nil {
		a.plainSettle.Stop()
	}
	a.plainSettle = time.AfterFunc(wait, func() {
		d.lock()
		defer d.unlock()
		if !a.newest() {
			return
		}
		if a.plainActive > 0 {
			d.armPlainSettleLocked(then, plainSettleWait)
			return
		}
		then(d)
	})
}

// resultSettleLocked is how long a plain document whose R is complete
// waits for a result stream to start: plainSettleWait, or
// plainSettleLearned toward a peer known to return none (learned per
// peer: it never sent an entity, and its last learnNoResultsAfter
// documents ended with the result absent).
func (a *attempt) resultSettleLocked() time.Duration {
	if a.ss == nil {
		return plainSettleWait
	}
	a.d.env.regLock()
	learned := a.ss.pc.knownResultless()
	a.d.env.regUnlock()
	if learned {
		return plainSettleLearned
	}
	return plainSettleWait
}

// rehydratePlainLocked ends R of a plain dehydrated document itself: the
// completion policy over the chunks' statuses decides, the gateway reports
// REHYDRATING and the outcome for R to the peer, and the chunks' results
// are concatenated in chunk order.
func (d *docRun) rehydratePlainLocked() {
	a := d.att
	root := a.ents[rootKey(a.rootID)]
	if root == nil || root.Status != gatewayv1.EntityStatus_ENTITY_STATUS_DEHYDRATING {
		return
	}
	c, t := a.allChildrenComplete()
	ok := policyAccepts(d.plan.opts.GetCompletionPolicy(), c, t)
	out := wire.StatusComplete
	if !ok {
		out = wire.StatusFailed
	}
	if ss := d.sess(); ss != nil {
		// Written after the lock is released, in this order (ctrlout.go).
		for _, st := range []wire.Status{wire.StatusRehydrating, out} {
			d.env.sendStatusLocked(ss, d.id, wire.StatusFrame{Status: st, EntityID: a.rootID})
		}
	}
	root.Status = entityStatus(out)
	d.setEntity(rootKey(a.rootID), root)
	if !ok {
		d.finishLocked(gatewayv1.State_FAILED, fmt.Sprintf("completion policy %s not met: %d of %d chunks completed at the peer %s",
			d.plan.opts.GetCompletionPolicy().GetMode(), c, t, a.peerAddr()))
		return
	}
	a.rootComplete = true
	d.maybeFinishLocked()
}

// policyAccepts evaluates a completion policy over c complete of t
// children (profile 5).
func policyAccepts(cp *gatewayv1.CompletionPolicy, c, t int) bool {
	switch cp.GetMode() {
	case gatewayv1.CompletionPolicy_LENIENT:
		return c >= 1
	case gatewayv1.CompletionPolicy_BEST_EFFORT:
		return true
	case gatewayv1.CompletionPolicy_QUORUM:
		r := float64(cp.GetMinSuccessRatio())
		if r <= 0 || r > 1 {
			r = 0.5
		}
		return t > 0 && float64(c)/float64(t) >= r
	}
	return c == t
}

// finishPlainLocked decides a plain document whose R is complete but whose
// result is not (yet) in: chunk results are assembled in chunk order; with
// none, after the settle wait (resultSettleLocked: plainSettleWait, or
// shorter toward a peer known to return none) the document succeeds with
// its result absent.
// It reports whether it took over (the caller returns).
func (d *docRun) finishPlainLocked() bool {
	a := d.att
	if a.resultReady || a.resultErr != "" {
		return false
	}
	if len(a.plainParts) > 0 && a.plainActive == 0 {
		d.assemblePlainLocked()
		return true
	}
	d.armPlainSettleLocked(func(d *docRun) {
		if len(d.att.plainParts) > 0 {
			d.assemblePlainLocked()
			return
		}
		d.att.resultReady = true
		d.rec.Doc.ResultAbsent = true
		if ss := d.att.ss; ss != nil {
			d.env.regLock()
			ss.pc.absentStreak++
			d.env.regUnlock()
		}
		d.env.log.Info("bridge: the peer returned no result for a plain document", "doc", d.id, "peer", d.att.peerAddr())
		d.maybeFinishLocked()
	}, a.resultSettleLocked())
	return true
}

// assemblePlainLocked concatenates the spooled chunk results in chunk order
// into the document's result (off the lock), then finishes it.
func (d *docRun) assemblePlainLocked() {
	a := d.att
	if miss := a.completeChunksWithoutResult(); len(miss) > 0 {
		d.awaitMissingPartsLocked(miss)
		return
	}
	parts := a.plainParts
	a.plainParts = nil
	a.plainActive++ // the assembly is a result being read
	idx := slices.Sorted(func(yield func(uint64) bool) {
		for k := range parts {
			if !yield(k) {
				return
			}
		}
	})
	d.env.wg.Add(1)
	go func() {
		defer d.env.wg.Done()
		var total int64
		files := make([]io.Reader, 0, len(idx))
		var closers []*os.File
		var err error
		for _, k := range idx {
			f, oerr := os.Open(parts[k].path)
			if oerr != nil {
				err = oerr
				break
			}
			closers = append(closers, f)
			files = append(files, f)
			total += parts[k].n
		}
		var inline []byte
		var spooled bool
		var n int64
		if err == nil {
			inline, spooled, n, err = d.env.readResult(d.id, io.MultiReader(files...), uint64(total), d.diskRetryFor())
		}
		for _, f := range closers {
			_ = f.Close()
		}
		for _, p := range parts {
			_ = os.Remove(p.path)
		}
		d.lock()
		defer d.unlock()
		if !a.newest() {
			return
		}
		d.plainResultStoredLocked(storedResult{inline, spooled, n, d.rec.Doc.ContentType}, err, "assembling the chunk results failed")
	}()
}

// completeChunksWithoutResult lists the chunk indexes that the peer
// reported COMPLETE but returned no result for, when it returned results
// for other chunks (a peer that returns chunk results returns one for
// every chunk it completes; profile 9.4). Caller holds the registry's mu.
func (a *attempt) completeChunksWithoutResult() []uint64 {
	if len(a.plainParts) == 0 {
		return nil
	}
	var miss []uint64
	for k, e := range a.ents {
		if k.scope != 0 || k.id == a.rootID || e.Status != gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE {
			continue
		}
		if _, ok := a.plainParts[uint64(e.ChunkIndex)]; !ok {
			miss = append(miss, uint64(e.ChunkIndex))
		}
	}
	slices.Sort(miss)
	return miss
}

// awaitMissingPartsLocked holds the assembly of d's chunk results while
// chunks the peer completed have none: a result part that arrives
// (storePlainPart) assembles the document; after resultFinishGrace the
// attempt ends and the document is dispatched again (a result assembled
// without them would silently lose those chunks' output).
func (d *docRun) awaitMissingPartsLocked(miss []uint64) {
	a := d.att
	if a.awaitingParts {
		return
	}
	a.awaitingParts = true
	d.env.log.Warn("bridge: the peer completed chunks without returning their results; waiting for them",
		"doc", d.id, "peer", a.peerAddr(), "chunks", miss, "results", len(a.plainParts))
	a.stopFinishTimer()
	a.finishTimer = time.AfterFunc(resultFinishGrace, func() {
		d.lock()
		defer d.unlock()
		if !a.current() || a.resultReady {
			return
		}
		a.awaitingParts = false
		if miss := a.completeChunksWithoutResult(); len(miss) > 0 {
			d.abortAttemptLocked(fmt.Sprintf("the peer %s completed chunk(s) %v but returned no result for them within %v, while it returned results for %d other chunk(s)",
				a.peerAddr(), miss, resultFinishGrace, len(a.plainParts)), true)
			return
		}
		d.maybeFinishLocked()
	})
}
