package wire_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// fromDraft04 maps a draft-04 fixed frame (type, 4-octet length, payload)
// to draft-02: F = type || payload[0:3] || payload[4:] (vectors README:
// STATUS F maps to payload F[1] F[2] F[3] 00 F[4..]).
func fromDraft04(t *testing.T, b []byte) []byte {
	t.Helper()
	if len(b) < 9 {
		t.Fatalf("draft-04 frame too short: %x", b)
	}
	p := b[5:]
	return append(append([]byte{b[0]}, p[0:3]...), p[4:]...)
}

func TestDraft04FixedFramesCompat(t *testing.T) {
	type check func(t *testing.T, f wire.StatusFrame)
	status := map[string]check{
		"valid-status-complete.bin": func(t *testing.T, f wire.StatusFrame) {
			if f.Status != wire.StatusComplete || f.EntityID != 7 || f.ScopeID != 0 || f.HasCursor || f.HasExt {
				t.Fatalf("%+v", f)
			}
		},
		"valid-status-pending.bin":    func(t *testing.T, f wire.StatusFrame) { mustStatus(t, f, wire.StatusPending, 7) },
		"valid-status-processing.bin": func(t *testing.T, f wire.StatusFrame) { mustStatus(t, f, wire.StatusProcessing, 7) },
		"valid-status-heartbeat.bin": func(t *testing.T, f wire.StatusFrame) {
			mustStatus(t, f, wire.StatusUnspecified, wire.ConnectionEntity)
			if err := wire.CheckStatusFrame(&f, false, false); err != nil {
				t.Fatal(err)
			}
		},
		"valid-status-cursor.bin": func(t *testing.T, f wire.StatusFrame) {
			mustStatus(t, f, wire.StatusUnspecified, wire.ConnectionEntity)
			if !f.HasCursor || f.Cursor != 8 {
				t.Fatalf("%+v", f)
			}
		},
		// Draft-04 forbids a cursor on an entity status; draft-02 does not.
		"invalid-status-entity-cursor.bin": func(t *testing.T, f wire.StatusFrame) {
			if !f.HasCursor || f.Cursor != 8 || f.EntityID != 7 {
				t.Fatalf("%+v", f)
			}
		},
	}
	for name, chk := range status {
		t.Run(name, func(t *testing.T) {
			b := fromDraft04(t, readVec(t, "draft04-fixed-frames/"+name))
			f, n, err := wire.ParseStatus(b)
			if err != nil || n != len(b) {
				t.Fatalf("n=%d len=%d err=%v", n, len(b), err)
			}
			chk(t, f)
			if got := f.Append(nil); !bytes.Equal(got, b) {
				t.Fatalf("re-encoded %x want %x", got, b)
			}
		})
	}
	t.Run("invalid-status-bad-version.bin", func(t *testing.T) {
		_, _, err := wire.ParseStatus(fromDraft04(t, readVec(t, "draft04-fixed-frames/invalid-status-bad-version.bin")))
		wantCode(t, err, wire.CodeLayerUnsupported)
	})
	// C=1 announces a cursor that is not there: a proper prefix in draft-02.
	for _, name := range []string{"invalid-status-cursor-flag-mismatch.bin", "invalid-status-short.bin"} {
		t.Run(name, func(t *testing.T) {
			_, _, err := wire.ParseStatus(fromDraft04(t, readVec(t, "draft04-fixed-frames/"+name)))
			if !errors.Is(err, wire.ErrShort) {
				t.Fatalf("err = %v, want ErrShort", err)
			}
		})
	}
	for _, name := range []string{"valid-goaway.bin", "valid-goaway-reserved.bin"} {
		t.Run(name, func(t *testing.T) {
			b := fromDraft04(t, readVec(t, "draft04-fixed-frames/"+name))
			f, n, err := wire.ParseGoAway(b)
			if err != nil || n != wire.GoAwayFrameLen || f.LastEntityID != 7 {
				t.Fatalf("%+v n=%d err=%v", f, n, err)
			}
		})
	}
}

func mustStatus(t *testing.T, f wire.StatusFrame, s wire.Status, id uint32) {
	t.Helper()
	if f.Status != s || f.EntityID != id {
		t.Fatalf("got %v entity %d, want %v entity %d", f.Status, f.EntityID, s, id)
	}
}

// TestRecursiveVectors covers recursive/index.tsv: entity/capabilities/
// checkpoint rows share draft-02 framing; status/scope-digest/barrier rows
// go through the draft-04 mapping.
func TestRecursiveVectors(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	seen := 0
	for _, row := range tsvRows(t, "recursive/index.tsv") {
		// capabilities rows (minimal/recursive) are not in this file; see
		// the cddl tests.
		check, ok := recursiveChecks[row["kind"]]
		if !ok {
			continue
		}
		seen++
		r := vectorRow{name: row["name"], exp: row["expectation"], row: row, b: unhex(t, row["hex"])}
		t.Run(r.name, func(t *testing.T) { check(t, c, r) })
	}
	if seen < 15 {
		t.Fatalf("only %d rows exercised", seen)
	}
}

// vectorRow is one row of a vector index: its name, expectation (valid or
// invalid), all its columns and the decoded hex.
type vectorRow struct {
	name, exp string
	row       map[string]string
	b         []byte
}

// recursiveChecks checks a recursive/index.tsv row of each kind.
var recursiveChecks = map[string]func(t *testing.T, c wire.Codec, r vectorRow){
	"entity":       checkRecursiveEntity,
	"checkpoint":   checkRecursiveCheckpoint,
	"status":       checkRecursiveStatus,
	"scope-digest": checkRecursiveScopeDigest,
	"barrier":      checkRecursiveBarrier,
	"claim-redemption": func(t *testing.T, _ wire.Codec, r vectorRow) {
		// type 0x82 is draft-04 only: a draft-02 ControlReader skips it.
		if _, err := readOneFrame(t, r.b); err == nil {
			t.Fatal("unknown variable frame returned as a frame")
		}
	},
}

func checkRecursiveEntity(t *testing.T, c wire.Codec, r vectorRow) {
	h, _, err := readEntity(c, r.b)
	if r.exp != "valid" {
		// parent-scope-id is draft-04; draft-02 ignores the unknown
		// key, so these decode (the scope rule is the session's).
		if err != nil {
			t.Fatalf("draft-02 decodes %s: %v", r.name, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if h.CompletionPolicy == nil || *h.CompletionPolicy.Mode != wire.ModeQuorum || *h.CompletionPolicy.MinSuccessRatio != 0.75 ||
		*h.CompletionPolicy.OnFailure != wire.ActionRetry || *h.CompletionPolicy.MaxRetries != 2 || h.Metadata["kind"] != "video-segment" {
		t.Fatalf("header %+v policy %+v", h, h.CompletionPolicy)
	}
}

func checkRecursiveCheckpoint(t *testing.T, c wire.Codec, r vectorRow) {
	f, err := readOneFrame(t, r.b)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := c.UnmarshalCheckpoint(f.Body)
	if err != nil || cp.CheckpointID != "scope-7-complete" || *cp.ScopeID != 7 || cp.CheckpointEntityID != 10 {
		t.Fatalf("%+v %v", cp, err)
	}
	// scoped-checkpoint-on-layer0 is rejected by the session (scope 7
	// without Layer 1), not by the codec.
}

func checkRecursiveStatus(t *testing.T, _ wire.Codec, r vectorRow) {
	f, _, err := wire.ParseStatus(fromDraft04(t, r.b))
	if err != nil {
		t.Fatal(err)
	}
	layer1, layer2 := r.row["layer"] >= "1", r.row["layer"] == "2"
	err = wire.CheckStatusFrame(&f, layer1, layer2)
	switch {
	case r.exp == "valid":
		if err != nil {
			t.Fatal(err)
		}
		checkStatusExtension(t, r.name, &f)
	case r.row["error"] == "PIPESTREAM_LAYER_UNSUPPORTED":
		wantCode(t, err, wire.CodeLayerUnsupported)
	case r.row["error"] == "PIPESTREAM_ENTITY_INVALID":
		wantCode(t, err, wire.CodeEntityInvalid)
	default:
		t.Fatalf("unhandled row %v", r.row)
	}
}

// checkStatusExtension checks the decoded extension of the valid
// yielded-status and deferred-status rows.
func checkStatusExtension(t *testing.T, name string, f *wire.StatusFrame) {
	switch name {
	case "yielded-status":
		y, err := f.Yield()
		if err != nil || y.Reason != 1 || string(y.Token) != "opaque continuation" {
			t.Fatalf("%+v %v", y, err)
		}
	case "deferred-status":
		cc, err := f.ClaimCheck()
		if err != nil || cc.ClaimID != 42 || cc.ExpiryMicros != 0x0006651728988000 {
			t.Fatalf("%+v %v", cc, err)
		}
	}
}

func checkRecursiveScopeDigest(t *testing.T, _ wire.Codec, r vectorRow) {
	f, _, err := wire.ParseScopeDigest(fromDraft04(t, r.b))
	if err != nil || f.Processed != 3 || f.Succeeded != 2 || f.Failed != 1 || f.MerkleRoot[0] != 0x5a {
		t.Fatalf("%+v %v", f, err)
	}
	if (f.ScopeID == 0) != (r.exp == "invalid") {
		t.Fatalf("scope %d for %s row", f.ScopeID, r.exp)
	}
}

func checkRecursiveBarrier(t *testing.T, _ wire.Codec, r vectorRow) {
	f, _, err := wire.ParseBarrier(fromDraft04(t, r.b))
	if err != nil || !f.Released || f.ParentEntityID != 1 {
		t.Fatalf("%+v %v", f, err)
	}
	if (f.ScopeID == 0) != (r.exp == "invalid") {
		t.Fatalf("scope %d for %s row", f.ScopeID, r.exp)
	}
}

// TestCDDLBodies decodes cddl-bodies.tsv and optional-fields.tsv bodies.
func TestCDDLBodies(t *testing.T) {
	c := wire.CodecFor(wire.FormatCBOR)
	// Outcome under draft-02 for each row; "" = decodes and validates.
	want := map[string]wire.ErrorCode{
		"capabilities-window-overflow": wire.CodeEntityTooLarge,
		"entity-reserved-id":           wire.CodeEntityInvalid,
		"entity-reserved-parent":       wire.CodeEntityInvalid,
		"invalid-utf8-checkpoint":      wire.CodeEntityInvalid,
		"duplicate-sequence":           wire.CodeEntityInvalid,
		// draft-02 requires payload-length (Section 6.8.2.1); this draft-04
		// body has none.
		"entity-scoped": wire.CodeEntityInvalid,
		// long-sequence (non-shortest uint) and unsorted-checkpoint are
		// valid CBOR: draft-02 receivers MUST accept any valid CBOR uint.
	}
	skip := map[string]bool{"checkpoint-bad-flags": true, "checkpoint-unknown-field": true} // misspelled in the original
	rows := append(tsvRows(t, "cddl-bodies.tsv"), tsvRows(t, "optional-fields.tsv")...)
	for _, row := range rows {
		name := row["name"]
		if skip[name] {
			continue
		}
		kind := row["kind"]
		if kind == "" {
			kind, _, _ = cut(name)
		}
		b := unhex(t, row["hex"])
		t.Run(name, func(t *testing.T) {
			var err error
			switch kind {
			case "capabilities", "minimal", "recursive":
				var caps *wire.Capabilities
				if caps, err = c.UnmarshalCapabilities(b); err == nil {
					err = wire.ValidateCapabilities(caps)
				}
			case "checkpoint", "omitted", "explicit", "invalid", "long", "duplicate", "unsorted":
				_, err = c.UnmarshalCheckpoint(b)
			case "entity":
				_, err = c.UnmarshalEntityHeader(b)
			case "claim":
				t.Skip("claim-redemption bodies are draft-04 only")
			default:
				t.Fatalf("unknown kind %q", kind)
			}
			if code, bad := want[name]; bad {
				wantCode(t, err, code)
			} else if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '-' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
