package bridge_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// heldStore is a store whose commits reach the event log's tail only when
// released: while held, the hook's records are queued (in order) and the
// writer goes on, so a reader of the store sees rows the tail has not
// published yet, as it does for a moment after every commit.
type heldStore struct {
	*sqlite.Store
	mu     sync.Mutex
	hook   func([]store.EventRecord)
	held   bool
	queued [][]store.EventRecord
}

func (h *heldStore) SetEventHook(fn func([]store.EventRecord)) {
	h.mu.Lock()
	h.hook = fn
	h.mu.Unlock()
	if fn == nil {
		h.Store.SetEventHook(nil)
		return
	}
	h.Store.SetEventHook(h.onCommit)
}

func (h *heldStore) onCommit(recs []store.EventRecord) {
	h.mu.Lock()
	if h.held {
		h.queued = append(h.queued, recs)
		h.mu.Unlock()
		return
	}
	fn := h.hook
	h.mu.Unlock()
	fn(recs)
}

func (h *heldStore) hold() {
	h.mu.Lock()
	h.held = true
	h.mu.Unlock()
}

// release publishes the queued commits in order and stops holding.
func (h *heldStore) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, recs := range h.queued {
		h.hook(recs)
	}
	h.queued, h.held = nil, false
}

// TestWatchResumedSeesUnpublishedTerminal: a watch resumed from a cursor
// of a document that is terminal in the store while its events are not on
// the tail yet (committed, not yet published when the watch starts) gets
// those events, each with its seq, up to the terminal one. Before, it
// answered the document with no event (seq 0), which a resumed SSE or page
// stream drops as "already seen": the client never saw SUCCEEDED.
func TestWatchResumedSeesUnpublishedTerminal(t *testing.T) {
	sq, err := sqlite.Open(context.Background(), t.TempDir(), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := &heldStore{Store: sq}
	e := newEnv(t, withBridgeOpts(func(o *bridge.Options) { o.Store = hs }))
	e.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := e.submit([]byte("another document's events come first"), nil)
	if s := e.wait(other.Id, 20*time.Second).State; s != gatewayv1.State_SUCCEEDED {
		t.Fatalf("first document %s", s)
	}
	win, err := e.b.Events().Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cursor := win.GetLatestSeq() // another document's event: nothing of doc at or after it is published
	hs.hold()
	doc := e.submit([]byte("terminal in the store before its events are on the tail"), nil)
	if s := e.wait(doc.Id, 20*time.Second).State; s != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s", s)
	}
	var ups []*gatewayv1.WatchDocumentResponse
	wctx := bridge.WithStartHook(ctx, hs.release) // published after the watch fixed its start
	err = e.b.Watch(wctx, "", doc.Id, cursor, func(u *gatewayv1.WatchDocumentResponse) error {
		ups = append(ups, u)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ups) == 0 {
		t.Fatal("no update")
	}
	for i, u := range ups {
		if u.GetEvent().GetSeq() <= cursor {
			t.Fatalf("update %d carries seq %d (event %v), want an event after the cursor %d", i, u.GetEvent().GetSeq(), u.GetEvent(), cursor)
		}
	}
	last := ups[len(ups)-1]
	if last.GetEvent().GetKind() != "#document" || last.GetEvent().GetState() != gatewayv1.State_SUCCEEDED || last.GetDocument().GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("last update: event %v, document state %s; want the terminal #document event", last.GetEvent(), last.GetDocument().GetState())
	}
}
