package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"io"
	"sync"
)

// EntityHeaderLenLen is the size of the entity frame's Header Length.
const EntityHeaderLenLen = 4

// headerAppender is implemented by the built-in codecs that can append an
// encoded header to a buffer (no intermediate slice).
type headerAppender interface {
	appendEntityHeader(b []byte, h *EntityHeader) ([]byte, error)
}

// headerBufs pools the buffers entity headers are encoded into and read
// from; a buffer that grew beyond headerBufMax is not returned to the pool.
var headerBufs = sync.Pool{New: func() any { b := make([]byte, 0, headerBufSize); return &b }}

func putHeaderBuf(bp *[]byte) {
	if cap(*bp) <= headerBufMax {
		*bp = (*bp)[:0]
		headerBufs.Put(bp)
	}
}

// WriteEntityHeader writes the start of an entity frame (Section 6.8.1): the
// 4-octet big-endian Header Length and h serialized with c, in one Write.
// The payload follows, written by the caller, and the stream is then
// closed (FIN). h is validated as a receiver would (entity-id != 0,
// parent-id != 0, layer <= 3, checksum 32 octets) so an invalid header is
// never sent. The encoding buffer is pooled; w must not retain it.
func WriteEntityHeader(w io.Writer, c Codec, h *EntityHeader) error {
	bp := headerBufs.Get().(*[]byte)
	defer putHeaderBuf(bp)
	buf, err := appendEntityFrameHeader((*bp)[:0], c, h)
	if err != nil {
		return err
	}
	*bp = buf
	_, err = w.Write(buf)
	return err
}

// AppendEntityHeader appends what WriteEntityHeader writes (4-octet
// length and the header serialized with c) to b: a sender can put the
// header and a small payload into one stream write.
func AppendEntityHeader(b []byte, c Codec, h *EntityHeader) ([]byte, error) {
	return appendEntityFrameHeader(b, c, h)
}

// appendEntityFrameHeader appends what WriteEntityHeader writes (Header
// Length and h serialized with c, Section 6.8.1) to b and returns the
// extended slice; h is validated first.
func appendEntityFrameHeader(b []byte, c Codec, h *EntityHeader) ([]byte, error) {
	if err := validateEntityHeader(h); err != nil {
		return b, err
	}
	start := len(b)
	buf := append(b, 0, 0, 0, 0)
	var err error
	if ha, ok := c.(headerAppender); ok {
		buf, err = ha.appendEntityHeader(buf, h)
	} else {
		var hb []byte
		hb, err = c.MarshalEntityHeader(h)
		buf = append(buf, hb...)
	}
	if err != nil {
		return b, err
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(len(buf)-start-EntityHeaderLenLen))
	return buf, nil
}

// ReadEntityHeader reads the Header Length and the EntityHeader of an entity
// frame (Section 6.8.1) from r and decodes it with c, leaving r at the first
// payload octet.
//
// maxHeader caps the Header Length (<= 0 means DefaultMaxEntityHeader); a
// larger length is *Error 0x06 (ENTITY_TOO_LARGE), checked before any header
// octet is read. A Header Length of 0, a stream that ends before the header
// is complete, or an undecodable header is *Error 0x05; the header checks of
// Codec.UnmarshalEntityHeader apply (0x05, or 0x04 for a bad checksum
// length). The header buffer grows as octets arrive, never from the
// declared length (a header of at most headerBufSize octets is read into
// a pooled buffer of that fixed size when c is a built-in codec, whose
// decoded headers never alias the buffer). Read errors other than EOF are
// returned unchanged.
func ReadEntityHeader(r io.Reader, c Codec, maxHeader int) (*EntityHeader, error) {
	if maxHeader <= 0 {
		maxHeader = DefaultMaxEntityHeader
	}
	var lb [EntityHeaderLenLen]byte
	if n, err := io.ReadFull(r, lb[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, Errorf(CodeEntityInvalid, "entity stream ended after %d octets, before the 4-octet Header Length", n)
		}
		return nil, err
	}
	hl := binary.BigEndian.Uint32(lb[:])
	if hl == 0 {
		return nil, Errorf(CodeEntityInvalid, "entity frame: Header Length 0")
	}
	if uint64(hl) > uint64(maxHeader) {
		return nil, Errorf(CodeEntityTooLarge, "entity frame: Header Length %d exceeds the limit %d", hl, maxHeader)
	}
	if hl <= headerBufSize && builtinCodec(c) {
		bp := headerBufs.Get().(*[]byte)
		defer putHeaderBuf(bp)
		if cap(*bp) < headerBufSize {
			*bp = make([]byte, 0, headerBufSize)
		}
		hb := (*bp)[:hl]
		n, err := io.ReadFull(r, hb)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, Errorf(CodeEntityInvalid, "entity stream ended inside the header (%d of %d octets)", n, hl)
			}
			return nil, err
		}
		return c.UnmarshalEntityHeader(hb)
	}
	var hb bytes.Buffer
	hb.Grow(min(int(hl), maxStreamReadChunk))
	n, err := hb.ReadFrom(io.LimitReader(r, int64(hl)))
	if err != nil {
		return nil, err
	}
	if n < int64(hl) {
		return nil, Errorf(CodeEntityInvalid, "entity stream ended inside the header (%d of %d octets)", n, hl)
	}
	return c.UnmarshalEntityHeader(hb.Bytes())
}

// builtinCodec reports whether c is one of this package's codecs: their
// decoded headers copy what they keep (cbor/v2 and protobuf copy byte and
// text strings), so the input buffer may be reused.
func builtinCodec(c Codec) bool {
	switch c.(type) {
	case cborCodec, protoCodec:
		return true
	}
	return false
}

// PayloadReader reads an entity payload (Section 6.8.1) up to the stream's
// FIN, hashing it with SHA-256 as it goes. At the end of the stream it
// returns, instead of io.EOF:
//   - *Error 0x05 when the payload length differs from payload-length (as
//     soon as more octets than declared arrive);
//   - *Error 0x04 when a checksum is present and does not match
//     (Section 10.2).
//
// The final rehydration or SINK must not be committed before Read returned
// io.EOF (Section 10.2). Read errors of the underlying stream are returned
// unchanged.
type PayloadReader struct {
	r      io.Reader
	want   uint64
	sum    []byte
	got    uint64
	h      hash.Hash
	done   error
	digest [sha256.Size]byte
}

// NewPayloadReader returns a reader of the payload described by h from r
// (positioned after the header, as ReadEntityHeader leaves it).
func NewPayloadReader(r io.Reader, h *EntityHeader) *PayloadReader {
	p := new(PayloadReader)
	p.Init(r, h)
	return p
}

// Init makes p a reader of the payload described by h from r, like
// NewPayloadReader, for a PayloadReader embedded in another value (one
// allocation per entity instead of two). p must not be in use.
func (p *PayloadReader) Init(r io.Reader, h *EntityHeader) {
	*p = PayloadReader{r: r, want: h.PayloadLength, sum: h.Checksum, h: sha256Pool.Get().(hash.Hash)}
}

// sha256Pool recycles the SHA-256 states of finished payloads.
var sha256Pool = sync.Pool{New: func() any { return sha256.New() }}

// release returns p's hash state to the pool once p is done with it.
func (p *PayloadReader) release() {
	if p.h != nil {
		p.h.Reset()
		sha256Pool.Put(p.h)
		p.h = nil
	}
}

// Read implements io.Reader.
func (p *PayloadReader) Read(b []byte) (int, error) {
	if p.done != nil {
		return 0, p.done
	}
	if len(b) == 0 {
		return 0, nil
	}
	// Ask for at most one octet beyond the declared length to detect a
	// longer payload without consuming much of it.
	if rem := p.want - p.got; uint64(len(b)) > rem+1 {
		b = b[:rem+1]
	}
	n, err := p.r.Read(b)
	p.got += uint64(n)
	p.h.Write(b[:n])
	if p.got > p.want {
		p.done = Errorf(CodeEntityInvalid, "entity payload longer than payload-length %d", p.want)
		p.release()
		return n, p.done
	}
	if err == io.EOF {
		p.done = p.finish()
		return n, p.done
	}
	return n, err
}

func (p *PayloadReader) finish() error {
	if p.got != p.want {
		return Errorf(CodeEntityInvalid, "entity payload is %d octets, payload-length says %d", p.got, p.want)
	}
	p.h.Sum(p.digest[:0])
	p.release()
	if p.sum != nil && !bytes.Equal(p.sum, p.digest[:]) {
		return Errorf(CodeIntegrityError, "entity payload SHA-256 %x does not match the header checksum %x", p.digest, p.sum)
	}
	return io.EOF
}

// Sum returns the SHA-256 of the payload; valid once Read returned io.EOF.
func (p *PayloadReader) Sum() [sha256.Size]byte { return p.digest }

// N returns the number of payload octets read so far.
func (p *PayloadReader) N() uint64 { return p.got }
