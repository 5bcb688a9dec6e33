package sqlite_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Inline payloads (migration 3) commit with the batch that carries them,
// are scoped to the document's tenant, survive a reopen, and are deleted by
// a nil Body.
func TestInlinePayloads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir, sqlite.Options{})
	content := bytes.Repeat([]byte("c"), 4096)
	rec := newDoc("t", "d1", base)
	rec.ContentPayload = false
	mustCommit(t, s, &store.Batch{Create: rec, Payloads: []store.PayloadRecord{{DocID: "d1", Kind: store.PayloadContent, Body: content}}})

	got, err := s.GetPayload(ctx, "t", "d1", store.PayloadContent)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("GetPayload(content) = %d bytes, %v; want the 4096 committed bytes", len(got), err)
	}
	if _, err := s.GetPayload(ctx, "other", "d1", store.PayloadContent); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's GetPayload: %v, want ErrNotFound", err)
	}
	if _, err := s.GetPayload(ctx, "t", "d1", store.PayloadResult); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetPayload(result) before one was stored: %v, want ErrNotFound", err)
	}

	// The terminal update stores the result and drops the content in one
	// batch; an empty result is a result, not a missing one.
	up := newDoc("t", "d1", base)
	up.Doc.State, up.Doc.Rev = gatewayv1.State_SUCCEEDED, 2
	mustCommit(t, s, &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: 1}}, Payloads: []store.PayloadRecord{
		{DocID: "d1", Kind: store.PayloadResult, Body: []byte{}},
		{DocID: "d1", Kind: store.PayloadContent},
	}})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, sqlite.Options{})
	if got, err := s.GetPayload(ctx, "t", "d1", store.PayloadResult); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("GetPayload(empty result) after reopen = %v, %v; want a non-nil empty slice", got, err)
	}
	if _, err := s.GetPayload(ctx, "t", "d1", store.PayloadContent); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetPayload(content) after a nil-Body delete: %v, want ErrNotFound", err)
	}
}

// A payload whose batch fails is not stored: it is part of the batch, not a
// separate write.
func TestInlinePayloadRollsBackWithBatch(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, t.TempDir(), sqlite.Options{})
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base)})
	stale := newDoc("t", "d1", base)
	stale.Doc.Rev = 3
	_, err := s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: stale, PrevRev: 2}},
		Payloads: []store.PayloadRecord{{DocID: "d1", Kind: store.PayloadResult, Body: []byte("r")}}})
	if !errors.Is(err, store.ErrStaleRev) {
		t.Fatalf("stale update: %v, want ErrStaleRev", err)
	}
	if _, err := s.GetPayload(ctx, "t", "d1", store.PayloadResult); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("payload of a failed batch: %v, want ErrNotFound", err)
	}
	// A payload of a document that does not exist fails its batch.
	if _, err := s.Commit(ctx, &store.Batch{Payloads: []store.PayloadRecord{{DocID: "nope", Kind: store.PayloadResult, Body: []byte("r")}}}); err == nil {
		t.Fatal("a payload of a missing document committed")
	}
	if _, err := s.Commit(ctx, &store.Batch{Payloads: []store.PayloadRecord{{DocID: "d1", Kind: 9, Body: []byte("r")}}}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("unknown payload kind: %v, want ErrInvalid", err)
	}
}
