package bridge

import (
	"sync"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// No network write under a lock (issue 21): a STATUS frame that document
// code decides while it holds its document's lock (the gateway gave up on an
// entity, the gateway's own rehydration of a plain document) is queued on
// its session's control outbox and written after the lock is released,
// by one goroutine per session at a time, in the order queued. A peer
// that stops reading stream 0 then holds up only that goroutine (and
// quicpeer ends the session when a write passes its deadline,
// Limits.ControlWriteTimeout), never a lock another document or peer
// needs.

// ctrlOut is a session's queue of stream-0 frames to write.
type ctrlOut struct {
	mu      sync.Mutex
	q       []ctrlFrame
	writing bool // a writer goroutine drains q
}

// ctrlFrame is one queued STATUS frame and the document it concerns (for
// the log).
type ctrlFrame struct {
	f   wire.StatusFrame
	doc string
}

// sendStatusLocked queues f for ss's stream 0 and makes sure a writer runs.
// Caller holds the lock of document doc (so its frames keep their order),
// not the registry's (ss.closed is read in a short section of its own);
// the writer takes no lock of the caller's, so no frame is written under
// one.
func (env *docEnv) sendStatusLocked(ss *sessState, doc string, f wire.StatusFrame) {
	s := ss.s
	if s == nil || env.sessClosed(ss) {
		return
	}
	o := &ss.ctl
	o.mu.Lock()
	o.q = append(o.q, ctrlFrame{f: f, doc: doc})
	start := !o.writing
	o.writing = true
	o.mu.Unlock()
	if start {
		env.wg.Add(1)
		go env.writeCtrl(s, o)
	}
}

// writeCtrl writes o's queued frames to s until the queue is empty. A
// write error (the session ended, or the frame no longer fits the
// entity's state) is logged; the frames after it are still tried, each
// answering for itself.
func (env *docEnv) writeCtrl(s *quicpeer.Session, o *ctrlOut) {
	defer env.wg.Done()
	for {
		o.mu.Lock()
		q := o.q
		o.q = nil
		if len(q) == 0 {
			o.writing = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		for _, c := range q {
			if err := s.SendStatus(c.f); err != nil {
				env.log.Debug("bridge: could not send a status to the peer", "doc", c.doc, "entity", c.f.EntityID, "status", c.f.Status, "err", err)
			}
		}
	}
}
