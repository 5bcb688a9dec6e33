package bridge_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// payloadFiles lists the spool or result files of the bridge's data dir.
func payloadFiles(t *testing.T, dir, sub string) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, sub))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		out[e.Name()] = true
	}
	return out
}

// A small whole document creates no spool file: its content is committed
// inline with the record, survives a restart, is re-dispatched from the
// row, and its small result is served from the store. A whole document
// above the inline size keeps its spool and result files. Once terminal,
// the inline content row is gone (like a removed spool file) and the
// inline result stays.
func TestSmallDocumentsInline(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	small := pseudoRandom(4<<10, 21)
	medium := pseudoRandom(200<<10, 22) // whole (under InlineThreshold) but spooled
	e.stopPeer()
	sd := e.submit(small, nil)
	md := e.submit(medium, nil)
	spool := payloadFiles(t, e.dir, "spool")
	if spool[sd.Id+".bin"] || !spool[md.Id+".bin"] || len(spool) != 1 {
		t.Fatalf("spool files %v: want only the 200 KiB document's (%s), not the 4 KiB one's (%s)", spool, md.Id, sd.Id)
	}
	e.closeBridge()

	st, err := sqlite.Open(context.Background(), e.dir, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.GetPayload(context.Background(), "", sd.Id, store.PayloadContent)
	st.Close()
	if err != nil || !bytes.Equal(got, small) {
		t.Fatalf("inline content after the Submit returned: %d bytes, %v; want the 4 KiB submitted", len(got), err)
	}

	e.startPeer()
	e.startBridge()
	for id, content := range map[string][]byte{sd.Id: small, md.Id: medium} {
		doc := e.wait(id, 30*time.Second)
		if doc.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("%s: state %s error %q", id, doc.State, doc.Error)
		}
		if doc.ResultSizeBytes != uint64(len(content)) {
			t.Fatalf("%s: result_size_bytes %d, want %d", id, doc.ResultSizeBytes, len(content))
		}
		if res := e.result(id); !bytes.Equal(res, content) {
			t.Fatalf("%s: result differs after restart (%d bytes, want %d)", id, len(res), len(content))
		}
	}
	results := payloadFiles(t, e.dir, "results")
	if results[sd.Id+".bin"] || !results[md.Id+".bin"] {
		t.Fatalf("result files %v: want the 200 KiB document's only", results)
	}
	e.closeBridge()
	st, err = sqlite.Open(context.Background(), e.dir, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.GetPayload(context.Background(), "", sd.Id, store.PayloadContent); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("inline content of a SUCCEEDED document: %v, want it deleted with the terminal state", err)
	}
	if r, err := st.GetPayload(context.Background(), "", sd.Id, store.PayloadResult); err != nil || !bytes.Equal(r, small) {
		t.Fatalf("inline result: %d bytes, %v", len(r), err)
	}
}
