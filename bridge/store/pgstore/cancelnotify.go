package pgstore

import (
	"context"
	"strings"
	"sync/atomic"
)

// cancelsChannel is the NOTIFY channel of cancel requests: a replica asked
// to cancel a document it does not drive tells the replica that does,
// which cancels it (docs/scale-out.md, Cancel across replicas). The
// payload is "<replica id> <doc id> <tenant>".
const cancelsChannel = "pipestream_cancels"

// cancelNotes holds the hook told of cancel requests of other replicas.
type cancelNotes struct {
	hook atomic.Pointer[func(tenant, docID string)]
}

// SetCancelRequestedHook sets the function told of every cancel another
// replica requested (RequestCancel) for a document this Store holds the
// lease of. It is called from the listener goroutine and must not block.
// A request sent while this replica's listener is down is lost: the
// requesting replica answers that the cancel did not happen.
func (s *Store) SetCancelRequestedHook(f func(tenant, docID string)) {
	if f == nil {
		s.cancels.hook.Store(nil)
		return
	}
	s.cancels.hook.Store(&f)
}

// RequestCancel asks the replica driving docID (whichever holds its
// lease) to cancel it. It returns once the request is sent; whether the
// document was cancelled shows in its events and its state.
func (s *Store) RequestCancel(ctx context.Context, tenant, docID string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.wg.Done()
	if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", cancelsChannel, s.lease.me+" "+docID+" "+tenant); err != nil {
		return mapErr("request cancel of "+docID, err)
	}
	return nil
}

// cancelNotified hands a cancelsChannel notification of another replica
// to the hook when this Store holds the document.
func (s *Store) cancelNotified(payload string) {
	parts := strings.SplitN(payload, " ", 3)
	if len(parts) != 3 || parts[0] == s.lease.me {
		return
	}
	f := s.cancels.hook.Load()
	if f == nil || !s.holds(parts[1]) {
		return
	}
	(*f)(parts[2], parts[1])
}
