package bridge

import "sync"

// registry is the bridge's shared bookkeeping: the documents of this
// process, the dispatch queue, the peers and their sessions, and what
// result attribution learned per session. Its mutex, mu (Bridge.mu), guards
// it; a document's own mutex (docRun.mu) is taken before it, never under
// it (doclock.go, docs/architecture.md "Concurrency").
type registry struct {
	mu       sync.Mutex
	closing  bool
	docs     map[string]*docRun // non-terminal documents (and finished ones until flushed)
	queue    []*docRun          // documents waiting for dispatch
	peers    []*peerConn        // in the configured order; fixed after New
	nextPeer int                // where placement's round-robin tie-break starts
	sessions map[*sessState]struct{}
	// attrib: what result attribution learned per session
	// (attribution.go); dropped when the session closes.
	attrib map[*sessState]*sessAttrib
}

// The registry's methods are leaves: the caller holds mu, and they touch
// nothing but the registry (no document's state or lock, no store, no
// network).

// register adds d to the documents of this process; false when another
// document holds its id.
func (r *registry) register(d *docRun) bool {
	if r.docs[d.id] != nil {
		return false
	}
	r.docs[d.id] = d
	return true
}

// push appends d to the dispatch queue.
func (r *registry) push(d *docRun) { r.queue = append(r.queue, d) }

// unqueue takes d out of the dispatch queue.
func (r *registry) unqueue(d *docRun) {
	for i, q := range r.queue {
		if q == d {
			r.queue = append(r.queue[:i], r.queue[i+1:]...)
			return
		}
	}
}

// forget removes d from the documents of this process; it reports whether
// d was the one registered under its id.
func (r *registry) forget(d *docRun) bool {
	if r.docs[d.id] != d {
		return false
	}
	delete(r.docs, d.id)
	return true
}

// rotatePast moves placement's round-robin past pc: the next tie goes to
// the next peer.
func (r *registry) rotatePast(pc *peerConn) { r.nextPeer = (pc.idx + 1) % len(r.peers) }

// liveSessions counts the sessions to pc that have not ended.
func (r *registry) liveSessions(pc *peerConn) int {
	n := 0
	for ss := range r.sessions {
		if ss.pc == pc && !ss.closed {
			n++
		}
	}
	return n
}

// peerDocs counts the documents in flight on pc's live sessions.
func (r *registry) peerDocs(pc *peerConn) int {
	n := 0
	for ss := range r.sessions {
		if ss.pc == pc && !ss.closed {
			n += len(ss.docs)
		}
	}
	return n
}

// attribOf is ss's attribution state, made on first use (a closed
// session's is not kept: onSessionClosedLocked dropped it).
func (r *registry) attribOf(ss *sessState) *sessAttrib {
	if ss.closed {
		if st := r.attrib[ss]; st != nil {
			return st
		}
		return &sessAttrib{} // not kept: nothing is taken after the close (its entities left the session)
	}
	if r.attrib == nil {
		r.attrib = map[*sessState]*sessAttrib{}
	}
	st := r.attrib[ss]
	if st == nil {
		st = &sessAttrib{}
		r.attrib[ss] = st
	}
	return st
}
