package assembly

import (
	"github.com/pipestream/gateway/quicpeer/wire"
)

// ResolutionState is resolution-state of Section 9.2.
type ResolutionState uint8

const (
	StateUnspecified ResolutionState = 0
	StateActive      ResolutionState = 1
	StateResolved    ResolutionState = 2 // every child COMPLETE
	StatePartial     ResolutionState = 3 // parent COMPLETE, some children failed/skipped
	StateFailed      ResolutionState = 4 // parent FAILED
)

func (s ResolutionState) String() string {
	return [...]string{"UNSPECIFIED", "ACTIVE", "RESOLVED", "PARTIAL", "FAILED", "?"}[min(int(s), 5)]
}

// Policy defaults of Section 8.3.
const (
	DefaultMaxRetries = 3
	// DefaultMinSuccessRatio applies when QUORUM carries no (or no valid)
	// min-success-ratio: a simple majority (the draft gives no default;
	// docs/profile.md 5).
	DefaultMinSuccessRatio = 0.5
)

// Child is one entry of children-ids / children-status.
type Child struct {
	ID      uint32
	Status  wire.Status
	Retries uint32 // RETRYING transitions seen

	resolved bool // counted out of Manifest.unresolved
}

// Manifest is one assembly-manifest-entry (Section 9.2): a parent, its
// children in the order they were added (chunk order), their statuses and
// the completion policy that decides the parent's outcome (docs/profile.md
// 5). Children start PENDING (Section 6.2.3).
type Manifest struct {
	ParentID  uint32
	ScopeID   uint32
	Policy    *wire.CompletionPolicy
	CreatedAt uint64 // Unix epoch microseconds

	children   []Child
	index      map[uint32]int
	unresolved int
	sealed     bool
	state      ResolutionState
}

// NewManifest returns an ACTIVE manifest without children. policy may be nil
// (STRICT, FAIL).
func NewManifest(parentID, scopeID uint32, policy *wire.CompletionPolicy, createdAt uint64) *Manifest {
	return &Manifest{ParentID: parentID, ScopeID: scopeID, Policy: policy, CreatedAt: createdAt,
		index: make(map[uint32]int), state: StateActive}
}

// AddChild records a child (PENDING). A duplicate ID, ID 0, or a child added
// after Seal is *wire.Error 0x05.
func (m *Manifest) AddChild(id uint32) error {
	switch {
	case id == wire.NullEntity:
		return wire.Errorf(wire.CodeEntityInvalid, "manifest %d: child id 0", m.ParentID)
	case m.sealed:
		return wire.Errorf(wire.CodeEntityInvalid, "manifest %d: child %d after the last child", m.ParentID, id)
	}
	if _, dup := m.index[id]; dup {
		return wire.Errorf(wire.CodeEntityInvalid, "manifest %d: child %d added twice", m.ParentID, id)
	}
	m.index[id] = len(m.children)
	m.children = append(m.children, Child{ID: id, Status: wire.StatusPending})
	m.unresolved++
	return nil
}

// Seal records that every child has been added (e.g. the root envelope with
// pipestream.total-chunks arrived).
func (m *Manifest) Seal() { m.sealed = true }

// Sealed reports whether Seal was called.
func (m *Manifest) Sealed() bool { return m.sealed }

// maxRetries is the effective retry budget: on-failure RETRY with
// max-retries (default 3); any other action allows none.
func (m *Manifest) maxRetries() uint32 {
	p := m.Policy
	if p == nil || p.OnFailure == nil || *p.OnFailure != wire.ActionRetry {
		return 0
	}
	if p.MaxRetries == nil {
		return DefaultMaxRetries
	}
	return *p.MaxRetries
}

// RetriesLeft reports whether child id may still move FAILED -> RETRYING.
func (m *Manifest) RetriesLeft(id uint32) bool {
	i, ok := m.index[id]
	return ok && m.children[i].Retries < m.maxRetries()
}

// Settle records the final status of child id as decided by its owner
// (the processing peer that exhausted the retries or applied the policy's
// action): COMPLETE, FAILED (no retry left), SKIPPED (excluded from
// rehydration, also for a FAILED/ABANDONED entity whose policy said SKIP),
// or ABANDONED. The child is resolved whatever the retry budget; it
// returns true when it was not resolved before. Another status, an unknown
// child or a second Settle is *wire.Error 0x05. It does not allocate.
func (m *Manifest) Settle(id uint32, final wire.Status) (resolvedNow bool, err error) {
	i, ok := m.index[id]
	if !ok {
		return false, wire.Errorf(wire.CodeEntityInvalid, "manifest %d: %d is not a child", m.ParentID, id)
	}
	switch final {
	case wire.StatusComplete, wire.StatusFailed, wire.StatusSkipped, wire.StatusAbandoned:
	default:
		return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: %s is not a final status", id, final)
	}
	c := &m.children[i]
	if c.resolved {
		return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: settled twice (%s, then %s)", id, c.Status, final)
	}
	c.Status, c.resolved = final, true
	m.unresolved--
	return true, nil
}

// Resolved reports whether child id is resolved (false for an unknown id).
func (m *Manifest) Resolved(id uint32) bool {
	i, ok := m.index[id]
	return ok && m.children[i].resolved
}

// Status returns the recorded status of child id.
func (m *Manifest) Status(id uint32) (wire.Status, bool) {
	i, ok := m.index[id]
	if !ok {
		return 0, false
	}
	return m.children[i].Status, true
}

// SetStatus records a child's status. It checks the transition against
// Section 6.2.3 (a repeated status is a no-op) and the retry budget
// (FAILED -> RETRYING only while retries are left); violations are
// *wire.Error 0x05, as is an unknown child. It returns true when the child
// just became resolved (wire.IsResolved).
func (m *Manifest) SetStatus(id uint32, s wire.Status) (resolvedNow bool, err error) {
	i, ok := m.index[id]
	if !ok {
		return false, wire.Errorf(wire.CodeEntityInvalid, "manifest %d: %d is not a child", m.ParentID, id)
	}
	c := &m.children[i]
	if c.Status == s {
		return false, nil
	}
	if c.resolved && c.Status != wire.StatusFailed {
		return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: %s after it was resolved (%s)", id, s, c.Status)
	}
	if !wire.ValidTransition(c.Status, s) {
		return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: invalid transition %s -> %s", id, c.Status, s)
	}
	before := c.resolved
	if s == wire.StatusRetrying {
		if c.Retries >= m.maxRetries() {
			return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: RETRYING with no retry left (%d used)", id, c.Retries)
		}
		c.Retries++
	}
	c.Status = s
	c.resolved = wire.IsResolved(s, c.Retries < m.maxRetries())
	if c.resolved && !before {
		m.unresolved--
		return true, nil
	}
	return false, nil
}

// Unresolved returns the number of children not yet resolved.
func (m *Manifest) Unresolved() int { return m.unresolved }

// Ready reports whether the parent can be evaluated: sealed and every child
// resolved.
func (m *Manifest) Ready() bool { return m.sealed && m.unresolved == 0 }

// Children returns a copy of children-ids / children-status in order.
func (m *Manifest) Children() []Child { return append([]Child(nil), m.children...) }

// State returns the resolution state: ACTIVE until Evaluate succeeded.
func (m *Manifest) State() ResolutionState { return m.state }

// Outcome is the completion-policy decision for the parent.
type Outcome struct {
	State        ResolutionState
	ParentStatus wire.Status // COMPLETE or FAILED
	Succeeded    int
	Total        int
	// Rehydrate lists the COMPLETE children in order: what the parent is
	// rehydrated from.
	Rehydrate []uint32
}

// Evaluate applies the completion policy (docs/profile.md 5) once Ready:
//   - STRICT (and unspecified or unknown modes): no child FAILED or
//     ABANDONED; SKIPPED children (excluded by a SKIP action) leave the
//     denominator;
//   - LENIENT: COMPLETE if at least one child succeeded, else FAILED;
//   - BEST_EFFORT: COMPLETE even with none;
//   - QUORUM: COMPLETE iff succeeded/total >= min-success-ratio (absent or
//     outside [0, 1]: DefaultMinSuccessRatio); skipped children count as
//     not succeeded; with no children COMPLETE.
//
// A COMPLETE parent is RESOLVED when every child is COMPLETE, else PARTIAL;
// a FAILED parent is FAILED. Before Ready it returns *wire.Error 0x05 and
// changes nothing. Rehydrate is allocated once per call.
func (m *Manifest) Evaluate() (Outcome, error) {
	if !m.Ready() {
		return Outcome{}, wire.Errorf(wire.CodeEntityInvalid, "manifest %d: not ready (%d unresolved, sealed %t)", m.ParentID, m.unresolved, m.sealed)
	}
	o := Outcome{Total: len(m.children)}
	bad := 0
	for _, c := range m.children {
		switch c.Status {
		case wire.StatusComplete:
			o.Succeeded++
		case wire.StatusSkipped:
		default:
			bad++
		}
	}
	if o.Succeeded > 0 {
		o.Rehydrate = make([]uint32, 0, o.Succeeded)
		for _, c := range m.children {
			if c.Status == wire.StatusComplete {
				o.Rehydrate = append(o.Rehydrate, c.ID)
			}
		}
	}
	mode := wire.ModeStrict
	if m.Policy != nil && m.Policy.Mode != nil && *m.Policy.Mode != wire.ModeUnspecified && *m.Policy.Mode <= wire.ModeQuorum {
		mode = *m.Policy.Mode
	}
	var ok bool
	switch mode {
	case wire.ModeLenient:
		ok = o.Succeeded >= 1
	case wire.ModeBestEffort:
		ok = true
	case wire.ModeQuorum:
		ratio := float64(DefaultMinSuccessRatio)
		if r := m.Policy.MinSuccessRatio; r != nil && *r >= 0 && *r <= 1 {
			ratio = float64(*r)
		}
		ok = o.Total == 0 || float64(o.Succeeded)/float64(o.Total) >= ratio
	default:
		ok = bad == 0
	}
	switch {
	case ok && o.Succeeded == o.Total:
		o.State, o.ParentStatus = StateResolved, wire.StatusComplete
	case ok:
		o.State, o.ParentStatus = StatePartial, wire.StatusComplete
	default:
		o.State, o.ParentStatus = StateFailed, wire.StatusFailed
	}
	m.state = o.State
	return o, nil
}
