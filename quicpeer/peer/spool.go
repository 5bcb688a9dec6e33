package peer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Spool of dehydrated documents (docs/profile.md 4.2, 4.3). The peer's
// memory must stay flat whatever a document's size, so a child's output
// is appended to the document's spool file <data-dir>/work/<session>/
// <root>-<n>/out as soon as the child finishes and only its offset, size
// and content-type stay in memory. One file per document, created once and
// written with positioned writes at reserved offsets, is several times
// cheaper than a file per child (no create, close and unlink per chunk);
// a region is never rewritten, so a child output that was hashed cannot
// change under the result (resulthash.go). Rehydration of a Concatenator
// streams the regions in chunk-index order into the result stream; the
// result's length and SHA-256 were computed while the children finished.
// A child whose input arrives before all lower chunk indexes were hashed
// is also written as <chunk-index>.in, so the root's content-sha256 can be
// checked in chunk order. A document's directory is removed when the
// document ends (result sent, failed, cancelled); a session's when the
// session ends; the whole work/ directory on start. Nothing is fsynced:
// the spool is scratch that a restart deletes.

// Concatenator is an optional Processor extension: a processor whose N:1
// merge is the concatenation of the parts' Data in chunk-index order says
// so, and the peer streams the spooled child outputs from disk into the
// result instead of calling Rehydrate, holding one buffer whatever the
// document's size. ConcatType returns the result's content-type and data
// layer from the first kept part (zero Output when none succeeded).
type Concatenator interface {
	ConcatType(first *Output) (contentType string, layer uint8)
}

// spooled is what stays in memory of a finished child's output.
type spooled struct {
	off, size   int64 // region of the document's spool file
	contentType string
	layer       uint8
	partial     any  // Output.Partial (processor merge state), if any
	same        bool // Data is the child's input as noted for the content hash
}

// errSpoolClosed is returned for a spool write after the document ended.
var errSpoolClosed = errors.New("document spool closed: the document ended")

// outSpool is the output spool file of one document. Writes reserve a
// region under mu and write it outside, so children spool in parallel.
type outSpool struct {
	mu     sync.Mutex
	dir    string
	made   bool // dir exists
	f      *os.File
	end    int64
	closed bool
}

// ensureDirLocked creates the document's directory once. Caller holds mu.
func (s *outSpool) ensureDirLocked() error {
	if s.made {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	s.made = true
	return nil
}

// append writes b to a fresh region of the spool file and returns its
// offset. b is not retained.
func (s *outSpool) append(b []byte) (int64, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, errSpoolClosed
	}
	if s.f == nil {
		err := s.ensureDirLocked()
		if err == nil {
			s.f, err = os.OpenFile(filepath.Join(s.dir, "out"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		}
		if err != nil {
			s.mu.Unlock()
			return 0, err
		}
	}
	off, f := s.end, s.f
	s.end += int64(len(b))
	s.mu.Unlock()
	if _, err := f.WriteAt(b, off); err != nil {
		return 0, err
	}
	return off, nil
}

// section returns a reader of the region of sp, or an error once the
// document ended.
func (s *outSpool) section(sp *spooled) (*io.SectionReader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.f == nil {
		return nil, errSpoolClosed
	}
	return io.NewSectionReader(s.f, sp.off, sp.size), nil
}

// close ends the spool: later writes and reads fail (reads in flight
// finish first: os.File defers the close).
func (s *outSpool) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.f != nil {
		s.f.Close()
	}
}

// prepareWorkDir empties and recreates <data-dir>/work (stale spools of a
// previous run are useless: their sessions are gone).
func prepareWorkDir(dataDir string) (string, error) {
	dir := filepath.Join(dataDir, "work")
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("peer: remove stale work dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("peer: create work dir: %w", err)
	}
	return dir, nil
}

func (d *doc) inPath(i uint64) string { return filepath.Join(d.dir, strconv.FormatUint(i, 10)+".in") }

// writeSpool writes b to path in the document's directory.
func (d *doc) writeSpool(path string, b []byte) error {
	if err := d.ctx.Err(); err != nil {
		return context.Cause(d.ctx)
	}
	d.spool.mu.Lock()
	err := d.spool.ensureDirLocked()
	d.spool.mu.Unlock()
	if err == nil {
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// spoolOutput writes the output of child e to its document's spool and
// returns what rehydration keeps in memory. out.Data is not retained.
func (g *engine) spoolOutput(e *entity, out *Output) (*spooled, error) {
	if err := e.doc.ctx.Err(); err != nil {
		return nil, context.Cause(e.doc.ctx)
	}
	off, err := e.doc.spool.append(out.Data)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	return &spooled{off: off, size: int64(len(out.Data)), contentType: out.ContentType, layer: out.Layer, partial: out.Partial,
		same: e.inputNoted && aliases(out.Data, e.payload)}, nil
}

// aliases reports whether a and b are the same bytes in memory.
func aliases(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// noteInput feeds the verified input of chunk idx into the document's
// content hash, in chunk-index order: an input ahead of the frontier is
// spooled as <idx>.in and hashed (then removed) once the frontier reaches
// it. Each input is noted once, on its first verified arrival; it reports
// whether raw is the input noted for idx.
func (g *engine) noteInput(d *doc, idx uint64, raw []byte) bool {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	if d.inNoted[idx] {
		return false
	}
	d.inNoted[idx] = true
	if idx != d.inNext {
		if err := d.writeSpool(d.inPath(idx), raw); err != nil {
			d.inBroken = err // the content hash can no longer be computed
		}
		return true
	}
	d.inHash.Write(raw)
	d.inLen += uint64(len(raw))
	d.inNext++
	var buf []byte
	for d.inBroken == nil && d.inNoted[d.inNext] {
		p := d.inPath(d.inNext)
		f, err := os.Open(p)
		if err != nil {
			d.inBroken = err
			return true
		}
		if buf == nil {
			buf = make([]byte, spoolBufferBytes)
		}
		n, err := io.CopyBuffer(d.inHash, f, buf)
		f.Close()
		os.Remove(p)
		if err != nil {
			d.inBroken = err
			return true
		}
		d.inLen += uint64(n)
		d.inNext++
	}
	return true
}

// verifyContent checks the root's pipestream.content-length and
// pipestream.content-sha256 (the "final summary entity" of Section 10.2)
// against the concatenation of the children's verified inputs. It returns
// the reason the document must fail, "" when it matches or cannot be
// checked (a child's input never arrived intact; the completion policy
// already accounts for that child).
func (g *engine) verifyContent(d *doc) string {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	if d.wantSum == nil && d.wantLen < 0 {
		return ""
	}
	if d.inBroken != nil || d.inNext != uint64(d.total) {
		g.log.Info("document content summary not verifiable", "entity", d.id, "hashed_chunks", d.inNext, "total", d.total, "err", d.inBroken)
		return ""
	}
	if d.wantLen >= 0 && d.inLen != uint64(d.wantLen) {
		return fmt.Sprintf("%s %d does not match the %d octets of the children's payloads", MetaContentLength, d.wantLen, d.inLen)
	}
	if d.wantSum != nil {
		if sum := d.inHash.Sum(nil); string(sum) != string(d.wantSum) {
			return fmt.Sprintf("%s %x does not match the SHA-256 %x of the children's payloads in chunk order", MetaContentSHA256, d.wantSum, sum)
		}
	}
	return ""
}

// part is one child output kept for rehydration.
type part struct {
	idx uint64
	sp  *spooled
}

// sendConcat sends the result of d by streaming the spooled outputs of
// parts in chunk-index order (profile 4.3; the generic form when plain). The header's payload-length
// and checksum come from the result hash kept while the children finished
// (resulthash.go); only when it is not available (a spool read failed)
// does a first pass over the spool hash them.
func (g *engine) sendConcat(ctx context.Context, d *doc, c Concatenator, parts []part, counts [2]int, plain bool) (int64, error) {
	n, sum, ok := g.resultSum(d, parts)
	if !ok {
		var err error
		if n, sum, err = g.hashParts(d, parts); err != nil {
			return 0, err
		}
	}
	first := &Output{}
	if len(parts) > 0 {
		first = &Output{ContentType: parts[0].sp.contentType, Layer: parts[0].sp.layer}
	}
	ct, layer := c.ConcatType(first)
	h := resultHeaderFor(plain, d.id, ct, layer, uint64(n), sum, &counts)
	return n, g.c.SendEntity(ctx, h, &spoolReader{d: d, parts: parts})
}

// hashParts reads the spooled outputs of parts once and returns their
// total length and SHA-256.
func (g *engine) hashParts(d *doc, parts []part) (int64, []byte, error) {
	buf := make([]byte, spoolBufferBytes)
	sum := sha256.New()
	var n int64
	for _, p := range parts {
		m, err := d.copySpooled(sum, p.sp, buf)
		if err != nil {
			return 0, nil, fmt.Errorf("spooled output of chunk %d: %w", p.idx, err)
		}
		n += m
	}
	return n, sum.Sum(nil), nil
}

// copySpooled copies the spooled output sp to w through buf and checks
// that it is as long as was written.
func (d *doc) copySpooled(w io.Writer, sp *spooled, buf []byte) (int64, error) {
	r, err := d.spool.section(sp)
	if err != nil {
		return 0, err
	}
	m, err := io.CopyBuffer(w, r, buf)
	if err == nil && m != sp.size {
		err = fmt.Errorf("%d octets read, %d were written", m, sp.size)
	}
	return m, err
}

// spoolReader reads the spooled outputs of parts one region after another.
type spoolReader struct {
	d     *doc
	parts []part
	r     *io.SectionReader
}

func (r *spoolReader) Read(b []byte) (int, error) {
	for {
		if r.r == nil {
			if len(r.parts) == 0 {
				return 0, io.EOF
			}
			sec, err := r.d.spool.section(r.parts[0].sp)
			if err != nil {
				return 0, err
			}
			r.r, r.parts = sec, r.parts[1:]
		}
		n, err := r.r.Read(b)
		if errors.Is(err, io.EOF) {
			r.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

// loadParts reads the spooled outputs of parts back into memory for a
// processor that is not a Concatenator (its Rehydrate needs them all; the
// built-in TextStats merges its in-memory Partial and its outputs are
// small summaries).
func (g *engine) loadParts(d *doc, parts []part) ([]*Output, error) {
	outs := make([]*Output, len(parts))
	for i, p := range parts {
		r, err := d.spool.section(p.sp)
		var b []byte
		if err == nil {
			b = make([]byte, p.sp.size) // octets this peer wrote itself
			_, err = io.ReadFull(r, b)
		}
		if err != nil {
			return nil, fmt.Errorf("spooled output of chunk %d: %w", p.idx, err)
		}
		outs[i] = &Output{Data: b, ContentType: p.sp.contentType, Layer: p.sp.layer, Partial: p.sp.partial}
	}
	return outs, nil
}

// resultMeta is the metadata of a result without children counts, shared
// by every such header: read-only (the session's encoders only read it).
var resultMeta = map[string]string{MetaRole: "result"}

// resultHeader is the header of a result stream (profile 4.3).
func resultHeader(id uint32, ct string, layer uint8, n uint64, sum []byte, counts *[2]int) *wire.EntityHeader {
	h := new(wire.EntityHeader)
	fillResultHeader(h, new(uint32), id, ct, layer, n, sum, counts)
	return h
}

// fillResultHeader sets *h to the result header resultHeader returns,
// with scope (set to 0) as its scope-id.
func fillResultHeader(h *wire.EntityHeader, scope *uint32, id uint32, ct string, layer uint8, n uint64, sum []byte, counts *[2]int) {
	*scope = 0
	md := resultMeta
	if counts != nil {
		md = map[string]string{MetaRole: "result",
			MetaChildrenComplete: strconv.Itoa(counts[0]), MetaChildrenTotal: strconv.Itoa(counts[1])}
	}
	if ct == "" {
		ct = "application/octet-stream"
	}
	*h = wire.EntityHeader{EntityID: id, ScopeID: scope, Layer: layer, ContentType: ct,
		PayloadLength: n, Checksum: sum, Metadata: md}
}

// admit waits until n payload octets fit the in-memory payload budget (an
// entity larger than the whole budget waits for all of it) and returns the
// release function.
func (g *engine) admit(ctx context.Context, n uint64) (func(), error) {
	w, err := g.admitted(ctx, n)
	if err != nil {
		return nil, err
	}
	return func() { g.budget.Release(w) }, nil
}

// admitted is admit that returns the octets held, for the caller to
// release with g.budget.Release (no closure per entity).
func (g *engine) admitted(ctx context.Context, n uint64) (int64, error) {
	w := int64(min(n, uint64(g.lim.payloadBudget)))
	if g.budget.TryAcquire(w) { // no wait: ctx's Done channel is not made
		return w, nil
	}
	if err := g.budget.Acquire(ctx, w); err != nil {
		return 0, context.Cause(ctx)
	}
	return w, nil
}
