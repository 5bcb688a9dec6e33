package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// PayloadFile is a payload (spool or result) being written. Bytes go to a
// temporary file in the same directory; Sync makes them durable and visible
// under the final name; Abort discards them. Not safe for concurrent use.
//
// Crash behaviour: a temporary file left by a crash is deleted on the next
// Open; a synced file is complete (rename after fsync is atomic).
type PayloadFile struct {
	f     *os.File
	final string
	size  int64
	done  bool
}

// Write appends p (io.Writer).
func (p *PayloadFile) Write(b []byte) (int, error) {
	if p.done {
		return 0, fmt.Errorf("store: write to finished payload %s", p.final)
	}
	n, err := p.f.Write(b)
	p.size += int64(n)
	return n, err
}

// Size is the number of bytes written so far.
func (p *PayloadFile) Size() int64 { return p.size }

// Path is the final path the file gets on Sync.
func (p *PayloadFile) Path() string { return p.final }

// Sync fsyncs the file, closes it, renames it to Path and fsyncs the
// directory, so the file survives a crash once Sync returns nil. Call it
// before the Commit that records Path and before acknowledging anything.
func (p *PayloadFile) Sync() error {
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
func (p *PayloadFile) Abort() error {
	if p.done {
		return nil
	}
	p.done = true
	p.f.Close()
	return os.Remove(p.f.Name())
}

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
		return fmt.Errorf("%w: document id must be 1..%d characters", ErrInvalid, maxDocIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%w: document id %q may only contain A-Z a-z 0-9 - _", ErrInvalid, id)
		}
	}
	return nil
}

const tmpSuffix = ".tmp"

func (s *impl) payloadPath(kind, docID string) string {
	return filepath.Join(s.dir, kind, docID+".bin")
}

func (s *impl) createPayload(kind, docID string) (*PayloadFile, error) {
	if err := validDocID(docID); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, kind), docID+".*"+tmpSuffix)
	if err != nil {
		return nil, fmt.Errorf("store: create %s payload for %s: %w", kind, docID, err)
	}
	return &PayloadFile{f: f, final: s.payloadPath(kind, docID)}, nil
}

func (s *impl) openPayload(kind, docID string) (*os.File, error) {
	if err := validDocID(docID); err != nil {
		return nil, err
	}
	f, err := os.Open(s.payloadPath(kind, docID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s payload of %s", ErrNotFound, kind, docID)
	}
	return f, err
}

func (s *impl) removePayloads(docID string) error {
	if err := validDocID(docID); err != nil {
		return err
	}
	var errs []error
	for _, kind := range []string{spoolDir, resultDir} {
		if err := os.Remove(s.payloadPath(kind, docID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanTempPayloads removes temporary payload files a crash left behind.
func (s *impl) cleanTempPayloads() error {
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
