package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// resultKind is how run left an entity.
type resultKind uint8

const (
	resultSucceeded resultKind = iota // output ready; caller sends result/COMPLETE
	resultFailed                      // FAILED sent, terminal
	resultSkipped                     // FAILED or ABANDONED sent, excluded by a SKIP action
	resultAbandoned                   // ABANDONED (or FAILED without Layer 2) sent
	resultDeferred                    // DEFERRED sent; redemption or expiry finishes it
	resultCancelled                   // the gateway cancelled it or the session ended; nothing sent
)

type result struct {
	kind resultKind
	out  *Output
}

// policyOf returns the completion policy governing e and whether it is
// final: the entity's own, else its profile document root's once known,
// else the draft defaults (not final while that root is still expected).
func (g *engine) policyOf(e *entity) (policy, bool) {
	// A plain child has no root header to inherit from: its own policy or
	// the draft defaults, final at once (plaindoc.go).
	if e.header.CompletionPolicy != nil || e.doc == nil || e.plain {
		return effectivePolicy(e.header.CompletionPolicy), true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.doc.root != nil {
		return effectivePolicy(e.doc.root.CompletionPolicy), true
	}
	return effectivePolicy(nil), false
}

// waitPolicy blocks until e's policy is final (the root envelope arrived).
func (g *engine) waitPolicy(e *entity) policy {
	p, ok := g.policyOf(e)
	if ok {
		return p
	}
	select {
	case <-e.doc.rootKnown:
		p, _ = g.policyOf(e)
	case <-e.ctx.Done():
	}
	return p
}

func (g *engine) rootMetaOf(e *entity) map[string]string {
	if e.doc == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.doc.root != nil {
		return e.doc.root.Metadata
	}
	return nil
}

// beginAttempt starts an attempt of e: a fresh attempt context (child of
// e.ctx) and the completion-policy timeout, measured from the attempt's
// first PROCESSING (for the first attempt, from the entity's). With
// shared, the first attempt runs on e.ctx itself (one context per entity
// instead of two): only when nothing but a terminal status can follow its
// timeout, its failure or a yield (singleAttempt), so the timeout may end
// e.ctx; ended tells that from the entity's own end.
func (g *engine) beginAttempt(e *entity, timeout time.Duration, first, shared bool) {
	e.mu.Lock()
	switch {
	case first && shared:
		e.shared = true
		e.actx, e.acancel = e.ctx, e.cancel
	default:
		if e.acancel != nil && e.actx != e.ctx {
			e.acancel(nil)
		}
		e.actx, e.acancel = context.WithCancelCause(e.ctx)
	}
	if !first {
		e.start = g.now()
	}
	e.mu.Unlock()
	g.armTimeout(e, timeout)
}

// singleAttempt reports whether policy p leaves nothing but a terminal
// status after a timeout, a failure or a yield of the first attempt: no
// retry, no deferral (Layer 2 off, or on-timeout and on-failure neither
// RETRY nor DEFER). Such an attempt may share the entity's context.
func (g *engine) singleAttempt(p policy) bool {
	if !g.neg.layer2 {
		return true
	}
	goesOn := func(a wire.FailureAction) bool { return a == wire.ActionRetry || a == wire.ActionDefer }
	return !goesOn(p.onTimeout) && !goesOn(p.onFailure)
}

// armTimeout (re)starts the timeout of e's current attempt; it cancels that
// attempt's context with errTimedOut (through the session's watch, one
// timer for all attempts). Before the first attempt it does nothing
// (beginAttempt arms it).
func (g *engine) armTimeout(e *entity, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	g.watch.remove(e)
	if e.done || e.acancel == nil {
		return
	}
	e.gen++
	g.watch.add(e, e.start.Add(d), e.gen)
}

// timeout cancels e's attempt gen with errTimedOut unless e is done or
// has started another attempt since (the watch calls it when the
// deadline passed). Under e.mu: settle and timeout decide atomically
// whether the attempt succeeded or timed out.
func (e *entity) timeout(gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done || e.gen != gen || e.acancel == nil {
		return
	}
	e.acancel(errTimedOut)
}

// settle ends e's timeout after its attempt succeeded. It reports false
// when the timeout came first: an attempt on the shared context cannot
// have its result sent once e.ctx is cancelled, so that attempt timed out
// (with a context of its own, a late timeout ends nothing but the
// attempt's context, and the success stands, as before).
func (g *engine) settle(e *entity) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shared && e.actx == e.ctx && e.ctx.Err() != nil {
		return false
	}
	e.done = true
	g.watch.remove(e)
	return true
}

// ended reports whether e's lifetime ended: the gateway cancelled it, or
// its session (or document) ended. The timeout of an attempt that shares
// e.ctx cancels e.ctx too, but does not end the entity: it still reports
// the timeout's outcome.
func (e *entity) ended() bool {
	if e.ctx.Err() == nil {
		return false
	}
	if !e.shared || context.Cause(e.ctx) != errTimedOut {
		return true
	}
	return e.gwCancelled.Load() || (e.parent != nil && e.parent.Err() != nil)
}

// attemptCtx is the context of e's current attempt (e.ctx outside one).
func (e *entity) attemptCtx() context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.actx != nil {
		return e.actx
	}
	return e.ctx
}

func (g *engine) stopTimer(e *entity) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.done = true
	g.watch.remove(e)
	if e.acancel != nil && e.actx != e.ctx { // a shared context ends with the entity
		e.acancel(nil)
	}
}

func (e *entity) stopClaimTimer() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.claimT != nil {
		e.claimT.Stop()
	}
}

// call runs fn on the bounded worker pool, turning a panic into an error.
func (g *engine) call(e *entity, fn func() (*Output, error)) (out *Output, err error) {
	ctx := e.attemptCtx()
	select { // a free worker without making ctx's Done channel
	case g.pool <- struct{}{}:
	default:
		select {
		case g.pool <- struct{}{}:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	defer func() { <-g.pool }()
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("processor %s panicked: %v", e.procName, r)
		}
	}()
	out, err = fn()
	if err == nil && out == nil {
		out = &Output{}
	}
	return out, err
}

// sleep waits d or until e's context ends.
func sleep(e *entity, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-e.ctx.Done():
		return false
	}
}

// permanent reports errors a retry cannot fix (limits, protocol errors).
func permanent(err error) bool {
	var pe *wire.Error
	return errors.As(err, &pe)
}

// errStall is returned by a processor (the fault processor's timeout
// action) that makes no progress until its attempt ends: run then waits
// for the attempt's timeout or cancel without holding a worker.
var errStall = errors.New("processor stalls until the attempt times out")

// run processes e after its PROCESSING was sent: the processor call with
// yields (Section 6.6.2), Layer 1 nesting, deferral, retries and timeouts
// per the completion policy (docs/profile.md 5, 6). On success it returns
// the output and sends nothing terminal; every other outcome's statuses are
// sent here.
func (g *engine) run(e *entity) result {
	defer g.stopTimer(e)
	p, final := g.policyOf(e)
	g.beginAttempt(e, p.timeout, true, final && e.doc == nil && g.singleAttempt(p))
	var resume []byte
	yields := 0
	for {
		actx := e.attemptCtx()
		in := &Input{Header: e.header, Payload: e.payload, Depth: e.depth, ChunkIndex: e.chunk,
			Attempt: e.attempts, Resume: resume, Yields: yields, Redeemed: e.redeemed, RootMeta: g.rootMetaOf(e)}
		in.MaxDepth = g.maxDepthFor(e.header.Metadata, in.RootMeta)
		out, err := g.call(e, func() (*Output, error) { return e.proc.Process(actx, in) })
		if errors.Is(err, errStall) {
			<-actx.Done() // the worker is free; the timeout timer ends the wait
		}
		if err == nil && out.Dehydrate != nil {
			out, err = g.nested(e, out)
		}
		if actx.Err() != nil {
			res, again := g.interrupted(e)
			if !again {
				return res
			}
			resume, yields = nil, 0
			continue
		}
		switch {
		case err != nil:
		case out.Yield != nil:
			resume, yields = g.yield(e, out.Yield), yields+1
			if actx.Err() != nil {
				res, again := g.interrupted(e)
				if !again {
					return res
				}
				resume, yields = nil, 0
			}
			continue
		case out.Defer != nil:
			return g.deferEntity(e, out.Defer.TTL)
		case g.settle(e):
			return result{kind: resultSucceeded, out: out}
		default: // timed out after all (shared context)
			res, again := g.interrupted(e)
			if !again {
				return res
			}
			resume, yields = nil, 0
			continue
		}
		res, again := g.failedAttempt(e, err)
		if !again {
			return res
		}
		resume, yields = nil, 0
	}
}

// failedAttempt decides what follows a failed attempt of e per its
// policy (docs/profile.md 5): a retry (again = true, the next attempt has
// begun), a deferral, or FAILED (SKIP excludes it from rehydration).
func (g *engine) failedAttempt(e *entity, err error) (res result, again bool) {
	g.log.Info("entity attempt failed", "entity", e.id, "scope", e.scope, "attempt", e.attempts, "code", wire.CodeOf(err), "err", err)
	p := g.waitPolicy(e)
	if e.ended() {
		return result{kind: resultCancelled}, false
	}
	switch {
	case p.onFailure == wire.ActionRetry && g.neg.layer2 && e.attempts < p.maxRetries && !permanent(err):
		if !g.retry(e, p) {
			return result{kind: resultCancelled}, false
		}
		return result{}, true
	case p.onFailure == wire.ActionDefer && g.neg.layer2 && !permanent(err):
		return g.deferEntity(e, 0), false
	}
	g.send(e, wire.StatusFailed, nil)
	if p.onFailure == wire.ActionSkip {
		return result{kind: resultSkipped}, false
	}
	return result{kind: resultFailed}, false
}

// retry reports FAILED, RETRYING, waits retry-delay-ms and starts the next
// attempt with PROCESSING. It returns false when e was cancelled.
func (g *engine) retry(e *entity, p policy) bool {
	e.mu.Lock()
	g.watch.remove(e) // the delay does not count against timeout-ms
	e.mu.Unlock()
	if !g.send(e, wire.StatusFailed, nil) || !g.send(e, wire.StatusRetrying, nil) {
		return false
	}
	if !sleep(e, p.retryDelay) {
		return false
	}
	e.attempts++
	g.log.Info("entity retrying", "entity", e.id, "attempt", e.attempts, "max_retries", p.maxRetries)
	if !g.send(e, wire.StatusProcessing, nil) {
		return false
	}
	g.beginAttempt(e, p.timeout, false, false)
	return true
}

// interrupted handles an ended attempt. A gateway cancel or session end
// sends nothing. A timeout applies on-timeout (docs/profile.md 5): RETRY
// (Layer 2, retries left) reports FAILED, RETRYING, PROCESSING and returns
// again = true; DEFER issues a claim check (DEFERRED); otherwise the entity
// is ABANDONED (FAILED without Layer 2), and SKIP excludes it from
// rehydration.
func (g *engine) interrupted(e *entity) (res result, again bool) {
	if e.ended() || context.Cause(e.attemptCtx()) != errTimedOut {
		return result{kind: resultCancelled}, false
	}
	p := g.waitPolicy(e)
	if e.ended() {
		return result{kind: resultCancelled}, false
	}
	g.log.Info("entity timed out", "entity", e.id, "scope", e.scope, "timeout", p.timeout, "on_timeout", p.onTimeout, "attempt", e.attempts)
	switch {
	case p.onTimeout == wire.ActionRetry && g.neg.layer2 && e.attempts < p.maxRetries:
		if !g.retry(e, p) {
			return result{kind: resultCancelled}, false
		}
		return result{}, true
	case p.onTimeout == wire.ActionDefer && g.neg.layer2:
		return g.deferEntity(e, 0), false
	}
	if g.neg.layer2 {
		g.send(e, wire.StatusAbandoned, nil)
	} else {
		g.send(e, wire.StatusFailed, nil)
	}
	if p.onTimeout == wire.ActionSkip {
		return result{kind: resultSkipped}, false
	}
	return result{kind: resultAbandoned}, false
}

// yield reports YIELDED with a Yield token, waits, verifies the token
// (session, entity, single use, state checksum) and resumes: PROCESSING. It
// returns the state to resume from, nil to restart from the beginning.
// Without Layer 2 the entity continues at once.
func (g *engine) yield(e *entity, y *YieldRequest) []byte {
	if !g.neg.layer2 {
		return y.State
	}
	tok := g.yields.issue(g.c.ID(), e.id, e.scope, y.State)
	if !g.send(e, wire.StatusYielded, wire.AppendYieldExt(nil, wire.YieldExtension{Reason: y.Reason, Token: tok})) {
		e.cancel(errSessionGone)
		return nil
	}
	g.log.Info("entity yielded", "entity", e.id, "reason", y.Reason)
	if !sleep(e, yieldResumeDelay) {
		return nil
	}
	st, err := g.yields.consume(tok, g.c.ID(), e.id, e.scope)
	if err != nil {
		// Section 10.6.1: reject the resumption, reprocess from the start.
		g.log.Warn("yield token rejected; reprocessing from the beginning", "entity", e.id, "err", err)
		st = nil
	}
	if !g.send(e, wire.StatusProcessing, nil) {
		e.cancel(errSessionGone)
	}
	return st
}

// deferEntity persists a claim check and reports DEFERRED with the Claim
// Check extension (Section 6.6.3). Without Layer 2 the entity FAILS.
func (g *engine) deferEntity(e *entity, ttl time.Duration) result {
	if !g.neg.layer2 {
		g.log.Info("defer needs Layer 2; failing the entity", "entity", e.id)
		g.send(e, wire.StatusFailed, nil)
		return result{kind: resultFailed}
	}
	if ttl <= 0 || ttl > g.lim.claimExpiry {
		ttl = g.lim.claimExpiry
	}
	g.stopTimer(e)
	rec := ClaimRecord{EntityID: e.id, ScopeID: e.scope, Chunk: e.chunk, SessionID: g.c.ID(),
		Expiry: g.now().Add(ttl), Processor: e.procName, Metadata: e.header.Metadata, Plain: e.plain}
	if e.doc != nil {
		rec.ParentID = e.doc.id
		g.mu.Lock()
		if e.doc.env != nil {
			rec.DocID = e.doc.env.DocID
		}
		g.mu.Unlock()
	} else if e.docID != "" {
		rec.DocID = e.docID
	}
	stored, err := g.claims.Issue(rec)
	if err != nil {
		g.log.Error("claim check not persisted; failing the entity", "entity", e.id, "err", err)
		g.send(e, wire.StatusFailed, nil)
		return result{kind: resultFailed}
	}
	g.mu.Lock()
	e.claim = stored
	e.payload = nil // the redemption carries the payload again
	g.deferred[e.id] = e
	g.mu.Unlock()
	ext := wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: stored.ID, ExpiryMicros: uint64(stored.Expiry.UnixMicro())})
	if !g.send(e, wire.StatusDeferred, ext) {
		return result{kind: resultCancelled}
	}
	// The claim is persisted and outlives the session: a shutdown does not
	// wait for it (docs/profile.md 7).
	if err := g.c.SetDetached(e.scope, e.id, true); err != nil {
		g.log.Debug("deferred entity not detached", "entity", e.id, "err", err)
	}
	g.log.Info("claim issued", "entity", e.id, "claim", stored.ID, "doc", stored.DocID, "expiry", stored.Expiry.UTC())
	e.mu.Lock()
	e.claimT = time.AfterFunc(ttl, func() { g.claimExpired(e, stored.ID) })
	e.mu.Unlock()
	return result{kind: resultDeferred}
}

// claimExpired abandons a DEFERRED entity whose claim was not redeemed in
// time (docs/profile.md 6).
func (g *engine) claimExpired(e *entity, id uint64) {
	ok, err := g.claims.Settle(id)
	if err != nil || !ok {
		return // redeemed first (or the store is closed)
	}
	g.mu.Lock()
	if g.deferred[e.id] == e {
		delete(g.deferred, e.id)
	}
	g.mu.Unlock()
	g.log.Info("claim expired; entity abandoned", "entity", e.id, "claim", id)
	g.send(e, wire.StatusAbandoned, nil)
	if e.doc != nil {
		g.childFinished(e, outcomeAbandoned, nil)
	}
}

// nested performs Layer 1 dehydration of e into out.Dehydrate (docs/profile.md
// 6): a new scope S, STATUS(e, DEHYDRATING) immediately followed by
// BARRIER(S, e, waiting) (Section 6.4: the barrier names e as the parent
// whose sub-tree S is, so the gateway attributes S without guessing),
// PROCESSING/COMPLETE per sub-entity at depth+1, SCOPE_DIGEST(S),
// BARRIER(S, e, released), REHYDRATING(e), then the processor's merge.
// Without Layer 1 the sub-entities are merged locally without any status.
func (g *engine) nested(e *entity, out *Output) (*Output, error) {
	subs := out.Dehydrate
	leaves := make([]*Output, len(subs))
	for i, s := range subs {
		leaves[i] = &Output{Data: s, ContentType: out.ContentType}
	}
	merge := func() (*Output, error) {
		return g.call(e, func() (*Output, error) { return e.proc.Rehydrate(e.attemptCtx(), leaves) })
	}
	if !g.neg.layer1 {
		return merge()
	}
	depth := e.depth + 1
	if depth > g.neg.maxDepth || depth > wire.MaxScopeDepth {
		return nil, wire.Errorf(wire.CodeDepthExceeded, "entity %d: nesting at depth %d exceeds max-scope-depth %d", e.id, depth, g.neg.maxDepth)
	}
	allowed := min(g.neg.maxPerScope, g.allowedChildren(uint64(len(e.payload))), uint64(wire.IDModulus)-1)
	if n := uint64(len(subs)); n > allowed {
		if _, ok := e.proc.(Concatenator); !ok || allowed == 0 {
			return nil, wire.Errorf(wire.CodeEntityTooLarge, "entity %d: %d sub-entities exceed max-entities-per-scope %d or %d children per MB",
				e.id, n, g.neg.maxPerScope, g.lim.childrenPerMB)
		}
		// A Concatenator's result is its sub-entities' bytes in order:
		// consecutive ones joined into one sub-entity give the same result,
		// so the entity splits into at most allowed larger sub-entities
		// instead of failing (docs/profile.md 6).
		subs = groupSubs(subs, allowed)
		leaves = leaves[:len(subs)]
		for i, s := range subs {
			leaves[i] = &Output{Data: s, ContentType: out.ContentType}
		}
		g.log.Debug("sub-entities grouped", "entity", e.id, "sub_entities", n, "groups", len(subs))
	}
	scope, ok := g.allocScope()
	if !ok {
		return nil, wire.Errorf(wire.CodeScopeInvalid, "entity %d: no free scope ID", e.id)
	}
	defer g.releaseScope(scope)
	barrier := wire.BarrierFrame{ScopeID: scope, ParentEntityID: e.id}
	// No other DEHYDRATING may come between e's and the barrier: the
	// gateway takes e's scope from the DEHYDRATING that precedes it.
	g.dehydMu.Lock()
	sent := g.send(e, wire.StatusDehydrating, nil)
	var berr error
	if sent {
		berr = g.c.SendBarrier(barrier)
	}
	g.dehydMu.Unlock()
	if !sent {
		return nil, errSessionGone
	}
	if berr != nil {
		return nil, fmt.Errorf("barrier of scope %d: %w", scope, berr)
	}
	g.log.Info("entity dehydrating", "entity", e.id, "scope", scope, "sub_entities", len(subs), "depth", depth)
	digestLeaves := make([]wire.Leaf, len(subs))
	for i := range subs {
		id := uint32(i + 1)
		for _, st := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
			if err := g.c.SendStatus(wire.StatusFrame{Status: st, Depth: uint8(depth), EntityID: id, ScopeID: scope}); err != nil {
				return nil, fmt.Errorf("sub-entity %d of scope %d: %w", id, scope, err)
			}
		}
		digestLeaves[i] = wire.Leaf{EntityID: id, Status: wire.StatusComplete}
	}
	n := uint64(len(subs))
	if err := g.c.SendScopeDigest(wire.ScopeDigestFrame{ScopeID: scope, Processed: n, Succeeded: n, MerkleRoot: wire.MerkleRoot(digestLeaves)}); err != nil {
		return nil, fmt.Errorf("scope digest %d: %w", scope, err)
	}
	barrier.Released = true
	if err := g.c.SendBarrier(barrier); err != nil {
		return nil, fmt.Errorf("barrier of scope %d: %w", scope, err)
	}
	if !g.send(e, wire.StatusRehydrating, nil) {
		return nil, errSessionGone
	}
	return merge()
}

// groupSubs joins consecutive sub-entities into at most n (n > 0), in
// order, none split: each group but the last holds at least
// ceil(total/n) bytes, so at most n groups are made.
func groupSubs(subs [][]byte, n uint64) [][]byte {
	total := 0
	for _, s := range subs {
		total += len(s)
	}
	target := max(1, (uint64(total)+n-1)/n)
	out := make([][]byte, 0, min(n, uint64(len(subs))))
	var cur []byte
	for _, s := range subs {
		cur = append(cur, s...)
		if uint64(len(cur)) >= target {
			out = append(out, cur)
			cur = nil
		}
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, cur)
	}
	return out
}

// allocScope returns an unused peer scope ID (sequential from 1, profile 2).
func (g *engine) allocScope() (uint32, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for range 1 << 16 {
		g.nextScope++
		if g.nextScope == 0 {
			g.nextScope = 1
		}
		if _, used := g.openScopes[g.nextScope]; !used {
			g.openScopes[g.nextScope] = struct{}{}
			return g.nextScope, true
		}
	}
	return 0, false
}

// releaseScope frees a scope whose digest was sent and whose entities are
// all terminal.
func (g *engine) releaseScope(s uint32) {
	g.mu.Lock()
	delete(g.openScopes, s)
	g.mu.Unlock()
}
