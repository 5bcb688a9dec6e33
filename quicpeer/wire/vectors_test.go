package wire_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Vectors are a frozen copy of /work/shared/vectors (see its README.md).
const vecDir = "testdata/vectors"

func readVec(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vecDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tsvRows returns the rows of a TSV file as maps keyed by the header names;
// lines starting with '#' are comments.
func tsvRows(t *testing.T, name string) []map[string]string {
	t.Helper()
	return tsvRowsF(t, name)
}

func tsvRowsF(t testing.TB, name string) []map[string]string {
	f, err := os.Open(filepath.Join(vecDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var hdr []string
	var rows []map[string]string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cols := strings.Split(line, "\t")
		if hdr == nil {
			hdr = cols
			continue
		}
		row := map[string]string{}
		for i, c := range cols {
			row[hdr[i]] = c
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

func unhex(t *testing.T, s string) []byte { return unhexF(t, s) }

func unhexF(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, err error, code wire.ErrorCode) {
	t.Helper()
	var pe *wire.Error
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v (%T), want *wire.Error %v", err, err, code)
	}
	if pe.Code != code {
		t.Fatalf("code = %v (%v), want %v", pe.Code, err, code)
	}
}

// readEntity reads a whole entity frame: header then payload to EOF.
func readEntity(c wire.Codec, b []byte) (*wire.EntityHeader, []byte, error) {
	r := bytes.NewReader(b)
	h, err := wire.ReadEntityHeader(r, c, 0)
	if err != nil {
		return nil, nil, err
	}
	p, err := io.ReadAll(wire.NewPayloadReader(r, h))
	return h, p, err
}

func TestVectorsEntity(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	payload := []byte("PipeStream Layer 0\n")
	valid := map[string]func(*testing.T, *wire.EntityHeader){
		"valid-entity-text.bin": func(t *testing.T, h *wire.EntityHeader) {
			if h.EntityID != 7 || h.ParentID != nil || h.Layer != 0 || h.PayloadLength != 19 || h.ContentType != "text/plain; charset=utf-8" {
				t.Fatalf("header %+v", h)
			}
		},
		"valid-entity-child.bin": func(t *testing.T, h *wire.EntityHeader) {
			if h.EntityID != 8 || h.ParentID == nil || *h.ParentID != 7 {
				t.Fatalf("header %+v", h)
			}
		},
		// draft-02 is silent on unknown keys; docs/profile.md 1 tolerates them.
		"invalid-entity-unknown-field.bin": func(t *testing.T, h *wire.EntityHeader) {
			if h.EntityID != 7 {
				t.Fatalf("header %+v", h)
			}
		},
	}
	for name, check := range valid {
		t.Run(name, func(t *testing.T) {
			h, p, err := readEntity(c, readVec(t, "entity/"+name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(p, payload) {
				t.Fatalf("payload %q", p)
			}
			check(t, h)
		})
	}
	invalid := map[string]wire.ErrorCode{
		"invalid-entity-checksum-mismatch.bin": wire.CodeIntegrityError,
		"invalid-entity-reserved-id.bin":       wire.CodeEntityInvalid,
		"invalid-entity-reserved-parent.bin":   wire.CodeEntityInvalid,
		"invalid-entity-length-mismatch.bin":   wire.CodeEntityInvalid,
		"invalid-entity-header-truncated.bin":  wire.CodeEntityInvalid,
		"invalid-entity-missing-id.bin":        wire.CodeEntityInvalid,
	}
	for name, code := range invalid {
		t.Run(name, func(t *testing.T) {
			_, _, err := readEntity(c, readVec(t, "entity/"+name))
			wantCode(t, err, code)
		})
	}
}

// TestVectorsEntityReencode checks that our deterministic encoder
// reproduces the reference headers byte for byte.
func TestVectorsEntityReencode(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	for _, name := range []string{"valid-entity-text.bin", "valid-entity-child.bin"} {
		b := readVec(t, "entity/"+name)
		r := bytes.NewReader(b)
		h, err := wire.ReadEntityHeader(r, c, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := wire.WriteEntityHeader(&out, c, h); err != nil {
			t.Fatal(err)
		}
		hdrLen := len(b) - r.Len()
		if !bytes.Equal(out.Bytes(), b[:hdrLen]) {
			t.Fatalf("%s: re-encoded header\n%x\nwant\n%x", name, out.Bytes(), b[:hdrLen])
		}
	}
}
