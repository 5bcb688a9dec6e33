package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestPayloadChunkedRoundTrip: a payload of several chunks plus a tail is
// stored as PayloadChunkSize rows, invisible until Sync, and read back
// byte-identical through Read, ReadAt and Seek — from another replica.
func TestPayloadChunkedRoundTrip(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	want := make([]byte, 3*pgstore.PayloadChunkSize+12345)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(r.Uint32())
	}
	w, err := a.CreatePayload(ctx, "doc-1", store.PayloadContent)
	if err != nil {
		t.Fatal(err)
	}
	// Odd write sizes cross chunk boundaries.
	for rest := want; len(rest) > 0; {
		n := min(len(rest), 100000)
		if _, err := w.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	if _, err := b.OpenPayload(ctx, "doc-1", store.PayloadContent); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("open before Sync: %v, want ErrNotFound", err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("Write after Sync succeeded")
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var chunks, maxLen int
	if err := c.QueryRow(ctx, "SELECT count(*), max(length(data)) FROM blob_chunks").Scan(&chunks, &maxLen); err != nil {
		t.Fatal(err)
	}
	if chunks != 4 || maxLen != pgstore.PayloadChunkSize {
		t.Fatalf("stored %d chunks of at most %d bytes, want 4 of at most %d", chunks, maxLen, pgstore.PayloadChunkSize)
	}
	rd, err := b.OpenPayload(ctx, "doc-1", store.PayloadContent)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Size() != int64(len(want)) {
		t.Fatalf("Size %d, want %d", rd.Size(), len(want))
	}
	got, err := io.ReadAll(rd)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("ReadAll: %d bytes, equal %v, err %v", len(got), bytes.Equal(got, want), err)
	}
	off := int64(pgstore.PayloadChunkSize - 10)
	part := make([]byte, 30)
	if n, err := rd.ReadAt(part, off); err != nil || n != 30 || !bytes.Equal(part, want[off:off+30]) {
		t.Fatalf("ReadAt across a chunk boundary: %d, %v", n, err)
	}
	if _, err := rd.Seek(-5, io.SeekEnd); err != nil {
		t.Fatal(err)
	}
	tail, _ := io.ReadAll(rd)
	if !bytes.Equal(tail, want[len(want)-5:]) {
		t.Fatalf("after Seek(-5, End): %x", tail)
	}
}

// TestPayloadReplaceKeepsOpenReader: a reader keeps reading the payload it
// opened when a later Sync replaces it; new readers get the new one.
// RemovePayload removes it; Abort leaves nothing.
func TestPayloadReplaceKeepsOpenReader(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	put := func(body string) {
		w, err := s.CreatePayload(ctx, "d", store.PayloadResult)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	put("first")
	old, err := s.OpenPayload(ctx, "d", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	put("second")
	if got, err := io.ReadAll(old); err != nil || string(got) != "first" {
		t.Fatalf("open reader after replacement: %q, %v", got, err)
	}
	nr, err := s.OpenPayload(ctx, "d", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(nr); string(got) != "second" {
		t.Fatalf("new reader: %q", got)
	}
	w, err := s.CreatePayload(ctx, "e", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("gone"))
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenPayload(ctx, "e", store.PayloadResult); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("aborted payload: %v, want ErrNotFound", err)
	}
	if err := s.RemovePayload(ctx, "d", store.PayloadResult); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenPayload(ctx, "d", store.PayloadResult); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("removed payload: %v, want ErrNotFound", err)
	}
	for _, bad := range []string{"", "../x", "a b"} {
		if _, err := s.CreatePayload(ctx, bad, store.PayloadContent); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreatePayload(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := s.CreatePayload(ctx, "d", 9); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("CreatePayload kind 9: %v, want ErrInvalid", err)
	}
}
