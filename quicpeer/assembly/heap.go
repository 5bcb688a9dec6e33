package assembly

import "errors"

// Heap is a min pairing heap keyed by uint64 with handles, the priority
// queue of Section 9.6: Insert, Meld and DecreaseKey are O(1),
// ExtractMin and Delete amortized O(log n).
//
// The zero Heap is empty and ready to use. Handles (*Node) stay valid until
// their node is extracted or deleted.
type Heap[V any] struct {
	root    *Node[V]
	n       int
	scratch []*Node[V] // reused by the two-pass merge
}

// Node is a handle to one heap entry.
type Node[V any] struct {
	key   uint64
	Value V
	child *Node[V]
	next  *Node[V] // right sibling
	prev  *Node[V] // left sibling, or the parent for a first child
	heap  *Heap[V]
}

// Key returns the node's current key.
func (n *Node[V]) Key() uint64 { return n.key }

// ErrKeyIncrease is returned by DecreaseKey when the new key is larger.
var ErrKeyIncrease = errors.New("assembly: DecreaseKey with a larger key")

// ErrNotInHeap is returned for a handle that is not in this heap.
var ErrNotInHeap = errors.New("assembly: node is not in this heap")

// Len returns the number of entries.
func (h *Heap[V]) Len() int { return h.n }

// Insert adds v with key and returns its handle. O(1).
func (h *Heap[V]) Insert(key uint64, v V) *Node[V] {
	n := &Node[V]{key: key, Value: v, heap: h}
	h.root = meld(h.root, n)
	h.n++
	return n
}

// Min returns the entry with the smallest key without removing it.
func (h *Heap[V]) Min() (*Node[V], bool) { return h.root, h.root != nil }

// ExtractMin removes and returns the entry with the smallest key.
func (h *Heap[V]) ExtractMin() (*Node[V], bool) {
	r := h.root
	if r == nil {
		return nil, false
	}
	h.root = h.mergePairs(r.child)
	if h.root != nil {
		h.root.prev = nil
	}
	h.n--
	r.child, r.next, r.prev, r.heap = nil, nil, nil, nil
	return r, true
}

// DecreaseKey lowers n's key. O(1) amortized (cut and meld).
func (h *Heap[V]) DecreaseKey(n *Node[V], key uint64) error {
	if n == nil || n.heap != h {
		return ErrNotInHeap
	}
	if key > n.key {
		return ErrKeyIncrease
	}
	n.key = key
	if n == h.root {
		return nil
	}
	h.cut(n)
	h.root = meld(h.root, n)
	return nil
}

// Update sets n's key: DecreaseKey when it does not grow, else Delete and
// re-insert of the same handle.
func (h *Heap[V]) Update(n *Node[V], key uint64) error {
	if n == nil || n.heap != h {
		return ErrNotInHeap
	}
	if key <= n.key {
		return h.DecreaseKey(n, key)
	}
	if err := h.Delete(n); err != nil {
		return err
	}
	n.key, n.heap = key, h
	h.root = meld(h.root, n)
	h.n++
	return nil
}

// Delete removes n from the heap.
func (h *Heap[V]) Delete(n *Node[V]) error {
	if n == nil || n.heap != h {
		return ErrNotInHeap
	}
	if n == h.root {
		h.ExtractMin()
		return nil
	}
	h.cut(n)
	sub := h.mergePairs(n.child)
	if sub != nil {
		sub.prev = nil
		h.root = meld(h.root, sub)
	}
	h.n--
	n.child, n.next, n.prev, n.heap = nil, nil, nil, nil
	return nil
}

// cut detaches the subtree rooted at non-root n from its parent/siblings.
func (h *Heap[V]) cut(n *Node[V]) {
	if n.prev.child == n { // first child
		n.prev.child = n.next
	} else {
		n.prev.next = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	}
	n.next, n.prev = nil, nil
}

// meld joins two roots; the larger key becomes the first child of the other.
func meld[V any](a, b *Node[V]) *Node[V] {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	if b.key < a.key {
		a, b = b, a
	}
	b.prev = a
	b.next = a.child
	if a.child != nil {
		a.child.prev = b
	}
	a.child = b
	a.next, a.prev = nil, nil
	return a
}

// mergePairs is the two-pass merge of a sibling list, iterative.
func (h *Heap[V]) mergePairs(first *Node[V]) *Node[V] {
	if first == nil {
		return nil
	}
	s := h.scratch[:0]
	for a := first; a != nil; {
		b := a.next
		var rest *Node[V]
		if b != nil {
			rest = b.next
			b.next, b.prev = nil, nil
		}
		a.next, a.prev = nil, nil
		s = append(s, meld(a, b))
		a = rest
	}
	r := s[len(s)-1]
	for i := len(s) - 2; i >= 0; i-- {
		r = meld(s[i], r)
	}
	clear(s)
	h.scratch = s[:0]
	return r
}
