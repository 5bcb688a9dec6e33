package quicpeer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// inlineLimit makes the client keep COMPLETE extensions of up to n octets
// (quicpeer.Limits.InlineResultBytes, docs/profile.md 4.3.2).
func inlineLimit(n int) pairOpts {
	return func(c, _ *quicpeer.Config) { c.Limits.InlineResultBytes = n }
}

// A result carried inline by COMPLETE (docs/profile.md 4.3.2) crosses a
// real session: the client's HandleStatus gets the extension and
// StatusFrame.InlineResult gives back the header and payload the server
// sent. An extension above the client's limit is skipped unread (draft-02
// Section 6.6.1) and delivered as COMPLETE with ExtSkipped, the session
// goes on (the next entity completes), and InlineResult refuses it with
// 0x06.
func TestInlineResultSession(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		const limit = 4 << 10
		p := newPair(t, m, inlineLimit(limit))
		ctx := context.Background()
		c := wire.CodecFor(m.format)
		send := func(out []byte) (wire.StatusFrame, []byte) {
			t.Helper()
			id, err := p.client.AssignID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.client.SendEntity(ctx, header(id, 10, 1), newGen(10, 1)); err != nil {
				t.Fatal(err)
			}
			if r := recv(t, p.sr.entities, "the entity at the server"); r.err != nil {
				t.Fatal(r.err)
			}
			sum := sha256.Sum256(out)
			scope := uint32(0)
			h := &wire.EntityHeader{EntityID: id, ScopeID: &scope, ContentType: "text/plain", PayloadLength: uint64(len(out)),
				Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result"}}
			ext, err := wire.AppendInlineResultExt(nil, c, h, out)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.server.SendStatus(status(wire.StatusProcessing, id)); err != nil {
				t.Fatal(err)
			}
			f := status(wire.StatusComplete, id)
			f.HasExt, f.Ext = true, ext
			if err := p.server.SendStatus(f); err != nil {
				t.Fatal(err)
			}
			if st := nextStatus(t, p.cr); st.Status != wire.StatusProcessing || st.EntityID != id {
				t.Fatalf("got %+v, want PROCESSING(%d)", st, id)
			}
			st := nextStatus(t, p.cr)
			if st.Status != wire.StatusComplete || st.EntityID != id || !st.HasExt {
				t.Fatalf("got %+v, want COMPLETE(%d) with an extension", st, id)
			}
			return st, ext
		}

		small := bytes.Repeat([]byte("inline "), 100)
		st, ext := send(small) // the recorder copied Ext out of the session's buffer
		h, got, err := st.InlineResult(c, limit)
		if err != nil || !bytes.Equal(got, small) || h.ContentType != "text/plain" || !bytes.Equal(st.Ext, ext) {
			t.Fatalf("InlineResult: %v, %d octets; want the %d sent", err, len(got), len(small))
		}

		large := bytes.Repeat([]byte("x"), 2*limit)
		f, ext2 := send(large)
		if f.Ext != nil || f.ExtSkipped != uint32(len(ext2)) {
			t.Fatalf("over the limit: Ext %d octets, ExtSkipped %d; want nil and %d", len(f.Ext), f.ExtSkipped, len(ext2))
		}
		if _, _, err := f.InlineResult(c, limit); wire.CodeOf(err) != wire.CodeEntityTooLarge {
			t.Fatalf("InlineResult over the limit: %v, want 0x06", err)
		}
		// The session read past the skipped extension: a third entity completes.
		send([]byte("after"))
	})
}
