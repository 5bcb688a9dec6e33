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

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Spool of dehydrated documents (docs/profile.md 4.2, 4.3). The peer's
// memory must stay flat whatever a document's size, so a child's output
// is written to <data-dir>/work/<session>/<root>-<n>/<chunk-index>.out as
// soon as the child finishes and only its size and content-type stay in
// memory. Rehydration of a Concatenator streams the files in chunk-index
// order into the result stream after one hashing pass over them (the
// result header carries payload-length and checksum before the payload).
// A child whose input arrives before all lower chunk indexes were hashed is
// also written as <chunk-index>.in, so the root's content-sha256 can be
// checked in chunk order. A document's directory is removed when the
// document ends (result sent, failed, cancelled); a session's when the
// session ends; the whole work/ directory on start.

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
	size        int64
	contentType string
	layer       uint8
	partial     any // Output.Partial (processor merge state), if any
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

func (d *doc) outPath(i uint64) string { return filepath.Join(d.dir, strconv.FormatUint(i, 10)+".out") }
func (d *doc) inPath(i uint64) string  { return filepath.Join(d.dir, strconv.FormatUint(i, 10)+".in") }

// writeSpool writes b to path, creating the document's directory.
func (d *doc) writeSpool(path string, b []byte) error {
	if err := d.ctx.Err(); err != nil {
		return context.Cause(d.ctx)
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// spoolOutput writes the output of child e to its document's spool and
// returns what rehydration keeps in memory. out.Data is not retained.
func (g *engine) spoolOutput(e *entity, out *Output) (*spooled, error) {
	if err := e.doc.writeSpool(e.doc.outPath(uint64(e.chunk)), out.Data); err != nil {
		return nil, err
	}
	return &spooled{size: int64(len(out.Data)), contentType: out.ContentType, layer: out.Layer, partial: out.Partial}, nil
}

// noteInput feeds the verified input of chunk idx into the document's
// content hash, in chunk-index order: an input ahead of the frontier is
// spooled as <idx>.in and hashed (then removed) once the frontier reaches
// it. Each input is noted once, on its first verified arrival.
func (g *engine) noteInput(d *doc, idx uint64, raw []byte) {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	if d.inNoted[idx] {
		return
	}
	d.inNoted[idx] = true
	if idx != d.inNext {
		if err := d.writeSpool(d.inPath(idx), raw); err != nil {
			d.inBroken = err // the content hash can no longer be computed
		}
		return
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
			return
		}
		if buf == nil {
			buf = make([]byte, spoolBufferBytes)
		}
		n, err := io.CopyBuffer(d.inHash, f, buf)
		f.Close()
		os.Remove(p)
		if err != nil {
			d.inBroken = err
			return
		}
		d.inLen += uint64(n)
		d.inNext++
	}
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
// parts in chunk-index order (profile 4.3): one pass hashes them (the
// header needs payload-length and checksum), the second streams them.
func (g *engine) sendConcat(ctx context.Context, d *doc, c Concatenator, parts []part, counts [2]int) (int64, error) {
	buf := make([]byte, spoolBufferBytes)
	sum := sha256.New()
	var n int64
	for _, p := range parts {
		f, err := os.Open(d.outPath(p.idx))
		if err != nil {
			return 0, fmt.Errorf("spooled output of chunk %d: %w", p.idx, err)
		}
		m, err := io.CopyBuffer(sum, f, buf)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("spooled output of chunk %d: %w", p.idx, err)
		}
		if m != p.sp.size {
			return 0, fmt.Errorf("spooled output of chunk %d is %d octets, %d were written", p.idx, m, p.sp.size)
		}
		n += m
	}
	first := &Output{}
	if len(parts) > 0 {
		first = &Output{ContentType: parts[0].sp.contentType, Layer: parts[0].sp.layer}
	}
	ct, layer := c.ConcatType(first)
	h := resultHeader(d.id, ct, layer, uint64(n), sum.Sum(nil), &counts)
	r := &spoolReader{d: d, parts: parts, buf: buf}
	defer r.close()
	return n, g.c.SendEntity(ctx, h, r)
}

// spoolReader reads the spooled outputs of parts one file after another.
type spoolReader struct {
	d     *doc
	parts []part
	f     *os.File
	buf   []byte
}

func (r *spoolReader) Read(b []byte) (int, error) {
	for {
		if r.f == nil {
			if len(r.parts) == 0 {
				return 0, io.EOF
			}
			f, err := os.Open(r.d.outPath(r.parts[0].idx))
			if err != nil {
				return 0, err
			}
			r.f, r.parts = f, r.parts[1:]
		}
		n, err := r.f.Read(b)
		if errors.Is(err, io.EOF) {
			r.f.Close()
			r.f = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

func (r *spoolReader) close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}

// loadParts reads the spooled outputs of parts back into memory for a
// processor that is not a Concatenator (its Rehydrate needs them all; the
// built-in TextStats merges its in-memory Partial and its outputs are
// small summaries).
func (g *engine) loadParts(d *doc, parts []part) ([]*Output, error) {
	outs := make([]*Output, len(parts))
	for i, p := range parts {
		b, err := os.ReadFile(d.outPath(p.idx))
		if err != nil {
			return nil, fmt.Errorf("spooled output of chunk %d: %w", p.idx, err)
		}
		outs[i] = &Output{Data: b, ContentType: p.sp.contentType, Layer: p.sp.layer, Partial: p.sp.partial}
	}
	return outs, nil
}

// resultHeader is the header of a result stream (profile 4.3).
func resultHeader(id uint32, ct string, layer uint8, n uint64, sum []byte, counts *[2]int) *wire.EntityHeader {
	scope := uint32(0)
	md := map[string]string{MetaRole: "result"}
	if counts != nil {
		md[MetaChildrenComplete] = strconv.Itoa(counts[0])
		md[MetaChildrenTotal] = strconv.Itoa(counts[1])
	}
	if ct == "" {
		ct = "application/octet-stream"
	}
	return &wire.EntityHeader{EntityID: id, ScopeID: &scope, Layer: layer, ContentType: ct,
		PayloadLength: n, Checksum: sum, Metadata: md}
}

// admit waits until n payload octets fit the in-memory payload budget (an
// entity larger than the whole budget waits for all of it) and returns the
// release function.
func (g *engine) admit(ctx context.Context, n uint64) (func(), error) {
	w := int64(min(n, uint64(g.lim.payloadBudget)))
	if err := g.budget.Acquire(ctx, w); err != nil {
		return nil, context.Cause(ctx)
	}
	return func() { g.budget.Release(w) }, nil
}
