package bridge_test

import (
	"fmt"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestFinishedDocumentsReleaseSession: a session outlives its documents, so
// once they are terminal it must hold nothing of them (entity mappings,
// DEHYDRATING parents); before, every finished document's state stayed
// reachable from the session's entity map for the session's lifetime (the
// e2e load test's heap growth). Whole, chunked and layer-1 documents.
func TestFinishedDocumentsReleaseSession(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	var ids []string
	for i := range 20 {
		ids = append(ids, e.submit(fmt.Appendf(nil, "whole document %d", i), &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain"}).Id)
	}
	for range 3 {
		ids = append(ids, e.submit(textOf(50), &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
			Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 512, Processor: "textstats"}}).Id)
		ids = append(ids, e.submit([]byte("First sentence. Second one! Third?\nFourth sentence here. Fifth.\n"), &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
			Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 40, Processor: "sentences", MaxDepth: 1}}).Id)
	}
	for _, id := range ids {
		if got := e.wait(id, 30*time.Second); got.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("document %s: state %s error %q", id, got.State, got.Error)
		}
	}
	// Late statuses of finished documents must not re-register them either:
	// one more document's round trip on the same session is the signal
	// that what the peer sent before its statuses was handled (stream 0 is
	// read in order).
	last := e.submit([]byte("the last one"), &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain"})
	if got := e.wait(last.Id, 30*time.Second); got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("document %s: state %s error %q", last.Id, got.State, got.Error)
	}
	ids = append(ids, last.Id)
	if ents, dehyd := e.b.SessionHeld(); ents != 0 || dehyd != 0 {
		t.Fatalf("after %d finished documents the session still maps %d entities and %d dehydrating parents to them", len(ids), ents, dehyd)
	}
}
