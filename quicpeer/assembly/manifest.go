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
	DefaultMaxRetries      = 3
	DefaultMinSuccessRatio = 1.0 // QUORUM without min-success-ratio needs every child
)

// Child is one entry of children-ids / children-status.
type Child struct {
	ID      uint32
	Status  wire.Status
	Retries uint32 // RETRYING transitions seen
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
	if !wire.ValidTransition(c.Status, s) {
		return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: invalid transition %s -> %s", id, c.Status, s)
	}
	before := wire.IsResolved(c.Status, c.Retries < m.maxRetries())
	if s == wire.StatusRetrying {
		if c.Retries >= m.maxRetries() {
			return false, wire.Errorf(wire.CodeEntityInvalid, "child %d: RETRYING with no retry left (%d used)", id, c.Retries)
		}
		c.Retries++
	}
	c.Status = s
	after := wire.IsResolved(s, c.Retries < m.maxRetries())
	if after && !before {
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
//   - STRICT (and unspecified): every child COMPLETE, else FAILED;
//   - LENIENT: COMPLETE if at least one child succeeded, else FAILED;
//   - BEST_EFFORT: COMPLETE even with none;
//   - QUORUM: COMPLETE iff succeeded/total >= min-success-ratio (absent:
//     DefaultMinSuccessRatio).
//
// A COMPLETE parent is RESOLVED when every child is COMPLETE, else PARTIAL;
// a FAILED parent is FAILED. With no children every mode is RESOLVED.
// Before Ready it returns *wire.Error 0x05 and changes nothing.
func (m *Manifest) Evaluate() (Outcome, error) {
	if !m.Ready() {
		return Outcome{}, wire.Errorf(wire.CodeEntityInvalid, "manifest %d: not ready (%d unresolved, sealed %t)", m.ParentID, m.unresolved, m.sealed)
	}
	o := Outcome{Total: len(m.children)}
	for _, c := range m.children {
		if c.Status == wire.StatusComplete {
			o.Succeeded++
			o.Rehydrate = append(o.Rehydrate, c.ID)
		}
	}
	mode := wire.ModeStrict
	if m.Policy != nil && m.Policy.Mode != nil && *m.Policy.Mode != wire.ModeUnspecified {
		mode = *m.Policy.Mode
	}
	all := o.Succeeded == o.Total
	var ok bool
	switch mode {
	case wire.ModeLenient:
		ok = all || o.Succeeded > 0
	case wire.ModeBestEffort:
		ok = true
	case wire.ModeQuorum:
		ratio := float64(DefaultMinSuccessRatio)
		if m.Policy.MinSuccessRatio != nil {
			ratio = float64(*m.Policy.MinSuccessRatio)
		}
		ok = all || float64(o.Succeeded) >= ratio*float64(o.Total)
	default:
		ok = all
	}
	switch {
	case ok && all:
		o.State, o.ParentStatus = StateResolved, wire.StatusComplete
	case ok:
		o.State, o.ParentStatus = StatePartial, wire.StatusComplete
	default:
		o.State, o.ParentStatus = StateFailed, wire.StatusFailed
	}
	m.state = o.State
	return o, nil
}
