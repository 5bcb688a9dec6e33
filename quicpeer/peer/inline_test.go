package peer_test

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// The peer sends a whole document's result inline in COMPLETE (profile
// 4.3.2) only on a profile connection whose root offers it and when the
// result fits the offer; otherwise it opens a result stream (4.3). The
// inline result is the result stream's header and payload.
func TestInlineResultOnlyWhenOffered(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		const offer = 4 << 10
		profile := func(c *quicpeer.Config) { c.Profile, c.Limits.InlineResultBytes = true, offer }
		offered := map[string]string{peer.MetaAcceptInlineResult: strconv.Itoa(offer)}
		small := strings.Repeat("inline ", 100)

		c := dialWith(t, srv, format, nil, profile)
		id := c.sendWhole(t, small, offered, nil)
		f := c.rec.waitStatus(t, id, wire.StatusComplete)
		h, got, err := f.InlineResult(wire.CodecFor(format), offer)
		if err != nil || !bytes.Equal(got, []byte(small)) || h.Metadata[peer.MetaRole] != "result" || h.ContentType != "text/plain" {
			t.Fatalf("inline result: %v, %d octets, header %+v; want the %d-octet passthrough result", err, len(got), h, len(small))
		}
		if got := c.rec.history(0, id); !slices.Equal(got, statuses(wire.StatusProcessing, wire.StatusComplete)) {
			t.Fatalf("statuses %v", got)
		}

		// Too large for the offer: a result stream, COMPLETE without extension.
		large := strings.Repeat("x", 2*offer)
		id = c.sendWhole(t, large, offered, nil)
		if res := c.rec.waitResult(t, id); string(res.data) != large {
			t.Fatalf("large result: %d octets on a stream, want %d", len(res.data), len(large))
		}
		if f := c.rec.waitStatus(t, id, wire.StatusComplete); f.HasExt {
			t.Fatal("COMPLETE of a result above the offer carries an extension")
		}
		// Not offered on the root: a result stream.
		id = c.sendWhole(t, small, nil, nil)
		if res := c.rec.waitResult(t, id); string(res.data) != small {
			t.Fatalf("unoffered result: %q", res.data)
		}
		if f := c.rec.waitStatus(t, id, wire.StatusComplete); f.HasExt {
			t.Fatal("COMPLETE of a root without the offer carries an extension")
		}

		// Offered, but the connection did not select the profile: a result stream.
		plain := dialWith(t, srv, format, nil, func(c *quicpeer.Config) { c.Limits.InlineResultBytes = offer })
		if plain.sess.Negotiated().Profile {
			t.Fatal("a client that did not offer the profile negotiated it")
		}
		id = plain.sendWhole(t, small, offered, nil)
		if res := plain.rec.waitResult(t, id); string(res.data) != small {
			t.Fatalf("result without the profile: %q", res.data)
		}
		if f := plain.rec.waitStatus(t, id, wire.StatusComplete); f.HasExt {
			t.Fatal("COMPLETE on a connection without the profile carries an extension")
		}
	})
}

// Whole documents' blobs are read into recycled buffers and decoded
// without a copy (the blob aliases the buffer): a buffer must not go back
// to the pool, and be filled with the next document, before its entity's
// result is sent. Many small documents of distinct content in flight at
// once, inline and on result streams, each get exactly their own content
// back.
func TestWholeResultsKeepTheirOwnContent(t *testing.T) {
	modes(t, func(t *testing.T, format wire.Format) {
		srv := startPeer(t, peer.Options{})
		const offer, n = 16 << 10, 120
		c := dialWith(t, srv, format, nil, func(c *quicpeer.Config) { c.Profile, c.Limits.InlineResultBytes = true, offer })
		offered := map[string]string{peer.MetaAcceptInlineResult: strconv.Itoa(offer)}
		want := map[uint32]string{}
		inline := map[uint32]bool{}
		for i := range n {
			content := strings.Repeat(strconv.Itoa(i)+"-", 200+i)
			md := offered
			if i%3 == 0 {
				md = nil // a result stream
			}
			id := c.sendWhole(t, content, md, nil)
			want[id], inline[id] = content, md != nil
		}
		for id, content := range want {
			f := c.rec.waitStatus(t, id, wire.StatusComplete)
			var got []byte
			if inline[id] {
				_, p, err := f.InlineResult(wire.CodecFor(format), offer)
				if err != nil {
					t.Fatalf("entity %d: inline result: %v", id, err)
				}
				got = p
			} else {
				got = c.rec.waitResult(t, id).data
			}
			if string(got) != content {
				t.Fatalf("entity %d: result %.40q... (%d octets), want its own content %.40q... (%d octets)", id, got, len(got), content, len(content))
			}
		}
	})
}
