package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
)

// States of a blobs row.
const (
	blobWriting    = 0 // being written (PayloadWriter before Sync)
	blobSynced     = 1 // the document's payload of its kind
	blobSuperseded = 2 // replaced by a later Sync; kept for open readers
)

// The statements on blobs that name a document find its rows through
// blobs_doc (schema migration 6) in every plan; before it, RemovePayload
// read every blob, and OpenPayload and Sync did under the generic plan
// (TestPayloadStatementsScanNoHistory).
const (
	openPayloadSQL   = "SELECT blob_id, size, chunk_size FROM blobs WHERE doc_id = $1 AND kind = $2 AND state = $3"
	removePayloadSQL = "DELETE FROM blobs WHERE doc_id = $1 AND kind = $2"
	supersedeSQL     = "UPDATE blobs SET state = $1, touched = $2 WHERE doc_id = $3 AND kind = $4 AND state = $5"
	// removeStaleSQL names the synced state as a literal, not a
	// parameter: only then does its condition imply the predicate of the
	// partial index blobs_unsynced under the generic plan too, which
	// otherwise read every blob after every Sync.
	removeStaleSQL = "DELETE FROM blobs WHERE state <> " + blobSyncedSQL + " AND touched < $1"
	blobSyncedSQL  = "1" // blobSynced, as SQL text (TestBlobSyncedSQL)
)

// kindName names a payload kind in messages.
func kindName(kind store.PayloadKind) string {
	switch kind {
	case store.PayloadContent:
		return "content"
	case store.PayloadResult:
		return "result"
	}
	return fmt.Sprintf("kind %d", int32(kind))
}

func checkKind(kind store.PayloadKind) error {
	if kind != store.PayloadContent && kind != store.PayloadResult {
		return fmt.Errorf("%w: unknown payload kind %d", store.ErrInvalid, int32(kind))
	}
	return nil
}

// CreatePayload starts a streamed payload of docID (see PayloadWriter).
// docID is 1..128 octets of [A-Za-z0-9_-] and kind PayloadContent or
// PayloadResult, else ErrInvalid.
func (s *Store) CreatePayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadWriter, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	if err := validDocID(docID); err != nil {
		return nil, err
	}
	if err := checkKind(kind); err != nil {
		return nil, err
	}
	w := &PayloadWriter{s: s, docID: docID, kind: int32(kind), name: fmt.Sprintf("%s of %s", kindName(kind), docID)}
	err := s.pool.QueryRow(ctx, `INSERT INTO blobs (doc_id, kind, state, chunk_size, touched)
		VALUES ($1, $2, $3, $4, $5) RETURNING blob_id`, docID, int32(kind), blobWriting, PayloadChunkSize, time.Now().UnixNano()).Scan(&w.id)
	if err != nil {
		return nil, mapErr(fmt.Sprintf("create payload %s", w.name), err)
	}
	return w, nil
}

// OpenPayload opens docID's synced payload of kind (ErrNotFound if none).
// The reader reads the payload as synced when it was opened: a later Sync
// supersedes it without deleting it for staleBlobAge.
func (s *Store) OpenPayload(ctx context.Context, docID string, kind store.PayloadKind) (store.PayloadReader, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	if err := validDocID(docID); err != nil {
		return nil, err
	}
	if err := checkKind(kind); err != nil {
		return nil, err
	}
	r := &PayloadReader{s: s, curN: -1}
	err := s.pool.QueryRow(ctx, openPayloadSQL, docID, int32(kind), blobSynced).Scan(&r.id, &r.size, &r.chunkSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s payload of %s", store.ErrNotFound, kindName(kind), docID)
	} else if err != nil {
		return nil, mapErr(fmt.Sprintf("open %s payload of %s", kindName(kind), docID), err)
	}
	if r.chunkSize <= 0 {
		return nil, fmt.Errorf("pgstore: %s payload of %s: bad chunk size %d", kindName(kind), docID, r.chunkSize)
	}
	return r, nil
}

// RemovePayload deletes docID's payload of kind, synced, superseded or
// being written (missing is fine).
func (s *Store) RemovePayload(ctx context.Context, docID string, kind store.PayloadKind) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.wg.Done()
	if err := validDocID(docID); err != nil {
		return err
	}
	if err := checkKind(kind); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, removePayloadSQL, docID, int32(kind)); err != nil {
		return mapErr(fmt.Sprintf("remove %s payload of %s", kindName(kind), docID), err)
	}
	return nil
}

// PayloadWriter is a payload being written (store.PayloadWriter): bytes are
// buffered up to PayloadChunkSize and each full chunk is committed as one
// row of an unsynced blob, so at most one chunk is in memory. Sync writes
// the last chunk and makes the blob the document's payload of its kind in
// one transaction (the previous one becomes superseded); until then
// readers see the previous payload or none. Abort deletes it. Not safe for
// concurrent use. A blob left unsynced by a crash, and a superseded one,
// is deleted after staleBlobAge by the next Open or Sync of any replica.
// PostgreSQL's disk_full error (SQLSTATE 53100) wraps syscall.ENOSPC.
type PayloadWriter struct {
	s      *Store
	id     int64
	docID  string
	kind   int32
	name   string
	buf    []byte
	chunks int32
	size   int64
	done   bool
}

// Write appends b (io.Writer); full chunks are stored as they fill.
func (w *PayloadWriter) Write(b []byte) (int, error) {
	if w.done {
		return 0, fmt.Errorf("%w: %s", errPayloadDone, w.name)
	}
	if w.size+int64(len(b)) > MaxPayloadSize {
		return 0, fmt.Errorf("%w: payload %s would exceed %d bytes", store.ErrInvalid, w.name, int64(MaxPayloadSize))
	}
	n := 0
	for len(b) > 0 {
		if w.buf == nil {
			w.buf = make([]byte, 0, PayloadChunkSize)
		}
		k := min(len(b), PayloadChunkSize-len(w.buf))
		w.buf = append(w.buf, b[:k]...)
		b, n = b[k:], n+k
		w.size += int64(k)
		if len(w.buf) == PayloadChunkSize {
			if err := w.flush(context.Background()); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// flush stores the buffered chunk.
func (w *PayloadWriter) flush(ctx context.Context) error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.s.pool.Exec(ctx, `WITH c AS (INSERT INTO blob_chunks (blob_id, n, data) VALUES ($1, $2, $3))
		UPDATE blobs SET touched = $4 WHERE blob_id = $1`, w.id, w.chunks, w.buf, time.Now().UnixNano())
	if err != nil {
		return mapErr(fmt.Sprintf("write payload %s chunk %d", w.name, w.chunks), err)
	}
	w.chunks++
	w.buf = w.buf[:0]
	return nil
}

// Size is the number of bytes written so far.
func (w *PayloadWriter) Size() int64 { return w.size }

// Sync stores the last chunk and publishes the payload atomically: the
// document's previous payload of this kind is superseded in the same
// transaction. Call it before the Commit that records Path. For a document
// whose lease this Store holds, the transaction first checks (and locks
// until COMMIT) that the row still names this replica at its epoch: a
// deposed owner's payload never becomes visible; Sync then discards it and
// answers a *store.LeaseLostError (lease.go, payloadFence).
func (w *PayloadWriter) Sync() error {
	if w.done {
		return fmt.Errorf("%w: %s", errPayloadDone, w.name)
	}
	w.done = true
	ctx := context.Background()
	if err := w.flush(ctx); err != nil {
		w.discard()
		return err
	}
	w.buf = nil
	fence, err := w.s.lease.payloadFence(w.docID, time.Now())
	if err != nil {
		w.discard()
		w.s.lease.lostByWrite(err)
		return err
	}
	err = pgx.BeginFunc(ctx, w.s.pool, func(tx pgx.Tx) error {
		if err := fence.check(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, supersedeSQL, blobSuperseded, time.Now().UnixNano(), w.docID, w.kind, blobSynced); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, "UPDATE blobs SET state = $1, size = $2 WHERE blob_id = $3 AND state = $4", blobSynced, w.size, w.id, blobWriting)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("the unsynced payload was removed meanwhile (RemovePayloads, or a replica's stale cleanup)")
		}
		return err
	})
	if err != nil {
		w.discard()
		if errors.Is(err, store.ErrLeaseLost) {
			w.s.lease.lostByWrite(err)
			return err
		}
		return mapErr("sync payload "+w.name, err)
	}
	if err := w.s.removeStaleBlobs(ctx); err != nil {
		w.s.log.Warn("pgstore: removing stale payloads", "err", err)
	}
	return nil
}

// Abort discards the payload. Safe after Sync (then a no-op).
func (w *PayloadWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.buf = nil
	return w.discard()
}

func (w *PayloadWriter) discard() error {
	if _, err := w.s.pool.Exec(context.Background(), "DELETE FROM blobs WHERE blob_id = $1", w.id); err != nil {
		return fmt.Errorf("pgstore: discard payload %s: %w", w.name, err)
	}
	return nil
}

// PayloadReader streams a synced payload chunk by chunk: it holds at most one
// chunk (PayloadChunkSize) in memory. It implements io.Reader, io.ReaderAt
// (safe for concurrent use), io.Seeker and io.Closer. The payload it reads
// stays readable while it is open only as long as nobody replaces or removes
// it; a chunk gone meanwhile is an error, never wrong bytes.
type PayloadReader struct {
	s         *Store
	id        int64
	size      int64
	chunkSize int64

	mu    sync.Mutex // guards cur, curN (ReadAt may run concurrently)
	cur   []byte
	curN  int64 // chunk number in cur; -1 none
	off   int64 // Read/Seek position
	close bool
}

// Size is the payload's length in bytes.
func (r *PayloadReader) Size() int64 { return r.size }

// chunk returns chunk n (r.mu held).
func (r *PayloadReader) chunk(n int64) ([]byte, error) {
	if r.curN == n {
		return r.cur, nil
	}
	var data []byte
	err := r.s.pool.QueryRow(context.Background(), "SELECT data FROM blob_chunks WHERE blob_id = $1 AND n = $2", r.id, n).Scan(&data)
	if err != nil {
		return nil, fmt.Errorf("pgstore: read payload chunk %d: %w", n, err)
	}
	want := min(r.chunkSize, r.size-n*r.chunkSize)
	if int64(len(data)) != want {
		return nil, fmt.Errorf("pgstore: payload chunk %d has %d bytes, want %d", n, len(data), want)
	}
	r.cur, r.curN = data, n
	return data, nil
}

// ReadAt reads len(p) bytes at off (io.ReaderAt).
func (r *PayloadReader) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.close {
		return 0, fmt.Errorf("pgstore: read of a closed payload")
	}
	if off < 0 {
		return 0, fmt.Errorf("pgstore: negative offset %d", off)
	}
	n := 0
	for n < len(p) {
		if off >= r.size {
			return n, io.EOF
		}
		c, err := r.chunk(off / r.chunkSize)
		if err != nil {
			return n, err
		}
		k := copy(p[n:], c[off%r.chunkSize:])
		n += k
		off += int64(k)
	}
	return n, nil
}

// Read reads from the current position (io.Reader).
func (r *PayloadReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	off := r.off
	r.mu.Unlock()
	if off >= r.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.size-off)]
	n, err := r.ReadAt(p, off)
	r.mu.Lock()
	r.off += int64(n)
	r.mu.Unlock()
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Seek sets the position for Read (io.Seeker).
func (r *PayloadReader) Seek(offset int64, whence int) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = r.off + offset
	case io.SeekEnd:
		abs = r.size + offset
	default:
		return 0, fmt.Errorf("pgstore: bad whence %d", whence)
	}
	if abs < 0 {
		return 0, fmt.Errorf("pgstore: seek to negative position %d", abs)
	}
	r.off = abs
	return abs, nil
}

// Close releases the chunk buffer.
func (r *PayloadReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.close, r.cur = true, nil
	return nil
}

// removeStaleBlobs deletes blobs left unsynced (a crashed replica's upload)
// or superseded for staleBlobAge.
func (s *Store) removeStaleBlobs(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, removeStaleSQL, time.Now().Add(-staleBlobAge).UnixNano())
	if err != nil {
		return fmt.Errorf("pgstore: remove stale payloads: %w", err)
	}
	return nil
}

// validDocID accepts the ids the SQLite store accepts for payloads:
// 1..maxDocIDLen bytes of [A-Za-z0-9_-].
func validDocID(id string) error {
	if id == "" || len(id) > maxDocIDLen {
		return fmt.Errorf("%w: document id must be 1..%d characters", store.ErrInvalid, maxDocIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%w: document id %q may only contain A-Z a-z 0-9 - _", store.ErrInvalid, id)
		}
	}
	return nil
}
