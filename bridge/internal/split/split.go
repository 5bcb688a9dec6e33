// Package split cuts a byte stream into dehydration chunks (docs/profile.md
// 4.2): fixed-size chunks, groups of whole lines, or groups of whole
// paragraphs, never larger than the chunk size. It reads the stream once,
// holding at most one chunk-sized buffer, so a document of any size is cut
// with flat memory.
package split

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// Strategy is how the stream is cut.
type Strategy int

const (
	// FixedBytes cuts chunks of exactly Size bytes (the last may be shorter).
	FixedBytes Strategy = iota
	// Lines cuts after the last '\n' within Size bytes; a line longer than
	// Size is hard-cut at Size.
	Lines
	// Paragraphs cuts after the last blank line ("\n\n", also "\n\r\n")
	// within Size bytes; if there is none, after the last '\n'; if there is
	// none either, hard-cut at Size.
	Paragraphs
)

func (s Strategy) String() string {
	switch s {
	case FixedBytes:
		return "fixed-bytes"
	case Lines:
		return "lines"
	case Paragraphs:
		return "paragraphs"
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// Chunk is one cut of the stream.
type Chunk struct {
	Index  uint64   // 0-based chunk index
	Offset uint64   // byte offset of Data in the stream
	Data   []byte   // the chunk's bytes; see Splitter.Next for ownership
	Sum    [32]byte // SHA-256 of Data
}

// Splitter cuts a stream. It is not safe for concurrent use.
type Splitter struct {
	r        io.Reader
	strategy Strategy
	size     int
	buf      []byte // pending bytes: buf[:n]
	n        int
	eof      bool
	err      error
	index    uint64
	offset   uint64
	total    uint64 // bytes read from r
	whole    hashWriter
}

type hashWriter interface {
	io.Writer
	Sum([]byte) []byte
}

// New returns a Splitter reading r. size must be > 0.
func New(r io.Reader, strategy Strategy, size int) (*Splitter, error) {
	if size <= 0 {
		return nil, fmt.Errorf("split: chunk size %d must be positive", size)
	}
	switch strategy {
	case FixedBytes, Lines, Paragraphs:
	default:
		return nil, fmt.Errorf("split: unknown strategy %v", strategy)
	}
	return &Splitter{r: r, strategy: strategy, size: size, whole: sha256.New()}, nil
}

// Next cuts the next chunk into dst (reusing its capacity when it holds
// Size bytes) and returns it; the returned Data aliases dst, which the
// caller owns. It returns io.EOF after the last chunk; an empty stream has
// no chunks. A read error of the underlying reader is returned as is.
func (s *Splitter) Next(dst []byte) (Chunk, error) {
	if s.err != nil {
		return Chunk{}, s.err
	}
	if s.buf == nil {
		s.buf = make([]byte, s.size)
	}
	for s.n < s.size && !s.eof {
		m, err := s.r.Read(s.buf[s.n:])
		if m > 0 {
			s.whole.Write(s.buf[s.n : s.n+m])
			s.n += m
			s.total += uint64(m)
		}
		if errors.Is(err, io.EOF) {
			s.eof = true
		} else if err != nil {
			s.err = err
			return Chunk{}, err
		}
	}
	if s.n == 0 {
		return Chunk{}, io.EOF
	}
	// A full buffer with more to come is cut at a boundary; at EOF the rest
	// (at most Size bytes) is the last chunk.
	cut := s.n
	if !s.eof {
		cut = s.cutPoint(s.buf[:s.n])
	}
	if cap(dst) < cut {
		dst = make([]byte, cut, s.size)
	}
	dst = dst[:cut]
	copy(dst, s.buf[:cut])
	rest := copy(s.buf, s.buf[cut:s.n])
	s.n = rest
	c := Chunk{Index: s.index, Offset: s.offset, Data: dst, Sum: sha256.Sum256(dst)}
	s.index++
	s.offset += uint64(cut)
	return c, nil
}

// cutPoint returns where a full buffer b is cut under the strategy.
func (s *Splitter) cutPoint(b []byte) int {
	switch s.strategy {
	case Lines:
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return i + 1
		}
	case Paragraphs:
		if i := lastBlankLine(b); i > 0 {
			return i
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return i + 1
		}
	}
	return len(b)
}

// lastBlankLine returns the index just after the last "\n\n" or "\n\r\n"
// in b, or -1.
func lastBlankLine(b []byte) int {
	for i := len(b) - 1; i > 0; i-- {
		if b[i] != '\n' {
			continue
		}
		if b[i-1] == '\n' {
			return i + 1
		}
		if i >= 2 && b[i-1] == '\r' && b[i-2] == '\n' {
			return i + 1
		}
	}
	return -1
}

// Size is the maximum chunk size.
func (s *Splitter) Size() int { return s.size }

// Count is the number of chunks returned so far.
func (s *Splitter) Count() uint64 { return s.index }

// BytesRead is the number of bytes read from the underlying reader.
func (s *Splitter) BytesRead() uint64 { return s.total }

// Sum is the SHA-256 of every byte read so far; after Next returned io.EOF
// it is the SHA-256 of the whole stream.
func (s *Splitter) Sum() [32]byte {
	var out [32]byte
	copy(out[:], s.whole.Sum(nil))
	return out
}
