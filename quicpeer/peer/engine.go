package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/pipestream/gateway/quicpeer/assembly"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// conn is what the engine needs from a session; *quicpeer.Session
// satisfies it. Methods must be safe for concurrent use.
type conn interface {
	ID() string
	SendStatus(f wire.StatusFrame) error
	SendScopeDigest(f wire.ScopeDigestFrame) error
	SendBarrier(f wire.BarrierFrame) error
	SendEntity(ctx context.Context, h *wire.EntityHeader, payload io.Reader) error
	SetDetached(scope, id uint32, on bool) error
}

// negotiation is the part of the capability exchange the engine uses.
type negotiation struct {
	layer1, layer2 bool
	format         wire.Format
	maxDepth       int
	maxPerScope    uint64
	profile        bool // the client selected the profile (ALPN, docs/profile.md 1.1)
}

// core is shared by every session of a Server.
type core struct {
	procs  Processors
	claims *ClaimStore
	yields *yieldBook
	lim    resolvedLimits
	pool   chan struct{}
	budget *semaphore.Weighted // payload octets held in memory (params.go)
	work   string              // <data-dir>/work
	seq    atomic.Uint64       // names session and document spool dirs
	log    *slog.Logger
	now    func() time.Time
}

// errors used as context causes.
var (
	errTimedOut    = errors.New("completion-policy timeout-ms passed")
	errCancelled   = errors.New("cancelled by the gateway")
	errSessionGone = errors.New("session closed")
)

// engine is the processing state of one session (docs/profile.md 4-7).
type engine struct {
	*core
	c    conn
	neg  negotiation
	log  *slog.Logger
	work string // this session's spool dir under core.work

	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	watch  watch // completion-policy timeouts of running attempts

	mu             sync.Mutex
	docs           map[uint32]*doc     // dehydrated documents by root ID (scope 0)
	ready          *assembly.Tracker   // their manifests until rehydration (Section 9.6)
	jobs           map[uint32]*entity  // standalone roots and redemptions, for cancel
	deferred       map[uint32]*entity  // DEFERRED entities of this session by ID (scope 0)
	orphanDocs     int                 // docs known only through children
	orphanChildren int                 // children of such docs
	nextScope      uint32              // last allocated peer scope ID
	dehydMu        sync.Mutex          // keeps STATUS(E, DEHYDRATING) and its BARRIER adjacent (profile 6)
	openScopes     map[uint32]struct{} // peer scopes not yet closed
	closing        bool
}

func newEngine(parent context.Context, co *core, c conn, neg negotiation, log *slog.Logger) *engine {
	ctx, cancel := context.WithCancelCause(parent)
	work := filepath.Join(co.work, "s"+strconv.FormatUint(co.seq.Add(1), 10))
	return &engine{core: co, c: c, neg: neg, log: log, ctx: ctx, cancel: cancel, work: work, watch: watch{now: co.now},
		docs: map[uint32]*doc{}, ready: assembly.NewTracker(), jobs: map[uint32]*entity{}, deferred: map[uint32]*entity{}, openScopes: map[uint32]struct{}{}}
}

// close cancels all work of the session and waits for it.
func (g *engine) close(cause error) {
	g.mu.Lock()
	g.closing = true
	for _, e := range g.deferred {
		e.stopClaimTimer()
	}
	g.mu.Unlock()
	g.cancel(cause)
	g.watch.stop()
	g.wg.Wait()
	if err := os.RemoveAll(g.work); err != nil {
		g.log.Warn("session spool not removed", "dir", g.work, "err", err)
	}
}

// entity is one entity the peer processes (a root, a child, a redemption).
type entity struct {
	id, scope uint32
	depth     int
	header    *wire.EntityHeader
	payload   []byte
	chunk     int // chunk-index, -1 when not a dehydration child
	doc       *doc
	procName  string
	proc      Processor
	redeemed  bool
	plain     bool // no profile marker: raw payload, generic result (plain.go)
	// inputNoted: payload is this chunk's input as noted for the
	// document's content hash (spool.go noteInput).
	inputNoted bool
	claim      *ClaimRecord // set while DEFERRED
	docID      string       // PipeDoc doc-id of a standalone root

	ctx    context.Context // lifetime: document cancel, session end
	cancel context.CancelCauseFunc
	parent context.Context // ctx's parent
	// gwCancelled: the gateway cancelled the entity (also when its
	// shared attempt had timed out, which cancelled ctx first).
	gwCancelled atomic.Bool

	mu       sync.Mutex
	actx     context.Context         // current attempt, child of ctx (or ctx: shared); the timeout cancels it
	acancel  context.CancelCauseFunc // with errTimedOut
	shared   bool                    // the first attempt runs on ctx itself (beginAttempt)
	status   wire.Status             // last status sent by the peer (PENDING before)
	start    time.Time               // first PROCESSING of the current attempt
	gen      uint64                  // the attempt's timeout registration in the session's watch
	claimT   *time.Timer             // claim expiry while DEFERRED
	attempts int
	done     bool
}

// send reports a status of e unless e was cancelled by the gateway. It
// returns false when the frame could not be sent.
func (g *engine) send(e *entity, st wire.Status, ext []byte) bool {
	if e.gwCancelled.Load() || context.Cause(e.ctx) == errCancelled || (e.doc != nil && e.doc.isCancelled(g)) {
		return false
	}
	f := wire.StatusFrame{Status: st, Depth: uint8(e.depth), EntityID: e.id, ScopeID: e.scope, HasExt: ext != nil, Ext: ext}
	if err := g.c.SendStatus(f); err != nil {
		g.log.Debug("status not sent", "entity", e.id, "scope", e.scope, "status", st, "err", err)
		return false
	}
	e.mu.Lock()
	e.status = st
	e.mu.Unlock()
	return true
}

// readPayload reads a verified payload of at most limit octets. The caller
// has admitted payload-length octets into the payload budget, so the buffer
// is allocated once at that size (bounded by limit and the budget, never
// by an unchecked length field). A verification error comes from the
// session's reader (which aborts the stream and reports FAILED itself).
func (g *engine) readPayload(h *wire.EntityHeader, r io.Reader, limit int64) ([]byte, error) {
	if h.PayloadLength > uint64(limit) {
		return nil, wire.Errorf(wire.CodeEntityTooLarge, "entity %d: payload-length %d exceeds the peer's limit %d", h.EntityID, h.PayloadLength, limit)
	}
	return readPayloadInto(h, r, make([]byte, h.PayloadLength))
}

// envelopeBufs recycles the read buffers of small whole-document
// envelopes. The decoded blob may alias one (unwrap): the buffer goes
// back only once the entity's result is sent.
var envelopeBufs = sync.Pool{New: func() any { b := make([]byte, envelopeBufferBytes); return &b }}

// readPayloadInto reads exactly len(buf) verified payload octets of h into
// buf and checks that the payload ends there.
func readPayloadInto(h *wire.EntityHeader, r io.Reader, buf []byte) ([]byte, error) {
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	var one [1]byte // EOF is where the reader verifies length and SHA-256
	if n, err := r.Read(one[:]); n > 0 || err != io.EOF {
		if err == nil || err == io.EOF {
			err = wire.Errorf(wire.CodeEntityInvalid, "entity %d: payload is longer than payload-length %d", h.EntityID, h.PayloadLength)
		}
		return nil, err
	}
	return buf, nil
}

// reject aborts an entity stream with code and reports FAILED for it
// (docs/profile.md 7: stream-level problems abort the stream and emit a
// terminal status).
func (g *engine) reject(h *wire.EntityHeader, abort func(wire.ErrorCode), code wire.ErrorCode, why string) {
	g.log.Warn("entity rejected", "entity", h.EntityID, "code", code, "reason", why)
	if abort != nil {
		abort(code)
	}
	if code == wire.CodeNoError {
		return // cancelled or finished document: the abort is the answer
	}
	g.mu.Lock()
	_, deferred := g.deferred[h.EntityID]
	g.mu.Unlock()
	if deferred && scopeOf(h) == 0 {
		return // a bad redemption must not fail the entity still waiting for its claim
	}
	f := wire.StatusFrame{Status: wire.StatusFailed, EntityID: h.EntityID, ScopeID: scopeOf(h)}
	if err := g.c.SendStatus(f); err != nil {
		g.log.Debug("status not sent", "entity", h.EntityID, "status", wire.StatusFailed, "err", err)
	}
}

func scopeOf(h *wire.EntityHeader) uint32 {
	if h.ScopeID != nil {
		return *h.ScopeID
	}
	return 0
}

// maxDepthFor is Input.MaxDepth: -1 without Layer 1, else the negotiated
// max-scope-depth lowered by pipestream.max-depth.
func (g *engine) maxDepthFor(md, rootMD map[string]string) int {
	if !g.neg.layer1 {
		return -1
	}
	d := g.neg.maxDepth
	s := md[MetaMaxDepth]
	if s == "" {
		s = rootMD[MetaMaxDepth]
	}
	if s != "" {
		if v, err := strconv.Atoi(s); err == nil && v >= 0 && v < d {
			d = v
		}
	}
	return d
}

// allowedChildren is the amplification bound of Section 10.4 for a parent
// of size bytes.
func (g *engine) allowedChildren(size uint64) uint64 {
	size = max(size, amplificationFloorBytes)
	return uint64(g.lim.childrenPerMB) * size / (1 << 20)
}

// HandleEntity dispatches one incoming entity stream (runs on the
// session's per-stream goroutine).
func (g *engine) handleEntity(h *wire.EntityHeader, payload io.Reader, abort func(wire.ErrorCode)) {
	g.wg.Add(1)
	defer g.wg.Done()
	if g.ctx.Err() != nil {
		abort(wire.CodeNoError)
		return
	}
	if !isProfile(h) {
		g.plainEntity(h, payload, abort)
		return
	}
	switch {
	case h.Metadata[MetaClaimID] != "":
		g.redeem(h, payload, abort)
	case h.ParentID != nil:
		if scopeOf(h) != 0 {
			g.reject(h, abort, wire.CodeScopeInvalid, "children of gateway dehydration must be in scope 0")
			return
		}
		g.child(h, payload, abort)
	case h.Metadata[MetaTotalChunks] != "":
		g.dehydratedRoot(h, payload, abort)
	default:
		g.standalone(h, payload, abort, false)
	}
}

// newEntity prepares an entity bound to parent's context.
func (g *engine) newEntity(parent context.Context, h *wire.EntityHeader, procMD map[string]string) (*entity, error) {
	name, proc, err := g.procs.lookup(procMD)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(parent)
	return &entity{id: h.EntityID, scope: scopeOf(h), header: h, chunk: -1, procName: name, proc: proc,
		ctx: ctx, cancel: cancel, parent: parent, status: wire.StatusPending, start: g.now()}, nil
}

// decodeEnvelope decodes and checks the PipeDoc of root h (Section 7).
func (g *engine) decodeEnvelope(h *wire.EntityHeader, b []byte) (*wire.PipeDoc, error) {
	return g.decodeEnvelopeShared(h, b, false)
}

// decodeEnvelopeShared is decodeEnvelope whose blob may alias b when
// shared is set.
func (g *engine) decodeEnvelopeShared(h *wire.EntityHeader, b []byte, shared bool) (*wire.PipeDoc, error) {
	var env *wire.PipeDoc
	var err error
	if shared {
		env, err = wire.UnmarshalPipeDocShared(wire.CodecFor(g.neg.format), b)
	} else {
		env, err = wire.CodecFor(g.neg.format).UnmarshalPipeDoc(b)
	}
	if err != nil {
		return nil, fmt.Errorf("root entity %d: PipeDoc envelope: %w", h.EntityID, err)
	}
	if env.EntityID != h.EntityID {
		return nil, wire.Errorf(wire.CodeEntityInvalid, "root entity %d: PipeDoc entity-id %d does not match the header", h.EntityID, env.EntityID)
	}
	return env, nil
}

// standalone processes an entity 1:1: a profile document sent whole
// (docs/profile.md 4.1), whose payload is the PipeDoc envelope, or a plain
// entity (plain.go), whose payload is the content: PROCESSING -> result
// stream -> COMPLETE, or a failure outcome.
func (g *engine) standalone(h *wire.EntityHeader, payload io.Reader, abort func(wire.ErrorCode), plain bool) {
	e, err := g.newEntity(g.ctx, h, h.Metadata)
	if err != nil {
		g.reject(h, abort, wire.CodeEntityInvalid, err.Error())
		return
	}
	defer e.cancel(nil)
	e.plain = plain
	g.track(e)
	defer g.untrack(e)
	if h.PayloadLength > uint64(g.lim.maxEntityBytes) {
		g.reject(h, abort, wire.CodeEntityTooLarge, fmt.Sprintf("payload-length %d exceeds the peer's whole-document limit %d", h.PayloadLength, g.lim.maxEntityBytes))
		return
	}
	held, err := g.admitted(e.ctx, h.PayloadLength)
	if err != nil {
		abort(wire.CodeNoError)
		return
	}
	defer g.budget.Release(held)
	// Per-entity arrival and success are Debug (formatting a line costs
	// microseconds per entity at churn rates); failures stay at Info.
	if g.log.Enabled(e.ctx, slog.LevelDebug) {
		g.log.Debug("entity received", "entity", e.id, "kind", "root", "plain", plain, "processor", e.procName, "bytes", h.PayloadLength)
	}
	g.send(e, wire.StatusProcessing, nil)
	var raw []byte
	pooled := h.PayloadLength <= envelopeBufferBytes
	if pooled {
		bp := envelopeBufs.Get().(*[]byte)
		defer envelopeBufs.Put(bp)
		raw, err = readPayloadInto(h, payload, (*bp)[:h.PayloadLength])
	} else {
		raw, err = g.readPayload(h, payload, g.lim.maxEntityBytes)
	}
	if err != nil {
		g.payloadFailed(e, abort, err)
		return
	}
	if !g.unwrap(e, raw) {
		return
	}
	res := g.run(e)
	g.finishStandalone(e, res, e.docID)
}

// track registers a standalone entity for cancellation by the client;
// untrack deregisters it.
func (g *engine) track(e *entity) {
	g.mu.Lock()
	g.jobs[e.id] = e
	g.mu.Unlock()
}

func (g *engine) untrack(e *entity) {
	g.mu.Lock()
	if g.jobs[e.id] == e {
		delete(g.jobs, e.id)
	}
	g.mu.Unlock()
}

// unwrap sets e's payload from its verified raw payload: the content
// itself for a plain entity, the blob of the PipeDoc envelope for a
// profile document (FAILED when it does not decode). The blob aliases
// raw where the codec allows it (no copy): raw, pooled or not, is held
// until the entity's result is sent, as a plain entity's payload is, and
// a deferral drops the payload (the redemption carries it again).
func (g *engine) unwrap(e *entity, raw []byte) bool {
	if e.plain {
		e.payload = raw
		return true
	}
	env, err := g.decodeEnvelopeShared(e.header, raw, true)
	if err != nil {
		g.log.Warn("entity failed", "entity", e.id, "err", err)
		g.send(e, wire.StatusFailed, nil)
		return false
	}
	e.payload, e.docID = env.Blob, env.DocID
	return true
}

// payloadFailed handles a payload that could not be read or verified.
func (g *engine) payloadFailed(e *entity, abort func(wire.ErrorCode), err error) {
	var pe *wire.Error
	if errors.As(err, &pe) && pe.Code == wire.CodeEntityTooLarge {
		g.reject(e.header, abort, pe.Code, err.Error())
		return
	}
	// Integrity and length errors: the session aborted the stream and
	// reported FAILED (quicpeer.Handler contract); nothing is committed.
	g.log.Warn("entity payload rejected", "entity", e.id, "code", wire.CodeOf(err), "err", err)
}

// finishStandalone sends the result and the terminal status of an entity
// that is not part of a document the peer rehydrates.
func (g *engine) finishStandalone(e *entity, res result, docID string) {
	switch res.kind {
	case resultSucceeded:
		if e.plain {
			g.finishPlain(e, res.out, docID)
			return
		}
		if g.completeInline(e, res.out, docID) {
			return
		}
		if err := g.sendResult(e.ctx, e.id, res.out, nil, e.plain); err != nil {
			g.log.Warn("result not sent", "entity", e.id, "err", err)
			g.send(e, wire.StatusFailed, nil)
			return
		}
		if g.send(e, wire.StatusComplete, nil) {
			g.logFinished(e.ctx, e.id, docID, wire.StatusComplete, len(res.out.Data))
		}
	case resultDeferred, resultCancelled:
	default:
		g.log.Info("entity finished", "entity", e.id, "doc", docID, "status", e.lastStatus())
	}
}

// logFinished logs "entity finished" for a document that completed, at
// Debug: one line per document at churn rates cost ~3% of a small
// document's CPU at Info (the gateway records each document's outcome
// itself; failures, retries, timeouts and claims stay at Info). Typed
// attributes, no boxing, nothing at all below the logger's level.
func (g *engine) logFinished(ctx context.Context, id uint32, docID string, st wire.Status, n int) {
	if !g.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	g.log.LogAttrs(ctx, slog.LevelDebug, "entity finished", slog.Uint64("entity", uint64(id)), slog.String("doc", docID),
		slog.String("status", st.String()), slog.Int("bytes", n))
}

func (e *entity) lastStatus() wire.Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status
}

// sendResult sends out as the result of entity id on a server-initiated
// unidirectional stream (docs/profile.md 4.3; the generic form for a plain
// entity).
func (g *engine) sendResult(ctx context.Context, id uint32, out *Output, counts *[2]int, plain bool) error {
	sum := sha256.Sum256(out.Data)
	h := resultHeaderFor(plain, id, out.ContentType, out.Layer, uint64(len(out.Data)), sum[:], counts)
	return g.c.SendEntity(ctx, h, bytes.NewReader(out.Data))
}

// handleStatus reacts to statuses the gateway sends (docs/profile.md 4.2, 7)
// and to the client's cursor updates (plaindoc.go).
func (g *engine) handleStatus(f wire.StatusFrame) {
	if f.EntityID == wire.ConnectionEntity {
		if f.HasCursor {
			g.dropOrphansBehind(f.Cursor)
		}
		return // heartbeat / cursor update; the peer keeps no state behind the cursor
	}
	if f.ScopeID != 0 {
		return
	}
	switch f.Status {
	case wire.StatusDehydrating:
		g.dehydrating(f.EntityID)
	case wire.StatusAbandoned, wire.StatusFailed:
		g.cancelled(f)
	}
}

// dehydrating handles STATUS(R, DEHYDRATING): R's document is announced
// (profile 4.2 step 1; a plain parent, plaindoc.go).
func (g *engine) dehydrating(id uint32) {
	g.mu.Lock()
	d := g.docFor(id)
	var ready []*doc
	var failed *doc
	if d != nil && !d.dehydrating {
		d.dehydrating = true
		g.unorphan(d)
		failed = g.failBrokenLocked(d)
		g.sealLocked(d)
		ready = g.popReadyLocked()
	}
	g.mu.Unlock()
	if failed != nil {
		g.failPlainRoot(failed)
	}
	for _, r := range ready {
		g.spawn(func() { g.rehydrate(r) })
	}
}

// cancelled handles the client's FAILED or ABANDONED for a root: its
// document or standalone entity stops (profile 7).
func (g *engine) cancelled(f wire.StatusFrame) {
	g.mu.Lock()
	d := g.docs[f.EntityID]
	j := g.jobs[f.EntityID]
	if d != nil {
		d.cancelled = true
		g.unorphan(d)
		delete(g.docs, f.EntityID)
		g.ready.Remove(docKey(d))
	}
	g.mu.Unlock()
	if d != nil {
		d.cancel(errCancelled)
		g.log.Info("document cancelled by the gateway", "entity", f.EntityID, "status", f.Status)
	}
	if j != nil {
		j.gwCancelled.Store(true)
		j.cancel(errCancelled)
		g.log.Info("entity cancelled by the gateway", "entity", f.EntityID, "status", f.Status)
	}
}
