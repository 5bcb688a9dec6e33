package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"sync"
	"unicode/utf8"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The SubmitDocument request body (POST /v1/documents) is decoded by hand
// when it is the common shape (issue 25: protojson's reflection over a
// 4 KiB base64 string, behind encoding/json's scan of the same bytes, was
// ~11% of the REST path's CPU): a JSON object of content (base64),
// contentType, requestId, displayName and metadata (string to string),
// each at most once, strings without escapes. Anything else (split,
// completionPolicy, proto field names, null, escapes, numbers, an unknown
// field, a duplicate, invalid base64 or UTF-8, malformed JSON) is decoded
// by the strict protojson path as before, from the same bytes, so it
// gets the same result or the same error message.
// TestSubmitJSONMatchesProtojson and FuzzSubmitJSONDecode compare the two
// on every input.

// submitParse is the outcome of parseSubmitJSON.
type submitParse int

const (
	submitDone        submitParse = iota // a whole object, decoded
	submitNeedMore                       // data ends inside the object
	submitUnsupported                    // not the common shape: use protojson
)

// Field bits of the fast path (duplicates are protojson's to report).
const (
	submitContent = 1 << iota
	submitContentType
	submitRequestID
	submitDisplayName
	submitMetadata
)

// decodeSubmit decodes one JSON value from d.r into req: by hand when
// parseSubmitJSON takes it, else as strictDecoder always did, over the
// same byte stream (what was read, then the rest of d.r).
func (d strictDecoder) decodeSubmit(req *gatewayv1.SubmitDocumentRequest) error {
	bp := submitBufs.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		if cap(buf) <= 64<<10 {
			*bp = buf[:0]
			submitBufs.Put(bp)
		}
	}()
	var rerr error
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := d.r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch parseSubmitJSON(buf, req) {
		case submitDone:
			return nil
		case submitNeedMore:
			if err == nil {
				continue
			}
		}
		rerr = err
		break
	}
	req.Reset()
	rest := d.r
	if rerr != nil {
		rest = errReader{rerr}
	}
	var raw json.RawMessage
	if err := json.NewDecoder(io.MultiReader(bytes.NewReader(buf), rest)).Decode(&raw); err != nil {
		return err // io.EOF: no body, which grpc-gateway accepts
	}
	return strictUnmarshal(raw, req)
}

// submitBufs hold request bodies while they are decoded.
var submitBufs = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// errReader returns err from every Read: the body's read error, after the
// bytes read before it.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// parseSubmitJSON decodes the JSON object at the start of data (after
// whitespace) into req if it has the common shape (above). req is
// written only by submitDone.
func parseSubmitJSON(data []byte, req *gatewayv1.SubmitDocumentRequest) submitParse {
	p := jsonScan{b: data}
	var out submitFields
	if r := p.expect('{'); r != submitDone {
		return r
	}
	if p.ws() {
		return submitNeedMore
	}
	if p.b[p.i] == '}' {
		req.Reset()
		return submitDone
	}
	seen := 0
	for {
		key, r := p.str()
		if r != submitDone {
			return r
		}
		if r := p.expect(':'); r != submitDone {
			return r
		}
		bit, r := p.field(string(key), &out)
		if r != submitDone {
			return r
		}
		if seen&bit != 0 {
			return submitUnsupported // protojson: duplicate field
		}
		seen |= bit
		if p.ws() {
			return submitNeedMore
		}
		switch p.b[p.i] {
		case '}':
			req.Reset()
			req.Content, req.ContentType, req.RequestId = out.Content, out.ContentType, out.RequestId
			req.DisplayName, req.Metadata = out.DisplayName, out.Metadata
			return submitDone
		case ',':
			p.i++
			if r := p.expect('"'); r != submitDone {
				return r
			}
			p.i-- // str reads the quote
		default:
			return submitUnsupported
		}
	}
}

// submitFields are the fields of the fast path, set on the request once
// the whole object is read.
type submitFields struct {
	Content                             []byte
	ContentType, RequestId, DisplayName string
	Metadata                            map[string]string
}

// jsonScan is a cursor over the JSON subset parseSubmitJSON takes.
type jsonScan struct {
	b []byte
	i int
}

// ws skips JSON whitespace and reports whether data ended.
func (p *jsonScan) ws() bool {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return false
		}
	}
	return true
}

// expect skips whitespace and the byte c.
func (p *jsonScan) expect(c byte) submitParse {
	if p.ws() {
		return submitNeedMore
	}
	if p.b[p.i] != c {
		return submitUnsupported
	}
	p.i++
	return submitDone
}

// str reads a string without escapes or control characters, in valid
// UTF-8 (protojson refuses invalid UTF-8; escapes go to protojson).
func (p *jsonScan) str() ([]byte, submitParse) {
	if r := p.expect('"'); r != submitDone {
		return nil, r
	}
	start := p.i
	ascii := true
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			if !ascii && !utf8.Valid(s) {
				return nil, submitUnsupported
			}
			return s, submitDone
		case c == '\\' || c < 0x20:
			return nil, submitUnsupported
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, submitNeedMore
}

// rawStr reads a string up to the next quote, unchecked: for base64,
// whose decoding refuses every byte str refuses (escapes, control
// characters, non-ASCII) but CR and LF, which it skips (decodeBase64JSON
// refuses them).
func (p *jsonScan) rawStr() ([]byte, submitParse) {
	if r := p.expect('"'); r != submitDone {
		return nil, r
	}
	j := bytes.IndexByte(p.b[p.i:], '"')
	if j < 0 {
		return nil, submitNeedMore
	}
	s := p.b[p.i : p.i+j]
	p.i += j + 1
	return s, submitDone
}

// field reads the value of key into out and returns key's field bit.
func (p *jsonScan) field(key string, out *submitFields) (int, submitParse) {
	if key == "metadata" {
		md, r := p.stringMap()
		out.Metadata = md
		return submitMetadata, r
	}
	if key == "content" {
		s, r := p.rawStr()
		if r != submitDone {
			return 0, r
		}
		b, ok := decodeBase64JSON(s)
		if !ok {
			return 0, submitUnsupported
		}
		out.Content = b
		return submitContent, submitDone
	}
	s, r := p.str()
	if r != submitDone {
		return 0, r
	}
	switch key {
	case "contentType":
		out.ContentType = string(s)
		return submitContentType, submitDone
	case "requestId":
		out.RequestId = string(s)
		return submitRequestID, submitDone
	case "displayName":
		out.DisplayName = string(s)
		return submitDisplayName, submitDone
	}
	return 0, submitUnsupported
}

// stringMap reads an object of strings (a map<string, string> field).
func (p *jsonScan) stringMap() (map[string]string, submitParse) {
	if r := p.expect('{'); r != submitDone {
		return nil, r
	}
	m := map[string]string{}
	if p.ws() {
		return nil, submitNeedMore
	}
	if p.b[p.i] == '}' {
		p.i++
		return m, submitDone
	}
	for {
		k, r := p.str()
		if r != submitDone {
			return nil, r
		}
		if r := p.expect(':'); r != submitDone {
			return nil, r
		}
		v, r := p.str()
		if r != submitDone {
			return nil, r
		}
		if _, dup := m[string(k)]; dup {
			return nil, submitUnsupported // protojson: duplicate map key
		}
		m[string(k)] = string(v)
		if p.ws() {
			return nil, submitNeedMore
		}
		switch p.b[p.i] {
		case '}':
			p.i++
			return m, submitDone
		case ',':
			p.i++
		default:
			return nil, submitUnsupported
		}
	}
}

// decodeBase64JSON decodes a bytes field's JSON string as protojson does
// (encoding/protojson unmarshalBytes): standard alphabet unless the
// string has '-' or '_', padding unless its length is not a multiple
// of 4. The standard alphabet is tried first: it refuses '-' and '_', so
// the string is scanned for them only when it fails. A raw CR or LF (not
// JSON; encoding/base64 skips them) is refused.
func decodeBase64JSON(s []byte) ([]byte, bool) {
	if bytes.IndexByte(s, '\n') >= 0 || bytes.IndexByte(s, '\r') >= 0 {
		return nil, false
	}
	pad := func(enc *base64.Encoding) *base64.Encoding {
		if len(s)%4 != 0 {
			return enc.WithPadding(base64.NoPadding)
		}
		return enc
	}
	out := make([]byte, base64.StdEncoding.DecodedLen(len(s))+2)
	n, err := pad(base64.StdEncoding).Decode(out, s)
	if err != nil {
		if !bytes.ContainsAny(s, "-_") {
			return nil, false
		}
		if n, err = pad(base64.URLEncoding).Decode(out, s); err != nil {
			return nil, false
		}
	}
	return out[:n:n], true
}
