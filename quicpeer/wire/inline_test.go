package wire_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// inlineHeader is a result header for payload p of entity id (profile 4.3).
func inlineHeader(id uint32, p []byte) *wire.EntityHeader {
	sum := sha256.Sum256(p)
	scope := uint32(0)
	return &wire.EntityHeader{EntityID: id, ScopeID: &scope, Layer: 2, ContentType: "application/json",
		PayloadLength: uint64(len(p)), Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result"}}
}

func completeWith(id uint32, ext []byte) *wire.StatusFrame {
	return &wire.StatusFrame{Status: wire.StatusComplete, EntityID: id, HasExt: true, Ext: ext}
}

// An inline result (docs/profile.md 4.3.2) survives a STATUS round trip in
// both formats: the header (checksum, metadata, layer, content-type) and
// the payload come back as sent, and the extension is exactly the result's
// entity frame (Header Length, header, payload), as on a result stream.
func TestInlineResultRoundTrip(t *testing.T) {
	for _, format := range []wire.Format{wire.FormatCBOR, wire.FormatProtobuf} {
		t.Run(format.String(), func(t *testing.T) {
			c := wire.CodecFor(format)
			for _, p := range [][]byte{{}, []byte("x"), bytes.Repeat([]byte("result "), 2000)} {
				h := inlineHeader(41, p)
				ext, err := wire.AppendInlineResultExt(nil, c, h, p)
				if err != nil {
					t.Fatal(err)
				}
				var stream bytes.Buffer
				if err := wire.WriteEntityHeader(&stream, c, h); err != nil {
					t.Fatal(err)
				}
				stream.Write(p)
				if !bytes.Equal(ext, stream.Bytes()) {
					t.Fatalf("extension differs from the result stream's octets")
				}
				f := completeWith(41, ext)
				parsed, n, err := wire.ParseStatus(f.Append(nil))
				if err != nil || n != f.Length() {
					t.Fatalf("ParseStatus: %v (n %d, want %d)", err, n, f.Length())
				}
				gh, gp, err := parsed.InlineResult(c, len(ext))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(gp, p) || !bytes.Equal(gh.Checksum, h.Checksum) || gh.ContentType != h.ContentType || gh.Layer != 2 ||
					gh.Metadata["pipestream.role"] != "result" || gh.EntityID != 41 {
					t.Fatalf("decoded %+v, %d octets; want %+v, %d octets", gh, len(gp), h, len(p))
				}
			}
		})
	}
}

// Every defect of an inline result is an error with the code the same
// bytes on a result stream would get (0x05 malformed, 0x04 checksum), and
// an extension above the receiver's offer is 0x06; none panics.
func TestInlineResultMalformed(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	p := []byte("the result")
	good, err := wire.AppendInlineResultExt(nil, c, inlineHeader(7, p), p)
	if err != nil {
		t.Fatal(err)
	}
	hl := int(binary.BigEndian.Uint32(good))
	flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 0x01; return b }
	cases := []struct {
		name  string
		f     *wire.StatusFrame
		max   int
		code  wire.ErrorCode
		extra string
	}{
		{"not COMPLETE", &wire.StatusFrame{Status: wire.StatusFailed, EntityID: 7, HasExt: true, Ext: good}, 1 << 16, wire.CodeEntityInvalid, ""},
		{"no extension", &wire.StatusFrame{Status: wire.StatusComplete, EntityID: 7}, 1 << 16, wire.CodeEntityInvalid, ""},
		{"above the offer", completeWith(7, good), len(good) - 1, wire.CodeEntityTooLarge, "offered"},
		{"skipped unread", &wire.StatusFrame{Status: wire.StatusComplete, EntityID: 7, HasExt: true, ExtSkipped: 1 << 20}, 1 << 16, wire.CodeEntityTooLarge, "skipped"},
		{"no Header Length", completeWith(7, good[:3]), 1 << 16, wire.CodeEntityInvalid, ""},
		{"Header Length 0", completeWith(7, append([]byte{0, 0, 0, 0}, good[4:]...)), 1 << 16, wire.CodeEntityInvalid, ""},
		{"Header Length beyond the extension", completeWith(7, append([]byte{0, 0, 1, 0}, good[4:]...)), 1 << 16, wire.CodeEntityInvalid, ""},
		{"header cut short", completeWith(7, append(binary.BigEndian.AppendUint32(nil, uint32(hl-3)), good[4:4+hl-3]...)), 1 << 16, wire.CodeEntityInvalid, ""},
		{"wrong entity-id", completeWith(8, good), 1 << 16, wire.CodeEntityInvalid, "entity-id"},
		{"payload short", completeWith(7, good[:len(good)-1]), 1 << 16, wire.CodeEntityInvalid, "payload-length"},
		{"payload long", completeWith(7, append(bytes.Clone(good), 'x')), 1 << 16, wire.CodeEntityInvalid, "payload-length"},
		{"wrong checksum", completeWith(7, flip(len(good)-1)), 1 << 16, wire.CodeIntegrityError, "SHA-256"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.f.InlineResult(c, tc.max)
			var pe *wire.Error
			if !errors.As(err, &pe) || pe.Code != tc.code {
				t.Fatalf("err = %v, want code %s", err, tc.code)
			}
			if tc.extra != "" && !bytes.Contains([]byte(err.Error()), []byte(tc.extra)) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.extra)
			}
		})
	}
	// A header without a checksum is refused on both ends.
	h := inlineHeader(7, p)
	h.Checksum = nil
	if _, err := wire.AppendInlineResultExt(nil, c, h, p); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("AppendInlineResultExt without checksum: %v, want 0x05", err)
	}
	var hb bytes.Buffer
	_ = wire.WriteEntityHeader(&hb, c, h)
	if _, _, err := completeWith(7, append(hb.Bytes(), p...)).InlineResult(c, 1<<16); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("InlineResult without checksum: %v, want 0x05", err)
	}
}

// Draft-02 Section 6.6.1: "If E=1 is set for a Status code that does not
// define an extension layout in this specification (or a negotiated
// extension), the receiver MUST use the Extension Length to skip the
// data." A ControlReader whose COMPLETE limit is below an extension skips
// it by its Extension Length without buffering it (its buffer never grows
// toward the 1 MiB declared) and reads the frames after it; one at the
// limit keeps the data for the negotiated layout.
func TestControlReaderSkipsCompleteExtension(t *testing.T) {
	big := bytes.Repeat([]byte{0xA5}, 1<<20)
	small := []byte("kept")
	var stream []byte
	f1 := wire.StatusFrame{Status: wire.StatusComplete, EntityID: 1, HasCursor: true, Cursor: 9, HasExt: true, Ext: big}
	stream = f1.Append(stream)
	stream = completeWith(2, small).Append(stream)
	stream = (&wire.StatusFrame{Status: wire.StatusProcessing, EntityID: 3}).Append(stream)
	// Another code's extension is not affected by the COMPLETE limit.
	stream = (&wire.StatusFrame{Status: wire.StatusCheckpoint, EntityID: 4, HasExt: true, Ext: []byte{1, 2, 3, 4, 5}}).Append(stream)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cr := wire.NewControlReader(bytes.NewReader(stream), wire.MaxVariableLength)
	cr.SetCompleteExtLimit(len(small))
	fr, err := cr.Next()
	runtime.ReadMemStats(&m1)
	if err != nil {
		t.Fatal(err)
	}
	if grew := m1.TotalAlloc - m0.TotalAlloc; grew > 256<<10 {
		t.Fatalf("reading the frame allocated %d octets: the skipped 1 MiB extension was buffered", grew)
	}
	s := fr.Status
	if s.Status != wire.StatusComplete || s.EntityID != 1 || !s.HasExt || s.Ext != nil || s.ExtSkipped != uint32(len(big)) || !s.HasCursor || s.Cursor != 9 {
		t.Fatalf("first frame %+v (ext %d octets): want COMPLETE(1) cursor 9 with its 1 MiB extension skipped", s, len(s.Ext))
	}
	want := []struct {
		st  wire.Status
		id  uint32
		ext []byte
	}{{wire.StatusComplete, 2, small}, {wire.StatusProcessing, 3, nil}, {wire.StatusCheckpoint, 4, []byte{1, 2, 3, 4, 5}}}
	for _, w := range want {
		fr, err := cr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if fr.Status.Status != w.st || fr.Status.EntityID != w.id || !bytes.Equal(fr.Status.Ext, w.ext) || fr.Status.ExtSkipped != 0 {
			t.Fatalf("frame %+v, want %s(%d) with extension %q", fr.Status, w.st, w.id, w.ext)
		}
	}
	if _, err := cr.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}

	// A stream that ends inside a skipped extension is malformed (0x05).
	cr = wire.NewControlReader(bytes.NewReader(f1.Append(nil)[:1000]), wire.MaxVariableLength)
	cr.SetCompleteExtLimit(0)
	if _, err := cr.Next(); wire.CodeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("truncated skipped extension: %v, want 0x05", err)
	}
	// Without a limit of its own, the reader keeps the extension (up to maxVar).
	cr = wire.NewControlReader(bytes.NewReader(completeWith(5, big[:100]).Append(nil)), wire.MaxVariableLength)
	if fr, err := cr.Next(); err != nil || len(fr.Status.Ext) != 100 {
		t.Fatalf("default reader: %v, %d octets of extension; want all 100", err, len(fr.Status.Ext))
	}
}

// FuzzInlineResult: any extension either decodes to a result whose
// payload has the header's length and SHA-256 and entity-id, or fails
// with a *wire.Error; it never panics and never accepts more than maxExt.
func FuzzInlineResult(f *testing.F) {
	for _, format := range []wire.Format{wire.FormatCBOR, wire.FormatProtobuf} {
		p := []byte("seed result")
		ext, err := wire.AppendInlineResultExt(nil, wire.CodecFor(format), inlineHeader(3, p), p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(format), ext, uint16(len(ext)))
		f.Add(byte(format), ext[:len(ext)-2], uint16(len(ext)))
	}
	f.Fuzz(func(t *testing.T, format byte, ext []byte, maxExt uint16) {
		c := wire.CodecFor(wire.Format(format % 2))
		fr := completeWith(3, ext)
		h, p, err := fr.InlineResult(c, int(maxExt))
		if err != nil {
			var pe *wire.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not a *wire.Error", err, err)
			}
			return
		}
		sum := sha256.Sum256(p)
		if len(ext) > int(maxExt) || h.EntityID != 3 || h.PayloadLength != uint64(len(p)) || !bytes.Equal(sum[:], h.Checksum) {
			t.Fatalf("accepted %d octets (max %d): header %+v, payload %d octets", len(ext), maxExt, h, len(p))
		}
	})
}
