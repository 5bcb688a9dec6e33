package bridge

// Locks (docs/architecture.md, "Concurrency"): each document has its own
// mutex, docRun.mu, over the document and its attempts; the registry's mu
// guards the registry (documents map, queue, peers, sessions and their
// entity maps, attribution). The lock order is document, then registry:
// code holding the registry's mu never takes a document's (registry
// methods are leaves), and no code holds two documents' locks at once.
// Neither lock is held across a network write, a store commit or a wait
// on a peer.

// lock takes d's mutex, then the registry's.
func (d *docRun) lock() {
	d.mu.Lock()
	d.env.reg.mu.Lock()
}

// unlock releases what lock took.
func (d *docRun) unlock() {
	d.env.reg.mu.Unlock()
	d.mu.Unlock()
}

// lockDoc takes d's mutex alone: for a section that touches the document
// and nothing of the registry.
func (d *docRun) lockDoc() { d.mu.Lock() }

// unlockDoc releases what lockDoc took.
func (d *docRun) unlockDoc() { d.mu.Unlock() }

// lockFound is called holding only the registry's mu; find (run under it)
// names the one document the caller's work touches, or nil for none. It
// returns that document with its mutex and the registry's held, or nil
// with the registry's alone. The registry's mu is released while the
// document's is taken (the lock order), so find runs again after and the
// document is kept only if it is still the one named.
func lockFound(reg *registry, find func() *docRun) *docRun {
	for {
		d := find()
		if d == nil {
			return nil
		}
		reg.mu.Unlock()
		d.mu.Lock()
		reg.mu.Lock()
		if find() == d {
			return d
		}
		d.mu.Unlock()
	}
}

// unlockFound releases what lockFound took.
func unlockFound(reg *registry, d *docRun) {
	reg.mu.Unlock()
	if d != nil {
		d.mu.Unlock()
	}
}

// eachDoc runs fn for each of docs, a snapshot taken under the registry's
// mu, holding the document's mutex and the registry's; the caller holds
// neither. still (under both) says whether what the snapshot saw holds
// yet: a document that moved on meanwhile is skipped.
func eachDoc(reg *registry, docs []*docRun, still func(*docRun) bool, fn func(*docRun)) {
	for _, d := range docs {
		d.mu.Lock()
		reg.mu.Lock()
		if still == nil || still(d) {
			fn(d)
		}
		reg.mu.Unlock()
		d.mu.Unlock()
	}
}
