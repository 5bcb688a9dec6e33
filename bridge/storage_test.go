package bridge_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// countingStore is a real store (SQLite in its own directory) that counts
// the streamed payloads the bridge creates and opens through the interface.
type countingStore struct {
	bridge.Store
	created, opened [3]atomic.Int32 // by PayloadKind
}

func (c *countingStore) CreatePayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadWriter, error) {
	c.created[kind].Add(1)
	return c.Store.CreatePayload(ctx, docID, kind)
}

func (c *countingStore) OpenPayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadReader, error) {
	c.opened[kind].Add(1)
	return c.Store.OpenPayload(ctx, docID, kind)
}

// TestOptionsStorePlugsInABackend: with Options.Store the bridge keeps its
// documents, events and payload bytes in that store (none in DataDir),
// spools an upload and stores a large result as streamed payloads through
// the interface, serves the result from it, and closes it on Close.
func TestOptionsStorePlugsInABackend(t *testing.T) {
	storeDir := t.TempDir()
	sq, err := sqlite.Open(context.Background(), storeDir, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: sq}
	e := newEnv(t, withBridgeOpts(func(o *bridge.Options) { o.Store = cs }))
	e.waitReady()
	content := textOf(4000) // larger than the inline limits: spooled, result streamed
	doc, err := e.b.Upload(context.Background(), "", &gatewayv1.SubmitOptions{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 16 << 10}}, bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.wait(doc.Id, 30*time.Second); got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, content) {
		t.Fatalf("result differs (%d vs %d bytes)", len(res), len(content))
	}
	if c, r, o := cs.created[store.PayloadContent].Load(), cs.created[store.PayloadResult].Load(), cs.opened[store.PayloadResult].Load(); c != 1 || r != 1 || o < 1 {
		t.Fatalf("payloads through the interface: %d content, %d result created, result opened %d times; want 1, 1, >= 1", c, r, o)
	}
	rec, err := sq.GetDocument(context.Background(), "", doc.Id, false)
	if err != nil || !rec.ResultPayload || rec.Doc.GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("the plugged-in store's record: %+v, %v", rec, err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "gateway.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the bridge opened its own SQLite store in DataDir as well: %v", err)
	}
	e.closeBridge()
	if _, err := sq.Commit(context.Background(), &store.Batch{}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("the store after bridge.Close: Commit = %v, want ErrClosed", err)
	}
}
