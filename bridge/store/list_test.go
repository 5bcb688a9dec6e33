package store_test

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
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestListDocumentsPagination(t *testing.T) {
	s := openStore(t, t.TempDir(), store.Options{})
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

func TestPayloadFiles(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, store.Options{})
	p, err := s.CreateSpool("doc-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenSpool("doc-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("spool visible before Sync: %v", err)
	}
	io.WriteString(p, "hello ")
	io.WriteString(p, "world")
	if p.Size() != 11 || p.Path() != s.SpoolPath("doc-1") || p.Path() != filepath.Join(dir, "spool", "doc-1.bin") {
		t.Fatalf("size %d path %s", p.Size(), p.Path())
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	f, err := s.OpenSpool("doc-1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "hello world" {
		t.Fatalf("spool content %q", b)
	}

	r, err := s.CreateResult("doc-1")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(r, "partial")
	if err := r.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenResult("doc-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("aborted result visible: %v", err)
	}

	for _, bad := range []string{"", "../x", "a/b", "a.b", string(make([]byte, 200))} {
		if _, err := s.CreateSpool(bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreateSpool(%q): %v, want ErrInvalid", bad, err)
		}
	}

	// A temporary file left by a crash is removed on the next Open.
	if _, err := s.CreateResult("doc-2"); err != nil { // never synced or aborted
		t.Fatal(err)
	}
	s.Close()
	openStore(t, dir, store.Options{})
	for _, sub := range []string{"spool", "results"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range ents {
			if filepath.Ext(e.Name()) == ".tmp" {
				t.Fatalf("stale temporary %s/%s survived Open", sub, e.Name())
			}
		}
	}
	if err := s.RemovePayloads("doc-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "spool", "doc-1.bin")); !os.IsNotExist(err) {
		t.Fatalf("spool not removed: %v", err)
	}
}
