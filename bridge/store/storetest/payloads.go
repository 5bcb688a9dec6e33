package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
)

// testInlinePayloads: a payload row commits and rolls back with its batch,
// and a nil Body deletes it.
func testInlinePayloads(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d1", base),
		Payloads: []store.PayloadRecord{{DocID: "d1", Kind: store.PayloadContent, Body: []byte("content")}}})
	if got, err := s.GetPayload(ctx, "t", "d1", store.PayloadContent); err != nil || string(got) != "content" {
		t.Fatalf("GetPayload = %q, %v", got, err)
	}
	_, err := s.GetPayload(ctx, "t", "d1", store.PayloadResult)
	wantErr(t, "absent inline result", err, store.ErrNotFound)
	stale := newDoc("t", "d1", base)
	_, err = s.Commit(ctx, &store.Batch{Updates: []store.DocumentUpdate{{Record: stale, PrevRev: 9}},
		Payloads: []store.PayloadRecord{{DocID: "d1", Kind: store.PayloadResult, Body: []byte("result")}}})
	wantErr(t, "stale update with a payload", err, store.ErrStaleRev)
	_, err = s.GetPayload(ctx, "t", "d1", store.PayloadResult)
	wantErr(t, "payload of a failed batch", err, store.ErrNotFound)
	mustCommit(t, s, &store.Batch{Payloads: []store.PayloadRecord{{DocID: "d1", Kind: store.PayloadContent},
		{DocID: "d1", Kind: store.PayloadResult, Body: []byte("result")}}})
	_, err = s.GetPayload(ctx, "t", "d1", store.PayloadContent)
	wantErr(t, "deleted inline content", err, store.ErrNotFound)
	if got, err := s.GetPayload(ctx, "t", "d1", store.PayloadResult); err != nil || string(got) != "result" {
		t.Fatalf("GetPayload(result) = %q, %v", got, err)
	}
}

// writePayload streams p to a new payload in pieces of piece octets and
// syncs it.
func writePayload(t *testing.T, s Store, docID string, kind store.PayloadKind, p []byte, piece int) {
	t.Helper()
	w, err := s.CreatePayload(context.Background(), docID, kind)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(p); off += piece {
		if _, err := w.Write(p[off:min(off+piece, len(p))]); err != nil {
			w.Abort()
			t.Fatal(err)
		}
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readPayload(t *testing.T, s Store, docID string, kind store.PayloadKind) ([]byte, error) {
	t.Helper()
	r, err := s.OpenPayload(context.Background(), docID, kind)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err == nil && int64(len(b)) != r.Size() {
		t.Fatalf("payload %s/%v: read %d octets, Size says %d", docID, kind, len(b), r.Size())
	}
	return b, err
}

// testStreamedPayloads: nothing is visible before Sync; Abort discards; a
// second Sync replaces; content and result are separate; RemovePayload;
// invalid ids and kinds are ErrInvalid.
func testStreamedPayloads(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	w, err := s.CreatePayload(ctx, "d1", store.PayloadContent)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, "hello ")
	io.WriteString(w, "world")
	_, err = s.OpenPayload(ctx, "d1", store.PayloadContent)
	wantErr(t, "payload before Sync", err, store.ErrNotFound)
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("Write after Sync succeeded")
	}
	if err := w.Abort(); err != nil {
		t.Fatalf("Abort after Sync: %v", err)
	}
	if got, err := readPayload(t, s, "d1", store.PayloadContent); err != nil || string(got) != "hello world" {
		t.Fatalf("content = %q, %v", got, err)
	}
	_, err = s.OpenPayload(ctx, "d1", store.PayloadResult)
	wantErr(t, "result never written", err, store.ErrNotFound)

	a, err := s.CreatePayload(ctx, "d1", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(a, "partial")
	if err := a.Abort(); err != nil {
		t.Fatal(err)
	}
	_, err = s.OpenPayload(ctx, "d1", store.PayloadResult)
	wantErr(t, "aborted result", err, store.ErrNotFound)

	old, err := s.OpenPayload(ctx, "d1", store.PayloadContent)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	writePayload(t, s, "d1", store.PayloadContent, []byte("replaced"), 3)
	if got, err := readPayload(t, s, "d1", store.PayloadContent); err != nil || string(got) != "replaced" {
		t.Fatalf("content after a second Sync = %q, %v", got, err)
	}
	if got, err := io.ReadAll(old); err != nil || string(got) != "hello world" {
		t.Fatalf("a reader opened before the replacement read %q, %v; want the old payload", got, err)
	}

	if err := s.RemovePayload(ctx, "d1", store.PayloadContent); err != nil {
		t.Fatal(err)
	}
	_, err = s.OpenPayload(ctx, "d1", store.PayloadContent)
	wantErr(t, "removed payload", err, store.ErrNotFound)
	if err := s.RemovePayload(ctx, "d1", store.PayloadContent); err != nil {
		t.Fatalf("removing a missing payload: %v", err)
	}
	for _, bad := range []string{"", "../x", "a/b", "a.b", string(make([]byte, 200))} {
		_, err := s.CreatePayload(ctx, bad, store.PayloadContent)
		wantErr(t, "CreatePayload("+bad+")", err, store.ErrInvalid)
		_, err = s.OpenPayload(ctx, bad, store.PayloadContent)
		wantErr(t, "OpenPayload("+bad+")", err, store.ErrInvalid)
	}
	_, err = s.CreatePayload(ctx, "d1", store.PayloadKind(9))
	wantErr(t, "unknown payload kind", err, store.ErrInvalid)
}

// testLargePayload: 24 MiB written in 64 KiB pieces reads back identical,
// whole, by ReadAt at odd offsets and after Seek.
func testLargePayload(t *testing.T, b Backend) {
	s, _ := open(t, b)
	p := make([]byte, 24<<20+12345)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(p); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8 && i+k < len(p); k++ {
			p[i+k] = byte(v >> (8 * k))
		}
	}
	writePayload(t, s, "big", store.PayloadResult, p, 64<<10)
	r, err := s.OpenPayload(context.Background(), "big", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Size() != int64(len(p)) {
		t.Fatalf("Size = %d, want %d", r.Size(), len(p))
	}
	h := sha256.New()
	if n, err := io.CopyBuffer(h, r, make([]byte, 32<<10)); err != nil || n != int64(len(p)) {
		t.Fatalf("read %d octets, %v", n, err)
	}
	if want := sha256.Sum256(p); !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("the payload read back differs from the one written")
	}
	buf := make([]byte, 100001)
	for _, off := range []int64{0, 1, 65535, 12 << 20, int64(len(p)) - int64(len(buf))} {
		if _, err := r.ReadAt(buf, off); err != nil || !bytes.Equal(buf, p[off:off+int64(len(buf))]) {
			t.Fatalf("ReadAt(%d): %v or wrong bytes", off, err)
		}
	}
	if _, err := r.Seek(int64(len(p))-10, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if tail, err := io.ReadAll(r); err != nil || !bytes.Equal(tail, p[len(p)-10:]) {
		t.Fatalf("after Seek: %x, %v", tail, err)
	}
}
