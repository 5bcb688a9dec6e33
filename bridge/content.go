package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/pipestream/gateway/bridge/store"
)

// Where a document's payloads live. A whole document of up to
// maxStoredInline octets keeps its content inline in the store (the Create
// batch that makes the submission durable carries it, store.PayloadContent;
// the record's ContentPayload is then false), and a result of up to maxStoredInline
// octets is committed with the flush that carries the document's terminal
// state (store.PayloadResult; ResultPayload false). Everything larger, and
// every dehydrated document, uses the streamed payloads of the store
// (Store.CreatePayload: files in the SQLite backend).

// contentReader is a document's submitted content: the streamed payload
// or the inline bytes. The caller closes it.
type contentReader interface {
	io.Reader
	io.ReaderAt
	io.Closer
}

type inlineContent struct {
	*bytes.Reader
	b []byte
}

func (inlineContent) Close() error { return nil }

// wholeContent returns all of f for a document sent whole: the inline bytes
// themselves, or a file read into one buffer of the committed size (at
// most maxWholeBytes, checked at submit).
func wholeContent(f contentReader, size int64) ([]byte, error) {
	if c, ok := f.(inlineContent); ok {
		return c.b, nil
	}
	if size < 0 || size > maxWholeBytes {
		return nil, fmt.Errorf("document of %d bytes cannot be sent whole (limit %d)", size, maxWholeBytes)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// openContent opens d's submitted content for (re-)sending: the inline row
// when d.inline, else the spool file. d.inline is fixed once the document
// is committed (or recovered), so no lock is needed.
//
// The first call takes the content held since the commit (d.content), if
// any; later ones (a re-dispatch, a redemption) read the row.
func (env *docEnv) openContent(ctx context.Context, d *docRun) (contentReader, error) {
	if !d.inline {
		return env.st.OpenPayload(ctx, d.id, store.PayloadContent)
	}
	d.lock()
	held := d.content
	d.content = nil
	if held == nil {
		held = d.pending // not committed yet: the store does not have it
	}
	d.unlock()
	if held != nil {
		return inlineContent{bytes.NewReader(held), held}, nil
	}
	body, err := env.st.GetPayload(ctx, string(d.tenant), d.id, store.PayloadContent)
	if err != nil {
		return nil, fmt.Errorf("inline content: %w", err)
	}
	return inlineContent{bytes.NewReader(body), body}, nil
}

// contentExists reports whether d's content survived (restart recovery).
func (b *Bridge) contentExists(ctx context.Context, d *docRun) bool {
	if !d.inline {
		f, err := b.st.OpenPayload(ctx, d.id, store.PayloadContent)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				b.log.Warn("bridge: opening the content of a recovered document", "doc", d.id, "err", err)
			}
			return false
		}
		_ = f.Close()
		return true
	}
	_, err := b.st.GetPayload(ctx, string(d.tenant), d.id, store.PayloadContent)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		b.log.Warn("bridge: reading the inline content of a recovered document", "doc", d.id, "err", err)
	}
	return err == nil
}

// readResult reads a result stream: up to maxStoredInline octets are
// returned in memory (inline != nil) to be committed with the document's
// terminal state; a longer result is written to the streamed result
// payload and synced before it returns (spooled). n is the octets
// received. A failed verification of the stream is returned as err.
//
// declared is the payload length from the entity header: it only sizes the
// first buffer, capped at maxStoredInline+1 octets (never trusted further).
//
// A full disk delays the result file's writes rather than failing them
// (disk, diskfull.go).
func (env *docEnv) readResult(docID string, r io.Reader, declared uint64, disk diskRetry) (inline []byte, spooled bool, n int64, err error) {
	head, err := readUpTo(r, maxStoredInline+1, int(min(declared, maxStoredInline)))
	n = int64(len(head))
	if err != nil {
		return nil, false, n, err
	}
	if len(head) <= maxStoredInline {
		return head, false, n, nil // r is at EOF
	}
	pf, err := createResultRetrying(env.ctx, env.st, docID, disk)
	if err != nil {
		return nil, false, n, err
	}
	w := diskRetryWriter{w: pf, r: disk, dir: env.opts.DataDir}
	if _, err := w.Write(head); err != nil {
		pf.Abort()
		return nil, false, n, err
	}
	m, err := io.Copy(w, r)
	n += m
	if err != nil {
		pf.Abort()
		return nil, false, n, err
	}
	if err := pf.Sync(); err != nil {
		return nil, false, n, err
	}
	return nil, true, n, nil
}

// readUpTo reads r until EOF or until limit octets were read, into one
// buffer sized hint+1 first (one allocation when hint is right, so that the
// read which sees EOF has room) and grown by appending otherwise. Without
// an error, fewer than limit octets mean r is at EOF.
func readUpTo(r io.Reader, limit, hint int) ([]byte, error) {
	b := make([]byte, 0, min(max(hint, 0), limit-1)+1)
	for len(b) < limit {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(cap(b), limit-len(b)))
		}
		n, err := r.Read(b[len(b):min(cap(b), limit)])
		b = b[:len(b)+n]
		if err == io.EOF { //nolint:errorlint // io.Reader returns io.EOF itself; a wrapped one is a verification error
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}
