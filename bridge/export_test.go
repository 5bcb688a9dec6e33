package bridge

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// SetRedeemAckTimeout shortens redeemAckTimeout for a test; call the
// returned func to restore it. Not safe while a bridge is redeeming.
func SetRedeemAckTimeout(d time.Duration) (restore func()) {
	old := redeemAckTimeout.Load()
	redeemAckTimeout.Store(d)
	return func() { redeemAckTimeout.Store(old) }
}

// MaxConcurrentDispatch is how many sendings one peer runs at once.
const MaxConcurrentDispatch = maxConcurrentDispatch

// SetControlWriteTimeout sets the stream-0 write deadline of sessions
// dialed from now on (quicpeer.Limits.ControlWriteTimeout); call the
// returned func to restore it.
func SetControlWriteTimeout(d time.Duration) (restore func()) {
	old := controlWriteTimeout.Load()
	controlWriteTimeout.Store(d)
	return func() { controlWriteTimeout.Store(old) }
}

// HoldCreateCommit makes every Upload wait, before it builds its Create
// batch, until cond holds for the uncommitted document (checked under the
// bridge's lock every 5 ms, at most timeout): peer statuses of pipelined
// chunks then arrive before the commit. held reports whether cond held
// before the timeout every time. Call restore before the bridge closes.
func HoldCreateCommit(cond func(claims int, ents []*gatewayv1.Entity) bool, timeout time.Duration) (restore func(), held func() bool) {
	var ok atomic.Bool
	ok.Store(true)
	testHookBeforeCreateCommit = func(b *Bridge, d *docRun) {
		deadline := time.Now().Add(timeout)
		for {
			d.lock()
			ents := make([]*gatewayv1.Entity, 0, len(d.att.ents))
			for _, e := range d.att.ents {
				ents = append(ents, proto.Clone(e).(*gatewayv1.Entity))
			}
			done := cond(len(d.claims), ents)
			d.unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				ok.Store(false)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return func() { testHookBeforeCreateCommit = nil }, ok.Load
}

// OnDetached calls fn each time a flush detached a DEFERRED entity with a
// durable claim from the GOAWAY drain; call restore before the bridge
// closes.
func OnDetached(fn func()) (restore func()) {
	testHookDetached.Store(&fn)
	return func() { testHookDetached.Store(nil) }
}

// SessionHeld counts what the bridge's sessions hold for documents: entity
// mappings and DEHYDRATING parents awaiting a scope.
func (b *Bridge) SessionHeld() (ents, dehyd int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ss := range b.sessions {
		ents += len(ss.ents)
		dehyd += len(ss.dehyd) + len(ss.lastDehyd)
	}
	return ents, dehyd
}

// PruneStoreBelow deletes the events below seq in the store directly, as
// another replica sharing the store would (this bridge's event log does
// not learn of it).
func (b *Bridge) PruneStoreBelow(ctx context.Context, seq uint64) error {
	_, err := b.st.PruneEvents(ctx, seq)
	return err
}

// OnDialing calls fn before each dial of a peer, once the dial has read
// the peer's CA file, with the peer's address; call restore before the
// bridge closes.
func OnDialing(fn func(addr string)) (restore func()) {
	testHookDialing.Store(&fn)
	return func() { testHookDialing.Store(nil) }
}
