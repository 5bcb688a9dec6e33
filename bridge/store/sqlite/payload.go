package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pipestream/gateway/bridge/store"
)

// Streamed payloads of the SQLite backend are files next to the database:
// <dir>/spool/<doc-id>.bin (PayloadContent) and <dir>/results/<doc-id>.bin
// (PayloadResult). A payloadFile is written to a temporary name and becomes
// visible only through Sync, which fsyncs the file, renames it into place
// and fsyncs the directory. The documents table keeps the relative file
// name in spool_path / result_path when the record's ContentPayload /
// ResultPayload is set (payloadColumn).

// payloadFile is a PayloadWriter on a temporary file in the payload's
// directory.
//
// Crash behaviour: a temporary file left by a crash is deleted on the next
// Open; a synced file is complete (rename after fsync is atomic).
type payloadFile struct {
	f     *os.File
	final string
	done  bool
}

func (p *payloadFile) Write(b []byte) (int, error) {
	if p.done {
		return 0, fmt.Errorf("store: write to finished payload %s", p.final)
	}
	return p.f.Write(b)
}

// Sync fsyncs the file, closes it, renames it to its final name and fsyncs
// the directory, so the file survives a crash once Sync returns nil.
func (p *payloadFile) Sync() error {
	if p.done {
		return fmt.Errorf("store: payload %s already finished", p.final)
	}
	p.done = true
	tmp := p.f.Name()
	if err := p.f.Sync(); err != nil {
		p.f.Close()
		os.Remove(tmp)
		return fmt.Errorf("store: fsync %s: %w", tmp, err)
	}
	if err := p.f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("store: close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p.final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("store: rename %s: %w", tmp, err)
	}
	return syncDir(filepath.Dir(p.final))
}

// Abort discards the temporary file. Safe after Sync (then a no-op).
func (p *payloadFile) Abort() error {
	if p.done {
		return nil
	}
	p.done = true
	p.f.Close()
	return os.Remove(p.f.Name())
}

// payloadReader is a PayloadReader on a synced payload file. Embedding
// *os.File keeps its WriteTo (io.Copy from it uses sendfile/splice where
// the destination allows).
type payloadReader struct {
	*os.File
	size int64
}

func (p payloadReader) Size() int64 { return p.size }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: fsync dir %s: %w", dir, err)
	}
	return nil
}

// validDocID accepts ids that are safe as file names: 1..maxDocIDLen bytes of
// [A-Za-z0-9_-].
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

const tmpSuffix = ".tmp"

// payloadDir is the directory of kind's files.
func payloadDir(kind store.PayloadKind) (string, error) {
	switch kind {
	case store.PayloadContent:
		return spoolDir, nil
	case store.PayloadResult:
		return resultDir, nil
	}
	return "", fmt.Errorf("%w: %v is neither PayloadContent nor PayloadResult", store.ErrInvalid, kind)
}

// payloadColumn is what spool_path / result_path hold: the file name
// relative to the data directory when the payload is set, else "".
func payloadColumn(dir, docID string, set bool) string {
	if !set {
		return ""
	}
	return dir + "/" + docID + ".bin"
}

// payloadPath checks docID and kind and returns the payload's file name.
func (s *Store) payloadPath(docID string, kind store.PayloadKind) (string, error) {
	if err := validDocID(docID); err != nil {
		return "", err
	}
	dir, err := payloadDir(kind)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.dir, dir, docID+".bin"), nil
}

// CreatePayload starts writing docID's streamed payload of kind (see
// PayloadWriter). docID must be a non-empty [A-Za-z0-9_-] string of at most
// 128 octets and kind PayloadContent or PayloadResult (ErrInvalid
// otherwise). The document need not exist yet: content is spooled before
// the Commit that creates the document.
func (s *Store) CreatePayload(_ context.Context, docID string, kind store.PayloadKind) (store.PayloadWriter, error) {
	final, err := s.payloadPath(docID, kind)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(final), docID+".*"+tmpSuffix)
	if err != nil {
		return nil, fmt.Errorf("store: create %v payload for %s: %w", kind, docID, err)
	}
	return &payloadFile{f: f, final: final}, nil
}

// OpenPayload opens docID's synced streamed payload of kind for reading
// (the caller closes it); ErrNotFound when there is none.
func (s *Store) OpenPayload(_ context.Context, docID string, kind store.PayloadKind) (store.PayloadReader, error) {
	path, err := s.payloadPath(docID, kind)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v payload of %s", store.ErrNotFound, kind, docID)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %v payload of %s: %w", kind, docID, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("store: stat %v payload of %s: %w", kind, docID, err)
	}
	return payloadReader{File: f, size: fi.Size()}, nil
}

// RemovePayload deletes docID's streamed payload of kind; a missing one is
// not an error. Readers that opened it keep reading it.
func (s *Store) RemovePayload(_ context.Context, docID string, kind store.PayloadKind) error {
	path, err := s.payloadPath(docID, kind)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: remove %v payload of %s: %w", kind, docID, err)
	}
	return nil
}

// cleanTempPayloads removes temporary payload files a crash left behind.
func (s *Store) cleanTempPayloads() error {
	for _, kind := range []string{spoolDir, resultDir} {
		dir := filepath.Join(s.dir, kind)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("store: scan %s: %w", dir, err)
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), tmpSuffix) {
				if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
					s.log.Warn("store: cannot remove stale temporary payload", "file", e.Name(), "err", err)
				}
			}
		}
	}
	return nil
}
