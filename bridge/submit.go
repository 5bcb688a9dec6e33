package bridge

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/internal/split"
	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
)

// Submit stores an inline document durably (its content committed inline
// with the record when it is small, else the spool fsynced first), then
// queues it for dispatch.
func (b *Bridge) Submit(ctx context.Context, t Tenant, req *gatewayv1.SubmitDocumentRequest) (*gatewayv1.Document, error) {
	if req == nil || len(req.GetContent()) == 0 {
		return nil, invalidf("content is empty; send the document bytes in content")
	}
	return b.Upload(ctx, t, optionsOf(req), bytes.NewReader(req.GetContent()))
}

// Upload streams content from r into the spool and, for dehydrated
// documents, pipelines the chunks to the peer while reading (profile 4.2).
// A whole document of up to maxStoredInline octets gets no spool file: its
// content is committed inline with the record (content.go). It returns once
// the content and the record are durable.
func (b *Bridge) Upload(ctx context.Context, t Tenant, opts *gatewayv1.SubmitOptions, r io.Reader) (*gatewayv1.Document, error) {
	p, err := newPlan(opts)
	if err != nil {
		return nil, err
	}
	if err := b.checkPeersTake(p); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closing {
		b.mu.Unlock()
		return nil, fmt.Errorf("the gateway is shutting down; retry on another instance: %w", ErrUnavailable)
	}
	b.uploads.Add(1)
	b.mu.Unlock()
	defer b.uploads.Done()

	id := newDocID()
	u := &upload{b: b, p: p, d: b.newDocRun(id, t, p)}
	doc, err := u.run(ctx, r)
	if err != nil {
		if u.pf != nil {
			u.pf.Abort()
		}
		u.abandon()
		return nil, err
	}
	return doc, nil
}

// checkPeersTake refuses a document that needs entity metadata
// (plan.needsMetadata) when every configured peer is draft-04, whose
// entity headers carry none: no peer could ever run it as asked. (A peer
// of framing auto found to speak draft-04 is not refused here: its
// documents wait for a peer that receives metadata, superviseWaitLocked.)
func (b *Bridge) checkPeersTake(p *plan) error {
	need := p.needsMetadata()
	if need == "" {
		return nil
	}
	for _, pc := range b.peers {
		if pc.mode != quicpeer.FramingDraft04 {
			return nil
		}
	}
	return fmt.Errorf("%s is sent to the PipeStream peer as entity metadata, and every configured peer speaks draft-04, whose entity headers carry none (docs/profile.md 9.3): submit without it, or configure a draft-02 peer: %w", need, ErrFailedPrecondition)
}

// newDocRun builds the runtime state of a new document.
func (b *Bridge) newDocRun(id string, t Tenant, p *plan) *docRun {
	now := timestamppb.Now()
	o := p.opts
	doc := &gatewayv1.Document{
		Name: "documents/" + id, Id: id, State: gatewayv1.State_PENDING, ContentType: o.ContentType,
		DisplayName: o.DisplayName, RequestId: o.RequestId, Split: o.Split, CompletionPolicy: o.CompletionPolicy,
		Metadata: o.Metadata, CreateTime: now, UpdateTime: now,
		Rev: 1, // the creation; see addEvent
	}
	d := &docRun{
		env: b.docEnv, id: id, tenant: t, plan: p, rec: &store.DocumentRecord{Tenant: string(t), Doc: doc},
		out: newOutbox(), claims: map[string]*claimRun{}, preRedeem: map[int64]string{},
	}
	d.att = idleAttempt(d, 0)
	return d
}

// upload is one Upload in progress.
type upload struct {
	b      *Bridge
	p      *plan
	pf     store.PayloadWriter // nil until spool creates it
	inline []byte              // the whole content when it is committed inline
	d      *docRun
	pipe   *pipe // nil unless chunks are pipelined to the peer
}

// spool creates the spool file on first use.
func (u *upload) spool() (store.PayloadWriter, error) {
	if u.pf == nil {
		pf, err := u.b.st.CreatePayload(u.b.ctx, u.d.id, store.PayloadContent)
		if err != nil {
			return nil, fmt.Errorf("create spool: %w", err)
		}
		u.pf = pf
	}
	return u.pf, nil
}

func (u *upload) run(ctx context.Context, r io.Reader) (*gatewayv1.Document, error) {
	b, p := u.b, u.p
	limit := b.opts.MaxDocumentBytes
	if p.strategy == gatewayv1.SplitStrategy_SPLIT_NONE {
		limit = min(limit, maxWholeBytes)
	}
	lr := &limitReader{r: r, left: limit + 1}
	tooLarge := func() error {
		if p.strategy == gatewayv1.SplitStrategy_SPLIT_NONE && limit < b.opts.MaxDocumentBytes {
			return fmt.Errorf("document exceeds %d bytes, the limit for split strategy SPLIT_NONE (sent whole); choose a split strategy: %w", limit, ErrTooLarge)
		}
		return fmt.Errorf("document exceeds the limit of %d bytes (MaxDocumentBytes): %w", limit, ErrTooLarge)
	}
	// Decide whole vs dehydrated: peek up to the inline threshold.
	whole := p.strategy == gatewayv1.SplitStrategy_SPLIT_NONE
	src := io.Reader(lr)
	var peek []byte
	if p.strategy == gatewayv1.SplitStrategy_SPLIT_STRATEGY_UNSPECIFIED {
		// The peek grows with the content (one allocation when the size
		// is known, as for Submit): a 4 KiB Submit does not allocate
		// InlineThreshold+1 octets (docs/performance.md).
		var err error
		peek, err = readUpTo(lr, int(b.opts.InlineThreshold+1), sizeHint(r))
		if err != nil {
			return nil, u.readErr(err, lr, tooLarge)
		}
		whole = int64(len(peek)) <= b.opts.InlineThreshold
		src = io.MultiReader(bytes.NewReader(peek), lr)
	}
	var size int64
	var sum [32]byte
	if whole && peek != nil && len(peek) <= maxStoredInline {
		// The peek is all of it (whole: r hit EOF below the threshold).
		if lr.exceeded() {
			return nil, tooLarge()
		}
		u.inline = peek
		size, sum = int64(len(peek)), sha256.Sum256(peek)
	} else if whole {
		var err error
		size, sum, err = u.readWhole(src, lr, tooLarge)
		if err != nil {
			return nil, err
		}
	} else {
		var err error
		size, sum, err = u.dehydrate(ctx, src, lr, tooLarge)
		if err != nil {
			return nil, err
		}
	}
	if size == 0 {
		return nil, invalidf("the document is empty; upload at least one byte")
	}
	b.m.bytesIn.Add(float64(size))
	if u.pf != nil {
		if err := u.pf.Sync(); err != nil {
			return nil, fmt.Errorf("fsync spool: %w", err)
		}
	}
	return u.commit(ctx, size, sum)
}

// readWhole reads a document sent whole: up to maxStoredInline octets stay
// in memory (u.inline, committed with the record), more go to the spool.
func (u *upload) readWhole(src io.Reader, lr *limitReader, tooLarge func() error) (int64, [32]byte, error) {
	head, err := io.ReadAll(io.LimitReader(src, maxStoredInline+1))
	if err != nil {
		return 0, [32]byte{}, u.readErr(err, lr, tooLarge)
	}
	if lr.exceeded() {
		return 0, [32]byte{}, tooLarge()
	}
	if len(head) <= maxStoredInline {
		u.inline = head
		return int64(len(head)), sha256.Sum256(head), nil
	}
	pf, err := u.spool()
	if err != nil {
		return 0, [32]byte{}, err
	}
	h := sha256.New()
	h.Write(head)
	if _, err := pf.Write(head); err != nil {
		return 0, [32]byte{}, fmt.Errorf("write spool: %w", err)
	}
	n, err := io.Copy(io.MultiWriter(pf, h), src)
	if err != nil {
		return 0, [32]byte{}, u.readErr(err, lr, tooLarge)
	}
	if lr.exceeded() {
		return 0, [32]byte{}, tooLarge()
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return int64(len(head)) + n, sum, nil
}

func (u *upload) readErr(err error, lr *limitReader, tooLarge func() error) error {
	if lr.exceeded() {
		return tooLarge()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("reading the upload: %w", err)
}

// dehydrate cuts src into chunks, writes each to the spool and, when a
// session is up, hands it to the pipelined sender.
func (u *upload) dehydrate(ctx context.Context, src io.Reader, lr *limitReader, tooLarge func() error) (int64, [32]byte, error) {
	sp, err := split.New(src, u.p.splitStrategy(), u.p.chunkBytes)
	if err != nil {
		return 0, [32]byte{}, err
	}
	pf, err := u.spool()
	if err != nil {
		return 0, [32]byte{}, err
	}
	u.pipe = u.d.startPipe()
	bufs := [2][]byte{}
	for i := 0; ; i++ {
		// Two buffers alternate: the pipe's consumer takes chunk i only after
		// it finished sending chunk i-1, so the buffer of i-1 is free again.
		c, err := sp.Next(bufs[i%2])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, [32]byte{}, u.readErr(err, lr, tooLarge)
		}
		if lr.exceeded() {
			return 0, [32]byte{}, tooLarge()
		}
		bufs[i%2] = c.Data[:0]
		if _, err := pf.Write(c.Data); err != nil {
			return 0, [32]byte{}, fmt.Errorf("write spool: %w", err)
		}
		if u.pipe != nil {
			u.pipe.put(ctx, c)
		}
	}
	if lr.exceeded() {
		return 0, [32]byte{}, tooLarge()
	}
	if u.pipe != nil {
		u.pipe.endChunks(sp)
	}
	return int64(sp.BytesRead()), sp.Sum(), nil
}

// commit records the document durably (idempotently for a request id) and
// hands it to the dispatcher.
func (u *upload) commit(ctx context.Context, size int64, sum [32]byte) (*gatewayv1.Document, error) {
	b, d := u.b, u.d
	if testHookBeforeCreateCommit != nil {
		testHookBeforeCreateCommit(b, d)
	}
	if u.mayRideCreate() {
		return u.commitRiding(ctx, size, sum)
	}
	d.lock()
	batch, snapRev, _ := u.takeCreateLocked(size, sum, false)
	d.unlock()
	res, err := b.commit(ctx, batch)
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("requestId %q was used before with a different body or options; use a new requestId: %w",
				d.rec.Doc.GetRequestId(), ErrConflict)
		}
		return nil, fmt.Errorf("commit document: %w", err)
	}
	if res.Duplicate != nil {
		if u.pf != nil {
			u.pf.Abort()
		}
		u.abandon()
		_ = b.st.RemovePayload(ctx, d.id, store.PayloadContent)
		return b.publicDoc(res.Duplicate), nil
	}
	d.lock()
	d.committed = true
	d.persistedRev = snapRev
	d.uploading = false
	b.mu.Lock()
	b.docs[d.id] = d // a new id (newDocID): nothing else holds it
	b.mu.Unlock()
	b.m.running.Inc()
	pipelined := u.pipe != nil && u.pipe.alive() && d.sess() != nil
	if !pipelined {
		if u.pipe != nil {
			u.pipe.stop()
		}
		if d.sess() == nil {
			d.enqueueLocked()
		}
	}
	out := b.publicDoc(&store.DocumentRecord{Tenant: string(d.tenant), Doc: d.snapshot().Doc})
	d.unlock()
	if pipelined {
		u.pipe.finish(size, sum)
	}
	b.kickFlush()
	return out, nil
}

// takeCreateLocked fills in what the upload learnt (size, checksum, where
// the content lives) and builds the Create batch: the record, the creation
// event and the inline content, then the changes made before the commit,
// taken from the outbox by the same path as every flush
// (takeChangesLocked). A failed Create puts nothing back: the upload fails
// and the document is abandoned. Changes made while the batch commits
// (committing) wait in the outbox for the first flush. It returns the
// batch, the revision it commits and the changes it took. riding: the
// document was dispatched before this commit (ridecreate.go). Caller
// holds mu.
func (u *upload) takeCreateLocked(size int64, sum [32]byte, riding bool) (*store.Batch, uint64, outbox) {
	b, d := u.b, u.d
	if !riding { // a riding document's content was noted before its dispatch
		u.noteContentLocked(size, sum)
	}
	if d.inline && !riding {
		b.mu.Lock()
		queued := len(b.queue)
		b.mu.Unlock()
		if queued < maxHeldContentQueue {
			d.content = u.inline
		}
	}
	rec := d.snapshot()
	// The creation is rev 1 (state PENDING, since 0); every change made
	// before this commit follows it as its own event (addEvent).
	batch := &store.Batch{Create: rec, Events: make([]store.EventAppend, 0, 1+len(d.out.events))}
	batch.Events = append(batch.Events, store.EventAppend{Tenant: string(d.tenant), Event: &gatewayv1.Event{
		Kind: kindDocument, DocumentId: d.id, State: gatewayv1.State_PENDING, Rev: 1, Since: 0, Time: rec.Doc.CreateTime,
	}})
	if d.inline && !d.terminal() {
		// A finished document (its creation rode with its result,
		// ridecreate.go) is never sent again: its content is not kept.
		batch.Payloads = []store.PayloadRecord{{DocID: d.id, Kind: store.PayloadContent, Body: u.inline}}
	}
	took := d.takeChangesLocked(batch)
	d.committing = true
	return batch, rec.Doc.Rev, took
}

// noteContentLocked records what the upload learnt about the content
// (size, checksum, where it lives): every send reads it. Caller holds
// d's lock.
func (u *upload) noteContentLocked(size int64, sum [32]byte) {
	d := u.d
	d.size, d.sum = size, sum
	doc := d.rec.Doc
	doc.SizeBytes = uint64(size)
	doc.Checksum = hex.EncodeToString(sum[:])
	if d.rec.Doc.GetRequestId() != "" {
		// Only a request id is ever checked against it (store.Batch).
		d.rec.BodyHash = u.p.bodyHash(sum)
	}
	d.inline = u.inline != nil
	d.rec.ContentPayload = !d.inline
}

// testHookBeforeCreateCommit, when set by a test, runs before an upload
// builds its Create batch (to let peer statuses arrive first).
var testHookBeforeCreateCommit func(*Bridge, *docRun)

// abandon drops an upload that will not be committed: stop the pipelined
// attempt and tell the peer to drop the root.
func (u *upload) abandon() {
	b, d := u.b, u.d
	d.lock()
	defer d.unlock()
	if u.pipe != nil {
		u.pipe.stop()
	}
	a := d.att
	if ss := d.sess(); ss != nil {
		if !d.leaveSession(ss) {
			b.sendCancelLocked(ss, d)
		}
	}
	releaseSessLocked(a)
	a.ended = true
	a.stopSending()
}

// publicDoc names a stored document for the API.
func (b *Bridge) publicDoc(r *store.DocumentRecord) *gatewayv1.Document {
	doc := proto.Clone(r.Doc).(*gatewayv1.Document)
	doc.Name = "documents/" + doc.Id
	for _, c := range doc.ClaimChecks {
		c.Name = "claims/" + c.ClaimId
	}
	return doc
}

// newDocID returns a time-ordered random id: 12 hex digits of Unix
// milliseconds, then 16 hex digits of randomness ([0-9a-f], file-name safe).
func newDocID() string {
	var b [14]byte
	ms := uint64(time.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	_, _ = rand.Read(b[6:])
	return hex.EncodeToString(b[:])
}

// sizeHint is how many octets r will yield when it says so (a
// *bytes.Reader: Submit's content), else 0; it only sizes a first buffer.
func sizeHint(r io.Reader) int {
	if br, ok := r.(*bytes.Reader); ok {
		return br.Len()
	}
	return 0
}

// limitReader reads at most left bytes and remembers when r had more.
type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// exceeded reports whether more than the limit was read.
func (l *limitReader) exceeded() bool { return l.left <= 0 }
