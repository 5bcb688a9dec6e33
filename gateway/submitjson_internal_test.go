package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// protojsonSubmit is the strict decoder's path before the hand decoder:
// one JSON value from r, then strictUnmarshal (protojson).
func protojsonSubmit(r io.Reader) (*gatewayv1.SubmitDocumentRequest, error) {
	req := &gatewayv1.SubmitDocumentRequest{}
	var raw json.RawMessage
	if err := json.NewDecoder(r).Decode(&raw); err != nil {
		return req, err
	}
	return req, strictUnmarshal(raw, req)
}

// handSubmit is the strict decoder as the REST mux runs it.
func handSubmit(r io.Reader) (*gatewayv1.SubmitDocumentRequest, error) {
	req := &gatewayv1.SubmitDocumentRequest{}
	err := (&strictJSONPb{}).NewDecoder(r).Decode(req)
	return req, err
}

// sameSubmitDecode checks that both decoders give the same message or the
// same error for body, read whole, one byte at a time, and cut by a read
// error after cut bytes. It reports whether the fast path took the body.
func sameSubmitDecode(t *testing.T, body []byte, cut int) bool {
	t.Helper()
	readers := []func() io.Reader{
		func() io.Reader { return bytes.NewReader(body) },
		func() io.Reader { return iotest.OneByteReader(bytes.NewReader(body)) },
		func() io.Reader { return iotest.DataErrReader(bytes.NewReader(body)) },
		func() io.Reader {
			return io.MultiReader(bytes.NewReader(body[:min(cut, len(body))]), errReader{errors.New("body cut")})
		},
	}
	for i, mk := range readers {
		want, werr := protojsonSubmit(mk())
		got, gerr := handSubmit(mk())
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("body %q (reader %d): error %v, protojson's %v", body, i, gerr, werr)
		}
		if werr == nil && !proto.Equal(want, got) {
			t.Fatalf("body %q (reader %d): decoded %v, protojson %v", body, i, got, want)
		}
	}
	var req gatewayv1.SubmitDocumentRequest
	return parseSubmitJSON(body, &req) == submitDone
}

// TestSubmitJSONMatchesProtojson: the hand decoder of the SubmitDocument
// body gives what protojson gives (message, or error text) on seeded
// random bodies built from the fields, values and JSON corners the two
// must agree on (escapes, proto field names, null, duplicates, every
// base64 variant, invalid UTF-8, whitespace, truncation, trailing bytes),
// and on fixed edge cases; and it takes the common shape itself.
func TestSubmitJSONMatchesProtojson(t *testing.T) {
	fixed := []string{
		``, ` `, `{}`, ` { } `, `{`, `}`, `[]`, `null`, `"x"`, `{"content":"aGVsbG8="}`,
		`{"content":"aGVsbG8="} trailing`, `{"content":"aGVsbG8="}{"content":"eA=="}`,
		`{"content":"aGVsbG8"}`, `{"content":"aGVsbG8=="}`, `{"content":"a-_b"}`, `{"content":"a+/b"}`,
		`{"content":"a-/b"}`, `{"content":"===="}`, `{"content":"Zg"}`, `{"content":"Zg=="}`, `{"content":"Z"}`,
		`{"content":""}`, `{"content":null}`, `{"content":1}`, `{"content":"aGVs\nbG8="}`, `{"content":"aGVs\u0041bG8="}`,
		`{"content_type":"a"}`, `{"contentType":"a","content_type":"b"}`, `{"contentType":"a","contentType":"b"}`,
		`{"metadata":{}}`, `{"metadata":{"a":"b","a":"c"}}`, `{"metadata":{"a":1}}`, `{"metadata":null}`,
		`{"metadata":{"a":"b"},"metadata":{}}`, `{"metadata":{"a":"b",}}`, `{"contentType":"a",}`, `{,}`,
		`{"displayName":"caf\xc3\xa9"}`, `{"displayName":"\xff"}`, `{"displayName":"a\tb"}`, `{"displayName":"a\u00e9"}`,
		`{"requestId":"` + strings.Repeat("r", 300) + `"}`, `{"split":{"strategy":"SPLIT_FIXED_BYTES"}}`,
		`{"unknown":1}`, `{"contentTyp":"a"}`, "\ufeff{}", `{"content":"aGVsbG8=" "contentType":"a"}`,
		`{"content" "aGVsbG8="}`, `{"content":"aGVsbG8=",  "contentType" : "text/plain" ,"requestId":"r1"}`,
	}
	fixed = append(fixed, "{\"content\":\"aGVz\nbG9v\"}", "{\"content\":\"aGVz\rbG9v\"}", "{\"content\":\"aGVs\nbG8=\"}", "{\"content\":\"aGVs\rbG8=\"}", "{\"content\":\"aGVs\tbG8=\"}",
		"{\"content\":\"aGVs\u00e9bG8=\"}", "{\"content\":\"aGVs\\\"bG8=\"}", "{\"content\":\"aGVsbG8=\"\n}")
	for _, s := range fixed {
		sameSubmitDecode(t, []byte(s), len(s)/2)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x5b))
	fast := 0
	const n = 1000
	for range n {
		body := randomSubmitBody(rng)
		if sameSubmitDecode(t, body, rng.IntN(len(body)+1)) {
			fast++
		}
	}
	if fast < n/4 {
		t.Fatalf("seed %d: the hand decoder took %d of %d bodies; the common shape should be most", seed, fast, n)
	}
	t.Logf("hand decoder took %d of %d random bodies", fast, n)
}

// randomSubmitBody is a SubmitDocument body: half of them clean (the
// common shape's fields and values, each field once), the rest with
// seeded corners.
func randomSubmitBody(rng *rand.Rand) []byte {
	if rng.IntN(2) == 0 {
		return cleanSubmitBody(rng)
	}
	ws := func() string { return []string{"", "", " ", "\n\t ", "\r\n"}[rng.IntN(5)] }
	var b strings.Builder
	b.WriteString(ws() + "{")
	fields := 1 + rng.IntN(5)
	for i := range fields {
		if i > 0 {
			b.WriteString(ws() + "," + ws())
		}
		key := []string{"content", "contentType", "requestId", "displayName", "metadata",
			"content", "contentType", "content_type", "split", "unknownField", "request_id"}[rng.IntN(11)]
		b.WriteString(`"` + key + `"` + ws() + ":" + ws())
		switch key {
		case "content":
			b.WriteString(randomBase64(rng))
		case "metadata":
			b.WriteString("{")
			for j := range rng.IntN(4) {
				if j > 0 {
					b.WriteString(",")
				}
				b.WriteString(randomJSONString(rng) + ws() + ":" + ws() + randomJSONString(rng))
			}
			b.WriteString("}")
		case "split":
			b.WriteString(`{"strategy":"SPLIT_FIXED_BYTES","chunkBytes":4096}`)
		default:
			b.WriteString(randomJSONString(rng))
		}
	}
	b.WriteString(ws() + "}" + []string{"", "", "", " x", "{}"}[rng.IntN(5)])
	body := []byte(b.String())
	switch rng.IntN(12) { // damage some
	case 0:
		body = body[:rng.IntN(len(body)+1)]
	case 1:
		body[rng.IntN(len(body))] = byte(rng.IntN(256))
	}
	return body
}

// cleanSubmitBody is a body of the common shape.
func cleanSubmitBody(rng *rand.Rand) []byte {
	raw := make([]byte, rng.IntN(1500))
	for i := range raw {
		raw[i] = byte(rng.IntN(256))
	}
	m := map[string]any{"content": raw}
	for _, k := range []string{"contentType", "requestId", "displayName"} {
		if rng.IntN(2) == 0 {
			m[k] = strings.Repeat("é", rng.IntN(3)) + "text/plain" + strings.Repeat("x", rng.IntN(20))
		}
	}
	if rng.IntN(2) == 0 {
		m["metadata"] = map[string]string{"a": "1", "pipestream.b": strings.Repeat("v", rng.IntN(9))}
	}
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	_ = e.Encode(m) // []byte as standard base64, as a client sends it
	return buf.Bytes()
}

// randomBase64 is a JSON value for a bytes field: mostly valid base64 in
// every variant protojson takes, sometimes not.
func randomBase64(rng *rand.Rand) string {
	raw := make([]byte, rng.IntN(64))
	for i := range raw {
		raw[i] = byte(rng.IntN(256))
	}
	encs := []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding}
	s := encs[rng.IntN(len(encs))].EncodeToString(raw)
	switch rng.IntN(10) {
	case 0:
		return "null"
	case 1:
		return `"` + s + `=="`
	case 2:
		return `"` + s + `!"`
	case 3:
		return `"` + strings.ReplaceAll(s, "A", `\u0041`) + `"`
	case 4:
		return `"` + s + `-/+"`
	}
	return `"` + s + `"`
}

// randomJSONString is a JSON value for a string field: plain ASCII,
// UTF-8, invalid UTF-8, escapes, control characters, or not a string.
func randomJSONString(rng *rand.Rand) string {
	switch rng.IntN(10) {
	case 0:
		return `"caf` + "\xc3\xa9" + `"`
	case 1:
		return `"bad` + "\xff\xfe" + `"`
	case 2:
		return `"a\"b\\c\u00e9\ud83d\ude00"`
	case 3:
		return "\"tab\there\""
	case 4:
		return []string{"null", "1", "true", "[]", "{}"}[rng.IntN(5)]
	case 5:
		return `""`
	}
	return `"text/plain-` + strings.Repeat("x", rng.IntN(20)) + `"`
}

// FuzzSubmitJSONDecode: on any body, the hand decoder of SubmitDocument
// gives protojson's message or error.
func FuzzSubmitJSONDecode(f *testing.F) {
	for _, s := range []string{
		`{"content":"aGVsbG8=","contentType":"text/plain"}`, `{"metadata":{"a":"b"},"displayName":"d"}`,
		`{"content":"a-_b"}`, `{"content":"Zg"}`, `{"contentType":"a","content_type":"b"}`, `{"content":null}`,
		`{"displayName":"\xff"}`, `{"requestId":"a\u0041"}`, ``, `{`,
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		sameSubmitDecode(t, body, int(cut))
	})
}
