package assembly

import "github.com/pipestream/gateway/quicpeer/wire"

// Key identifies a manifest: the parent's (scope, entity id).
type Key struct {
	Scope, Parent uint32
}

// Tracker is the rehydration-readiness tracker of Section 9.6: it holds
// manifests in a pairing heap keyed by (work left, arrival order), where
// work left is the number of unresolved children plus one while unsealed.
// Each resolved child or Seal is a decrease-key; PopReady extracts the
// manifests whose work left is zero, oldest first.
type Tracker struct {
	heap  Heap[*Manifest]
	nodes map[Key]*Node[*Manifest]
	seq   uint32
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{nodes: make(map[Key]*Node[*Manifest])} }

func workKey(m *Manifest, seq uint32) uint64 {
	w := uint64(m.unresolved)
	if !m.sealed {
		w++
	}
	return w<<32 | uint64(seq)
}

// Add starts tracking m. A manifest with the same (scope, parent) already
// tracked is *wire.Error 0x05.
func (t *Tracker) Add(m *Manifest) error {
	k := Key{m.ScopeID, m.ParentID}
	if _, dup := t.nodes[k]; dup {
		return wire.Errorf(wire.CodeEntityInvalid, "manifest for parent %d in scope %d exists", m.ParentID, m.ScopeID)
	}
	t.seq++
	t.nodes[k] = t.heap.Insert(workKey(m, t.seq), m)
	return nil
}

// Get returns the tracked manifest of k.
func (t *Tracker) Get(k Key) (*Manifest, bool) {
	n, ok := t.nodes[k]
	if !ok {
		return nil, false
	}
	return n.Value, true
}

// Len returns the number of tracked manifests.
func (t *Tracker) Len() int { return t.heap.Len() }

func (t *Tracker) reKey(n *Node[*Manifest]) {
	_ = t.heap.Update(n, workKey(n.Value, uint32(n.key)))
}

// AddChild adds a child to the manifest of k (its work left grows).
func (t *Tracker) AddChild(k Key, child uint32) error {
	n, ok := t.nodes[k]
	if !ok {
		return wire.Errorf(wire.CodeEntityInvalid, "no manifest for parent %d in scope %d", k.Parent, k.Scope)
	}
	if err := n.Value.AddChild(child); err != nil {
		return err
	}
	t.reKey(n)
	return nil
}

// SetStatus records a child status in the manifest of k (Manifest.SetStatus)
// and lowers its key when the child resolved.
func (t *Tracker) SetStatus(k Key, child uint32, s wire.Status) error {
	n, ok := t.nodes[k]
	if !ok {
		return wire.Errorf(wire.CodeEntityInvalid, "no manifest for parent %d in scope %d", k.Parent, k.Scope)
	}
	resolved, err := n.Value.SetStatus(child, s)
	if resolved {
		t.reKey(n)
	}
	return err
}

// Settle records the final status of a child in the manifest of k
// (Manifest.Settle) and lowers the manifest's key when the child resolved:
// the decrease-key of Section 9.6. It does not allocate.
func (t *Tracker) Settle(k Key, child uint32, final wire.Status) error {
	n, ok := t.nodes[k]
	if !ok {
		return wire.Errorf(wire.CodeEntityInvalid, "no manifest for parent %d in scope %d", k.Parent, k.Scope)
	}
	resolved, err := n.Value.Settle(child, final)
	if resolved {
		t.reKey(n)
	}
	return err
}

// Seal marks the manifest of k complete in children.
func (t *Tracker) Seal(k Key) error {
	n, ok := t.nodes[k]
	if !ok {
		return wire.Errorf(wire.CodeEntityInvalid, "no manifest for parent %d in scope %d", k.Parent, k.Scope)
	}
	if !n.Value.sealed {
		n.Value.Seal()
		t.reKey(n)
	}
	return nil
}

// PopReady removes and returns the oldest ready manifest, if any.
func (t *Tracker) PopReady() (*Manifest, bool) {
	n, ok := t.heap.Min()
	if !ok || !n.Value.Ready() {
		return nil, false
	}
	t.heap.ExtractMin()
	delete(t.nodes, Key{n.Value.ScopeID, n.Value.ParentID})
	return n.Value, true
}

// Remove stops tracking k (e.g. the parent was cancelled).
func (t *Tracker) Remove(k Key) {
	if n, ok := t.nodes[k]; ok {
		_ = t.heap.Delete(n)
		delete(t.nodes, k)
	}
}
