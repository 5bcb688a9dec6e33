package sqlite_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestListDocumentsPagination(t *testing.T) {
	s := openStore(t, t.TempDir(), sqlite.Options{})
	ctx := context.Background()
	const n = 250
	b := &store.Batch{}
	for i := range n {
		// Three documents share each create time, so the id breaks ties.
		rec := newDoc("t", fmt.Sprintf("doc-%03d", i), base.Add(time.Duration(i/3)*time.Second))
		if i%5 == 0 {
			rec.Doc.State = gatewayv1.State_SUCCEEDED
		}
		if i < 3 {
			b.Create = rec
			mustCommit(t, s, b)
			continue
		}
		mustCommit(t, s, &store.Batch{Create: rec})
	}
	mustCommit(t, s, &store.Batch{Create: newDoc("other", "foreign", base)})

	walk := func(state gatewayv1.State, insertAfterFirst bool) []string {
		t.Helper()
		var ids []string
		tok := ""
		for pages := 0; ; pages++ {
			docs, next, err := s.ListDocuments(ctx, "t", store.ListQuery{State: state, PageSize: 7, PageToken: tok})
			if err != nil {
				t.Fatalf("page %d: %v", pages, err)
			}
			if len(docs) > 7 || (next != "" && len(docs) != 7) {
				t.Fatalf("page %d has %d docs, next %q", pages, len(docs), next)
			}
			for _, d := range docs {
				ids = append(ids, d.Doc.GetId())
			}
			if insertAfterFirst && pages == 0 {
				// Newer than everything: must not shift later pages.
				mustCommit(t, s, &store.Batch{Create: newDoc("t", "late", base.Add(time.Hour))})
			}
			if next == "" {
				return ids
			}
			tok = next
		}
	}
	ids := walk(gatewayv1.State_STATE_UNSPECIFIED, true)
	if len(ids) != n {
		t.Fatalf("visited %d docs, want %d", len(ids), n)
	}
	seen := map[string]bool{}
	for i, id := range ids {
		if seen[id] {
			t.Fatalf("doc %s visited twice", id)
		}
		seen[id] = true
		if want := fmt.Sprintf("doc-%03d", n-1-i); id != want { // create_time desc, id desc
			t.Fatalf("position %d: %s, want %s", i, id, want)
		}
	}

	done := walk(gatewayv1.State_SUCCEEDED, false)
	if len(done) != n/5 {
		t.Fatalf("state filter: %d docs, want %d", len(done), n/5)
	}

	_, next, err := s.ListDocuments(ctx, "t", store.ListQuery{PageSize: 7})
	if err != nil || next == "" {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(next)
	for name, tok := range map[string]string{
		"garbage":       "!!!not-base64",
		"empty payload": base64.RawURLEncoding.EncodeToString([]byte{1}),
		"wrong version": base64.RawURLEncoding.EncodeToString(append([]byte{9}, raw[1:]...)),
		"too long":      base64.RawURLEncoding.EncodeToString(make([]byte, 4096)),
		"other filter":  next, // issued without a state filter
	} {
		q := store.ListQuery{PageSize: 7, PageToken: tok}
		if name == "other filter" {
			q.State = gatewayv1.State_SUCCEEDED
		}
		if _, _, err := s.ListDocuments(ctx, "t", q); !errors.Is(err, store.ErrBadPageToken) {
			t.Errorf("%s token: err = %v, want ErrBadPageToken", name, err)
		}
	}
}

// TestPayloadFiles checks the SQLite backend's file layout of streamed
// payloads (storetest checks their behaviour): <dir>/spool/<id>.bin and
// <dir>/results/<id>.bin, written under a temporary name until Sync, and
// temporaries a crash left behind removed on the next Open.
func TestPayloadFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openStore(t, dir, sqlite.Options{})
	p, err := s.CreatePayload(ctx, "doc-1", store.PayloadContent)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(p, "hello world")
	if _, err := os.Stat(filepath.Join(dir, "spool", "doc-1.bin")); !os.IsNotExist(err) {
		t.Fatalf("spool file exists before Sync: %v", err)
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "spool", "doc-1.bin")); err != nil || string(b) != "hello world" {
		t.Fatalf("spool file: %q, %v", b, err)
	}
	r, err := s.CreatePayload(ctx, "doc-1", store.PayloadResult)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(r, "result")
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "results", "doc-1.bin")); err != nil || string(b) != "result" {
		t.Fatalf("result file: %q, %v", b, err)
	}

	// A temporary file left by a crash is removed on the next Open.
	if _, err := s.CreatePayload(ctx, "doc-2", store.PayloadResult); err != nil { // never synced or aborted
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, dir, sqlite.Options{})
	for _, sub := range []string{"spool", "results"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range ents {
			if filepath.Ext(e.Name()) == ".tmp" {
				t.Fatalf("stale temporary %s/%s survived Open", sub, e.Name())
			}
		}
	}
	if err := s.RemovePayload(ctx, "doc-1", store.PayloadContent); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "spool", "doc-1.bin")); !os.IsNotExist(err) {
		t.Fatalf("spool not removed: %v", err)
	}
}
