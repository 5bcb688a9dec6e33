package quicpeer

import (
	"github.com/pipestream/gateway/quicpeer/wire"
)

// entState is one endpoint's view of one (scope, entity), built from the
// statuses it sent and received (docs/profile.md section 3).
type entState struct {
	st         wire.Status
	parent     uint32 // parent-id from an entity header; 0 when unknown
	maxRetries int16  // retry budget of its completion policy; -1 unknown
	retries    uint16 // RETRYING transitions seen
	localTerm  bool   // this endpoint's own last status was terminal (race rule)
	lastLocal  bool   // the last status applied was this endpoint's own
	// detached: excluded from the GOAWAY drain until its next status
	// (Session.SetDetached; a DEFERRED entity whose claim outlives the session).
	detached bool
	// unres caches "not resolved" as last computed when the entry was
	// stored (root scope only); tracker.unresolvedRoot counts these flags.
	unres bool
}

// tracker holds every entity state of a session. All methods need the
// session mutex.
type tracker struct {
	client         bool
	layer1, layer2 bool
	maxDepth       int
	perScope       uint64
	scopes         map[uint32]map[uint32]entState
	// depth of each Layer 1 scope, learned from its statuses, so that a
	// FAILED reported for an aborted stream carries the right D field.
	depth map[uint32]uint8
	// ids is the root-scope ID space (client role, Section 9.1).
	ids *wire.IDSpace
	// peerCursor is the client's cursor as last announced (server role):
	// root-scope state behind it is forgotten.
	peerCursor uint32
	// peerCursorSeen: the client has moved peerCursor.
	peerCursorSeen bool
	// anchor: the lowest root ID a draft-04 client used before it
	// announced a cursor (anchorPeerCursor).
	anchor   uint32
	anchored bool
	// window is the client's root window, min(max-window,
	// max-entities-per-scope); unresolvedRoot counts the root-scope entries
	// whose cached unres flag is set (receive-side window, Section 10.3).
	window         uint64
	unresolvedRoot int
	// rootResolutions counts root-scope entries that went from unresolved
	// to resolved (or were forgotten unresolved behind the cursor); it only
	// grows, so the window check can tell whether room was made since.
	rootResolutions uint64
}

func newTracker(client bool, n Negotiated) *tracker {
	t := &tracker{
		client:     client,
		layer1:     n.Layer1,
		layer2:     n.Layer2,
		maxDepth:   n.MaxDepth,
		perScope:   n.MaxPerScope,
		scopes:     map[uint32]map[uint32]entState{0: {}},
		depth:      map[uint32]uint8{},
		peerCursor: 1,
		window:     min(uint64(n.MaxWindow), n.MaxPerScope),
	}
	if client {
		// Root-scope entities in flight are bounded by the window and by
		// max-entities-per-scope, whichever is smaller.
		t.ids = wire.NewIDSpace(uint32(min(uint64(n.MaxWindow), n.MaxPerScope)))
	}
	return t
}

// budgetOf is the retry budget a completion policy gives (Section 8.3):
// max-retries (default 3) when on-failure or on-timeout is RETRY, else none.
func budgetOf(p *wire.CompletionPolicy) int16 {
	if p == nil {
		return -1
	}
	retryOnFailure := p.OnFailure != nil && *p.OnFailure == wire.ActionRetry
	retryOnTimeout := p.OnTimeout != nil && *p.OnTimeout == wire.ActionRetry // docs/profile.md 5
	if !retryOnFailure && !retryOnTimeout {
		return 0
	}
	if p.MaxRetries == nil {
		return 3
	}
	return int16(min(*p.MaxRetries, 1<<14))
}

// retriesLeft reports whether a FAILED entity may still move to RETRYING:
// only with Layer 2, and only while its policy (or its parent's) leaves
// retries (Section 6.2.3 notes, 9.1).
func (t *tracker) retriesLeft(scope uint32, e entState) bool {
	if !t.layer2 {
		return false
	}
	b := e.maxRetries
	if b < 0 && e.parent != 0 {
		if p, ok := t.scopes[scope][e.parent]; ok {
			b = p.maxRetries
		} else if p, ok := t.scopes[0][e.parent]; ok {
			b = p.maxRetries
		}
	}
	return b > 0 && int(e.retries) < int(b)
}

func (t *tracker) resolved(scope uint32, e entState) bool {
	return wire.IsResolved(e.st, t.retriesLeft(scope, e))
}

// stale reports whether a root-scope id lies behind the cursor: its entity
// was resolved and forgotten, so late statuses for it are ignored.
func (t *tracker) stale(id uint32) bool {
	c := t.peerCursor
	if t.client {
		c = t.ids.Cursor()
	}
	return id != c && wire.IsBefore(id, c)
}

// verdict of checking a status against the state.
type verdict uint8

const (
	applied verdict = iota
	ignoredStale
	ignoredRace
	// ignoredLatePending: a PENDING announcement received after the
	// entity's stream arrived, or after this endpoint moved it on (stream
	// 0 and entity streams are not ordered against each other; the
	// draft-04 client announces every entity with PENDING).
	ignoredLatePending
)

// apply checks an entity STATUS (not a connection-level one) against the
// negotiated layers, the depth limit and the transition table, and records
// it. local tells whether this endpoint sends it. A received status that
// breaks a rule returns the *wire.Error to close with; for a local one the
// error goes back to the caller and nothing is recorded. newlyResolved
// tells that the entity just became resolved (Section 9.1).
func (t *tracker) apply(f *wire.StatusFrame, local bool) (v verdict, newlyResolved bool, err error) {
	if err := t.checkFrame(f, local); err != nil {
		return 0, false, err
	}
	scope, id := f.ScopeID, f.EntityID
	if scope == 0 {
		if v, err := t.checkRoot(id, local); v != applied || err != nil {
			return v, false, err
		}
	}
	sm := t.scopes[scope]
	e, known := sm[id]
	if !known {
		if err := t.roomFor(scope, sm); err != nil {
			return 0, false, err
		}
		e = entState{st: wire.StatusPending, maxRetries: -1}
	}
	if v, err := t.checkTransition(f, e, known, local); v != applied || err != nil {
		return v, false, err
	}
	wasResolved := known && t.resolved(scope, e)
	e.st = f.Status
	e.detached = false
	if f.Status == wire.StatusRetrying {
		e.retries++
	}
	e.localTerm = local && (f.Status.IsTerminal() || f.Status == wire.StatusFailed)
	e.lastLocal = local
	if sm == nil {
		sm = map[uint32]entState{}
		t.scopes[scope] = sm
	}
	t.put(scope, sm, id, e)
	if scope != 0 {
		t.depth[scope] = f.Depth
	}
	return applied, !wasResolved && t.resolved(scope, e), nil
}

// checkFrame applies the frame-level rules: layers, depth, and no cursor
// on a locally sent status.
func (t *tracker) checkFrame(f *wire.StatusFrame, local bool) error {
	if err := wire.CheckStatusFrame(f, t.layer1, t.layer2); err != nil {
		return err
	}
	if int(f.Depth) > t.maxDepth {
		return wire.Errorf(wire.CodeDepthExceeded, "STATUS: depth %d exceeds the negotiated max-scope-depth %d", f.Depth, t.maxDepth)
	}
	if f.HasCursor && local {
		return wire.Errorf(wire.CodeEntityInvalid, "STATUS: cursor updates (C=1) are sent by the session itself")
	}
	return nil
}

// checkRoot applies the root-scope rules: an ID behind the cursor is
// stale (ignored when received), and a client only hears of IDs it
// assigned.
func (t *tracker) checkRoot(id uint32, local bool) (verdict, error) {
	if t.stale(id) {
		if local {
			return 0, wire.Errorf(wire.CodeEntityInvalid, "entity %d is behind the cursor (already resolved)", id)
		}
		return ignoredStale, nil
	}
	if t.client && !t.ids.InFlight(id) {
		return 0, wire.Errorf(wire.CodeEntityInvalid, "STATUS for root entity %d, which was never assigned", id)
	}
	return applied, nil
}

// checkTransition checks f against entity state e (Section 6.2.3; the draft's "6.2.2a"): the
// transition table, the retry budget, the race rule (profile 3) and a late
// PENDING announcement (profile 1.2).
func (t *tracker) checkTransition(f *wire.StatusFrame, e entState, known, local bool) (verdict, error) {
	from, to := e.st, f.Status
	ok := wire.ValidTransition(from, to) || (!known && to == wire.StatusPending)
	if ok && from == wire.StatusFailed && to == wire.StatusRetrying && !t.retriesLeft(f.ScopeID, e) {
		ok = false
	}
	switch {
	case ok:
		return applied, nil
	case !local && known && e.localTerm:
		return ignoredRace, nil
	case !local && known && to == wire.StatusPending && (e.lastLocal || e.st == wire.StatusPending):
		return ignoredLatePending, nil
	}
	return 0, wire.Errorf(wire.CodeEntityInvalid, "STATUS: entity %d scope %d: %s -> %s is not a valid transition", f.EntityID, f.ScopeID, from, to)
}

// roomFor enforces max-entities-per-scope and the live-scope cap before a
// new entity is tracked (Section 10.3, 10.4).
func (t *tracker) roomFor(scope uint32, sm map[uint32]entState) error {
	if sm == nil && len(t.scopes) >= maxLiveScopes {
		return wire.Errorf(wire.CodeEntityTooLarge, "more than %d live scopes on one connection", maxLiveScopes)
	}
	if uint64(len(sm)) >= t.perScope {
		return wire.Errorf(wire.CodeEntityTooLarge, "scope %d exceeds max-entities-per-scope %d", scope, t.perScope)
	}
	return nil
}

// register records an entity whose stream is sent or received: its parent
// and retry budget. It does not change its status. Root-scope IDs behind
// the cursor are not tracked (a result stream may follow COMPLETE).
func (t *tracker) register(scope, id, parent uint32, budget int16) error {
	if scope == 0 && t.stale(id) {
		return nil
	}
	if scope == 0 && t.client && !t.ids.InFlight(id) {
		return wire.Errorf(wire.CodeEntityInvalid, "root entity %d was never assigned by this client", id)
	}
	sm := t.scopes[scope]
	e, known := sm[id]
	if !known {
		if err := t.roomFor(scope, sm); err != nil {
			return err
		}
		if sm == nil {
			sm = map[uint32]entState{}
			t.scopes[scope] = sm
		}
		e = entState{st: wire.StatusPending, maxRetries: -1}
	}
	if parent != 0 {
		e.parent = parent
	}
	if budget >= 0 {
		e.maxRetries = budget
	}
	t.put(scope, sm, id, e)
	return nil
}

// put stores e for (scope, id) in sm (= t.scopes[scope]). For the root
// scope it refreshes e's cached unres flag and keeps unresolvedRoot equal
// to the number of entries with the flag set. Only the stored entry is
// re-evaluated: a parent's retry budget learned later does not flip its
// children's flags until their next status, which can only make the
// count lower than the client's view (a FAILED child counted resolved),
// never higher.
func (t *tracker) put(scope uint32, sm map[uint32]entState, id uint32, e entState) {
	if scope == 0 {
		old, known := sm[id]
		e.unres = !t.resolved(0, e)
		if known && old.unres {
			t.unresolvedRoot--
			if !e.unres {
				t.rootResolutions++
			}
		}
		if e.unres {
			t.unresolvedRoot++
		}
	}
	sm[id] = e
}

// dropRoot forgets root-scope entry id (the cursor passed it).
func (t *tracker) dropRoot(sm map[uint32]entState, id uint32) {
	if e, ok := sm[id]; ok {
		if e.unres {
			t.unresolvedRoot--
			t.rootResolutions++
		}
		delete(sm, id)
	}
}

// overWindow reports whether more root-scope entities are unresolved in
// this endpoint's view than the client's window allows (server role;
// docs/profile.md section 2 says why this is only evidence until stream 0
// has caught up).
func (t *tracker) overWindow() bool { return uint64(t.unresolvedRoot) > t.window }

// resolveRoot advances the client's cursor over a newly resolved root ID and
// forgets the state of every ID the cursor passed.
func (t *tracker) resolveRoot(id uint32) (cursor uint32, advanced bool) {
	old := t.ids.Cursor()
	cursor, advanced = t.ids.Resolve(id)
	if advanced {
		sm := t.scopes[0]
		for c := old; c != cursor; c = wire.NextID(c) {
			t.dropRoot(sm, c)
		}
	}
	return cursor, advanced
}

// applyPeerCursor applies a connection-level cursor update (server role,
// docs/profile.md section 2): state of root IDs behind it is forgotten. A
// cursor that moves backwards is ignored.
func (t *tracker) applyPeerCursor(c uint32) bool {
	if c == 0 || c >= wire.IDModulus || c == t.peerCursor || wire.IsBefore(c, t.peerCursor) {
		return false
	}
	sm := t.scopes[0]
	d := modDist(t.peerCursor, c)
	if uint64(d) <= uint64(len(sm)) {
		for x := t.peerCursor; x != c; x = wire.NextID(x) {
			t.dropRoot(sm, x)
		}
	} else {
		for x := range sm {
			if modDist(t.peerCursor, x) < d {
				t.dropRoot(sm, x)
			}
		}
	}
	t.peerCursor = c
	t.peerCursorSeen = true
	return true
}

// anchorPeerCursor notes root entity id of a draft-04 client that has
// announced no cursor yet: such a client numbers its entities from
// wherever it likes (the reference starts at its first entity's ID), so
// until it announces a cursor, checkpoints count from the lowest ID it
// has used rather than from 1 (docs/profile.md 1.2).
func (t *tracker) anchorPeerCursor(id uint32) {
	if t.peerCursorSeen || id == 0 || id >= wire.IDModulus {
		return
	}
	if !t.anchored || wire.IsBefore(id, t.anchor) {
		t.anchor, t.anchored = id, true
	}
}

// forgetScope drops a Layer 1 scope after its SCOPE_DIGEST: the scope is
// complete and its ID may be recycled (Section 9.4).
func (t *tracker) forgetScope(scope uint32) {
	if scope != 0 {
		delete(t.scopes, scope)
		delete(t.depth, scope)
	}
}

// depthOf is the nesting depth of a scope (0 for the root scope).
func (t *tracker) depthOf(scope uint32) uint8 { return t.depth[scope] }

// drained reports whether every tracked entity is resolved or detached
// (Session.SetDetached) and, for the client, every assigned root ID is
// tracked: an ID assigned but not yet sent or reported holds the drain
// (GOAWAY drain, Section 6.5). The client's root-scope entries are exactly
// its outstanding IDs that were sent or reported (entries behind the
// cursor are dropped), so the untracked ones are the difference.
func (t *tracker) drained() bool {
	if t.client && uint64(t.ids.Outstanding()) > uint64(len(t.scopes[0])) {
		return false
	}
	for scope, sm := range t.scopes {
		for _, e := range sm {
			if !e.detached && !t.resolved(scope, e) {
				return false
			}
		}
	}
	return true
}

// checkpointSatisfied is condition 1 of Section 9.3: every entity of scope
// with an ID before cpID (is_before, circular) is resolved. For the root
// scope the IDs run from the cursor; for a Layer 1 scope from 1 (peer
// scopes number entities 1, 2, 3, ..., docs/profile.md section 2). IDs not
// yet seen count as unresolved.
func (t *tracker) checkpointSatisfied(scope, cpID uint32) bool {
	base := uint32(1)
	if scope == 0 {
		base = t.peerCursor
		if t.client {
			base = t.ids.Cursor()
		} else if t.anchored && !t.peerCursorSeen {
			base = t.anchor
		}
	}
	need := modDist(base, cpID)
	if need == 0 || need >= wire.IDModulus/2 {
		return true // nothing before it, or it lies behind the cursor
	}
	sm := t.scopes[scope]
	if uint64(need) > uint64(len(sm)) {
		return false
	}
	var n uint32
	for id, e := range sm {
		if modDist(base, id) < need && t.resolved(scope, e) {
			n++
		}
	}
	return n == need
}

// modDist is (b - a) mod 0xFFFFFFFD (Section 9.1).
func modDist(a, b uint32) uint32 {
	return uint32((uint64(b) + uint64(wire.IDModulus) - uint64(a)%uint64(wire.IDModulus)) % uint64(wire.IDModulus))
}
