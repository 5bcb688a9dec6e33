package bridge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/pipestream/gateway/bridge/internal/split"
	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// startAttempt takes the first queued document that a session can take
// and starts an attempt on the session placement picks
// (pickSessionRegLocked; nil when there is nothing to do). The queue is
// read under the registry's mu, the document placed under its own lock
// (and the registry's again), which re-checks what the queue said.
func (b *Bridge) startAttempt() *attempt {
	for {
		b.mu.Lock()
		d := b.nextPlaceableRegLocked()
		b.mu.Unlock()
		if d == nil {
			return nil
		}
		d.lock()
		j, again := d.placeQueuedLocked()
		d.unlock()
		if !again {
			return j
		}
	}
}

// nextPlaceableRegLocked is the first queued document for which placement
// finds a session now, nil when there is none (or the bridge is closing).
// A document that needs entity metadata waits for a peer that receives
// it (pickSessionRegLocked's meta) without holding up the documents
// queued behind it that do not. Each kind is picked for once.
func (b *Bridge) nextPlaceableRegLocked() *docRun {
	if b.closing {
		return nil
	}
	var picked, found [2]bool // [0]: any peer; [1]: one that receives metadata
	for _, d := range b.queue {
		k := 0
		if d.plan.needsMetadata() != "" {
			k = 1
		}
		if !picked[k] {
			picked[k], found[k] = true, b.pickSessionRegLocked(true, k == 1) != nil
		}
		if found[k] {
			return d
		}
		if picked[0] && picked[1] {
			return nil
		}
	}
	return nil
}

// placeQueuedLocked takes d out of the queue and starts its attempt on the
// session placement picks; again: d was not to be placed (taken meanwhile,
// finished, or running), the caller looks at the queue anew.
func (d *docRun) placeQueuedLocked() (j *attempt, again bool) {
	d.env.regLock()
	j, prev, again := d.placeQueuedRegLocked()
	d.env.regUnlock()
	if j != nil {
		d.attemptStartedLocked(prev)
	}
	return j, again
}

// placeQueuedRegLocked is placeQueuedLocked's registry section: the pick,
// the queue and the placement happen in one, so the picked session cannot
// close between them unseen (HandleClose aborts the documents it carries).
func (d *docRun) placeQueuedRegLocked() (j, prev *attempt, again bool) {
	if d.env.reg.closing {
		return nil, nil, false
	}
	ss := d.env.pickSessionRegLocked(true, d.plan.needsMetadata() != "")
	if ss == nil {
		return nil, nil, false
	}
	d.env.reg.unqueue(d) // queued says whether it is there: both change together
	if !d.queued {
		return nil, nil, true
	}
	d.queued = false
	if d.terminal() || d.sess() != nil {
		return nil, nil, true
	}
	j, prev = d.placeRegLocked(ss)
	j.dispatched = true
	ss.pc.sending++ // until runAttempt returns
	return j, prev, false
}

// runAttempt sends the document (from the spool or the inline content, or
// from src when the upload is pipelined) and handles the outcome.
func (j *attempt) runAttempt(src chunkSource) {
	err := j.sendDocument(src)
	j.d.lock()
	defer j.d.unlock()
	if j.dispatched {
		j.d.env.regLock()
		j.ss.pc.sending--
		j.d.env.regUnlock()
		select { // the peer may take another document
		case j.d.env.kickCh <- struct{}{}:
		default:
		}
	}
	if !j.current() {
		return
	}
	switch {
	case err == nil:
		j.sendDone = true
	case j.ctx.Err() != nil:
		// cancelled, finished, or aborted elsewhere
	case sessionGone(j.ss, err):
		// HandleClose re-dispatches
	default:
		j.d.env.log.Warn("bridge: sending a document failed", "doc", j.d.id, "attempt", j.gen, "err", err)
		j.d.abortAttemptLocked(fmt.Sprintf("sending to the PipeStream peer %s failed: %v", j.peerAddr(), err), true)
	}
}

// chunkSource yields a dehydrated document's chunks.
type chunkSource interface {
	// next returns the next chunk or io.EOF; the chunk's Data stays valid
	// until the next call.
	next(ctx context.Context) (split.Chunk, error)
	// summary is the whole content's length, SHA-256 and chunk count, valid
	// after next returned io.EOF (it may wait for the upload to commit).
	summary(ctx context.Context) (size int64, sum [32]byte, n uint64, err error)
}

// spoolSource cuts the spool file again (the cut is deterministic).
type spoolSource struct {
	sp  *split.Splitter
	buf []byte
}

func (s *spoolSource) next(context.Context) (split.Chunk, error) {
	c, err := s.sp.Next(s.buf)
	if err == nil {
		s.buf = c.Data[:0]
	}
	return c, err
}

func (s *spoolSource) summary(context.Context) (int64, [32]byte, uint64, error) {
	return int64(s.sp.BytesRead()), s.sp.Sum(), s.sp.Count(), nil
}

// sendDocument performs one attempt, as its mode sends (mode.go).
func (j *attempt) sendDocument(src chunkSource) error {
	return j.mode.send(j.d.env, j, src)
}

// sendProfile performs one attempt of the profile (4.1 / 4.2).
func (j *attempt) sendProfile(src chunkSource) error {
	d, ss, ctx := j.d, j.ss, j.ctx
	// The chunk count is known up front for a spooled document; a
	// pipelined upload learns its size only at the commit (d.size is
	// written then, under mu), so its chunks go without it.
	spooled := src == nil
	if spooled {
		f, ok := j.openAttemptContent()
		if !ok {
			return nil
		}
		defer f.Close()
		if d.plan.whole(d.size, j.d.env.opts.InlineThreshold) {
			return j.sendWhole(f)
		}
		sp, err := split.New(f, d.plan.splitStrategy(), d.plan.chunkBytes)
		if err != nil {
			return err
		}
		src = &spoolSource{sp: sp}
	}
	rootID, err := j.startDehydration()
	if err != nil {
		return err
	}
	for {
		c, err := src.next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		total := uint64(0)
		if spooled && d.plan.strategy == gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES && d.size > 0 {
			total = uint64((d.size + int64(d.plan.chunkBytes) - 1) / int64(d.plan.chunkBytes))
		}
		if err := j.sendChunk(rootID, c, total, d.plan.childMetadata(c.Index, true)); err != nil {
			return err
		}
	}
	size, sum, n, err := src.summary(ctx)
	if err != nil {
		return err
	}
	md := d.plan.rootMetadata(true)
	md[metaTotalChunks] = strconv.FormatUint(n, 10)
	md[metaContentLength] = strconv.FormatInt(size, 10)
	md[metaContentSHA] = hexSum(sum[:])
	env, err := ss.codec.MarshalPipeDoc(d.envelope(rootID, nil))
	if err != nil {
		return err
	}
	return ss.s.SendEntity(ctx, d.rootHeader(rootID, env, md), bytes.NewReader(env))
}

// openAttemptContent opens the content of j's document; when it is missing
// the document fails (ok false).
func (j *attempt) openAttemptContent() (contentReader, bool) {
	f, err := j.d.env.openContent(j.ctx, j.d)
	if err == nil {
		return f, true
	}
	if errors.Is(err, store.ErrUnavailable) {
		j.retryAttemptLater(err)
		return nil, false
	}
	j.d.lock()
	if j.current() {
		j.d.finishLocked(gatewayv1.State_FAILED, fmt.Sprintf("the spooled content is missing (%v); resubmit the document", err))
	}
	j.d.unlock()
	return nil, false
}

// retryAttemptLater ends attempt j, which could not read its content
// because the store is unavailable (a database restart), after
// storeRetryDelay, and dispatches the document again (not counted against
// its attempts): the content is not missing, only out of reach.
func (j *attempt) retryAttemptLater(err error) {
	j.d.env.log.Warn("bridge: the store is unavailable; dispatching the document again shortly", "doc", j.d.id, "in", storeRetryDelay, "err", err)
	time.AfterFunc(storeRetryDelay, func() {
		j.d.lock()
		defer j.d.unlock()
		if j.current() && !j.d.terminal() && !j.d.dropped {
			j.d.abortAttemptLocked("the store was unavailable (not the peer's fault; dispatching again): "+err.Error(), false)
		}
	})
}

// sendWhole sends a document whole: the envelope carries the blob (profile 4.1).
func (j *attempt) sendWhole(f contentReader) error {
	d, ss, ctx := j.d, j.ss, j.ctx
	content, err := wholeContent(f, d.size)
	if err != nil {
		return fmt.Errorf("read spool: %w", err)
	}
	id, err := ss.s.AssignID(ctx)
	if err != nil {
		return err
	}
	env, err := ss.codec.MarshalPipeDoc(d.envelope(id, content))
	if err != nil {
		return err
	}
	j.d.lock()
	if !j.current() {
		j.d.unlock()
		return context.Canceled
	}
	j.registerRootLocked(id)
	md := d.plan.rootMetadata(true)
	if ss.n.Profile {
		// Both ends speak the profile: offer the result inline in COMPLETE
		// (profile 4.3.2); a peer that does not know the key ignores it.
		j.inlineOffer = inlineResultOffer
		md[metaAcceptInline] = inlineResultOfferStr
	}
	j.d.unlock()
	return ss.s.SendEntity(ctx, d.rootHeader(id, env, md), bytes.NewReader(env))
}

// registerRootLocked records the root entity of the attempt and moves the
// document to RUNNING.
func (j *attempt) registerRootLocked(rootID uint32) {
	d := j.d
	j.rootID = rootID
	k := rootKey(rootID)
	j.d.env.regLock()
	bindEntRegLocked(j.ss, k, &entRef{att: j, key: k})
	j.d.env.regUnlock()
	j.entSince[k] = time.Now()
	d.setEntity(k, &gatewayv1.Entity{EntityId: rootID, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PENDING,
		SizeBytes: uint64(d.size), Checksum: hexSum(d.sum[:]), Attempts: d.rec.DispatchAttempts})
	if d.rec.Doc.State == gatewayv1.State_PENDING {
		d.setState(gatewayv1.State_RUNNING, "")
	}
	j.d.env.kickFlush()
}

// envelope is the PipeDoc of the root (draft Section 7): doc id, entity id,
// ownership (tenant as owner-id), blob for whole documents.
func (d *docRun) envelope(rootID uint32, blob []byte) *wire.PipeDoc {
	return &wire.PipeDoc{DocID: d.id, EntityID: rootID, Ownership: &wire.OwnershipContext{OwnerID: string(d.tenant)}, Blob: blob}
}

// rootHeader is the root entity's header (profile 4).
func (d *docRun) rootHeader(rootID uint32, env []byte, md map[string]string) *wire.EntityHeader {
	sum := sha256.Sum256(env)
	return &wire.EntityHeader{
		EntityID: rootID, Layer: 0, ContentType: d.rec.Doc.ContentType,
		PayloadLength: uint64(len(env)), Checksum: sum[:], Metadata: md,
		CompletionPolicy: d.plan.wirePolicy(),
	}
}

// finishLocked moves d to a terminal state and stops its attempt.
func (d *docRun) finishLocked(s gatewayv1.State, msg string) {
	if d.terminal() {
		return
	}
	a := d.att
	a.stopFinishTimer()
	a.stopSending()
	if ss := d.sess(); ss != nil {
		d.leaveSession(ss)
		d.leftSession(ss)
	}
	releaseSessLocked(a)
	a.dropPlainLocked()
	if s == gatewayv1.State_FAILED && msg == "" {
		msg = "processing failed"
	}
	d.setState(s, msg)
	d.closeClaimsLocked()
	d.env.m.finished.WithLabelValues(s.String()).Inc()
	d.env.m.running.Dec()
	d.env.log.Info("bridge: document finished", "doc", d.id, "state", s, "error", msg)
	d.env.kickFlush()
}
