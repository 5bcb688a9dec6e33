package bridge

// Locks (docs/architecture.md, "Concurrency"): each document has its own
// mutex, docRun.mu, over the document and its attempts; the registry's mu
// guards the registry (documents map, queue, peers, sessions and their
// entity maps, attribution). The lock order is document, then registry.
//
// Document code runs under its document's mutex alone. Where it must read
// or change the registry (take or leave a session, queue, bind or release
// session entity mappings) it takes the registry's mu for a short leaf
// section (regLock ... regUnlock, or a function named ...RegLocked, which
// runs with it held) that touches registry, session and peer state and
// the document's own fields, and calls no document code. Code holding the
// registry's mu never takes a document's, and no code holds two
// documents' locks at once. Neither lock is held across a network write, a
// store commit or a wait on a peer.
//
// What a document's lock alone makes stable: a document joins or leaves a
// session's documents (sessState.docs), the queue (docRun.queued) and
// session entity mappings only while holding its own lock (and, for the
// moment of the change, the registry's), so code holding the document's
// lock may rely on its membership not changing under it; reading the
// shared maps themselves still takes the registry's mu.

// lock takes d's mutex.
func (d *docRun) lock() { d.mu.Lock() }

// unlock releases d's mutex.
func (d *docRun) unlock() { d.mu.Unlock() }

// regLock takes the registry's mu for a short leaf section of document
// code (caller holds its document's lock).
func (env *docEnv) regLock() { env.reg.mu.Lock() }

// regUnlock ends what regLock began.
func (env *docEnv) regUnlock() { env.reg.mu.Unlock() }

// lockFound is called holding only the registry's mu; find (run under it)
// names the one document the caller's work touches, or nil for none. It
// returns that document with its mutex and the registry's held, or nil
// with the registry's alone. The registry's mu is released while the
// document's is taken (the lock order), so find runs again after and the
// document is kept only if it is still the one named. The caller does
// its registry part, releases the registry's mu, then runs document code
// under the document's lock alone (unlockFound after).
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

// lockDocOf takes the lock of the document find names (lockFound) and
// returns it with that lock alone held, or nil; the caller holds neither
// lock.
func lockDocOf(reg *registry, find func() *docRun) *docRun {
	reg.mu.Lock()
	d := lockFound(reg, find)
	reg.mu.Unlock()
	return d
}

// sessClosed reports whether ss has ended (a short registry section of
// document code).
func (env *docEnv) sessClosed(ss *sessState) bool {
	env.regLock()
	defer env.regUnlock()
	return ss.closed
}

// unlockFound releases the document lockFound took (the caller released
// the registry's mu already).
func unlockFound(d *docRun) {
	if d != nil {
		d.mu.Unlock()
	}
}

// eachDoc runs fn for each of docs, a snapshot taken under the registry's
// mu, holding the document's mutex alone; the caller holds neither. still
// (run under both) says whether what the snapshot saw holds yet: a
// document that moved on meanwhile is skipped. What still checked stays
// true while fn runs when only the document's own code changes it (a
// document's session and queue membership: see above).
func eachDoc(reg *registry, docs []*docRun, still func(*docRun) bool, fn func(*docRun)) {
	for _, d := range docs {
		d.mu.Lock()
		ok := true
		if still != nil {
			reg.mu.Lock()
			ok = still(d)
			reg.mu.Unlock()
		}
		if ok {
			fn(d)
		}
		d.mu.Unlock()
	}
}
