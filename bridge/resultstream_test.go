package bridge_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// sendResultPart sends part k of a streamed result of root id (profile
// 4.3.1): role result-part, chunk-info {chunk-index k, chunk-offset off}.
func sendResultPart(t *testing.T, s *quicpeer.Session, id uint32, k, off uint64, data []byte) {
	t.Helper()
	sum := sha256.Sum256(data)
	must(t, s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: id, ContentType: "text/plain",
		PayloadLength: uint64(len(data)), Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result-part"},
		ChunkInfo: &wire.ChunkInfo{ChunkIndex: k, ChunkOffset: off}}, bytesReader(data)))
}

// sendResultSummary sends the summary entity of a streamed result.
func sendResultSummary(t *testing.T, s *quicpeer.Session, id uint32, parts, length uint64, sum []byte) {
	t.Helper()
	must(t, s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: id, ContentType: "text/plain",
		Metadata: map[string]string{"pipestream.role": "result", "pipestream.result-parts": strconv.FormatUint(parts, 10),
			"pipestream.result-length": strconv.FormatUint(length, 10), "pipestream.result-sha256": hex.EncodeToString(sum)}},
		bytesReader(nil)))
}

// submitStreamed submits a whole document to the scripted peer and returns
// the document and the root's arrival, with PROCESSING sent.
func submitStreamed(t *testing.T, p *scripted, b *bridge.Bridge) (*gatewayv1.Document, arrival) {
	t.Helper()
	req := wholeReq()
	req.Content = []byte("streamed")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)
	return d, a
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	out := make([]byte, n)
	if _, err := rand.Read(out); err != nil {
		t.Fatal(err)
	}
	return out
}

func readResult(t *testing.T, b *bridge.Bridge, id string) []byte {
	t.Helper()
	_, _, rc, err := b.Result(context.Background(), "", id)
	must(t, err)
	defer rc.Close()
	out, err := io.ReadAll(rc)
	must(t, err)
	return out
}

// Profile 4.3.1: parts are appended in part order whatever order their
// streams arrive in; the summary's length and SHA-256 are checked against
// the parts; the document succeeds with the concatenation as its result.
func TestStreamedResultPartsReordered(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	d, a := submitStreamed(t, p, b)
	p0, p1, p2 := randomBytes(t, 100<<10), randomBytes(t, 70<<10), randomBytes(t, 3)
	whole := bytes.Join([][]byte{p0, p1, p2}, nil)
	// Part 2 and part 1 first: they wait for part 0.
	sendResultPart(t, a.s, a.h.EntityID, 2, uint64(len(p0)+len(p1)), p2)
	sendResultPart(t, a.s, a.h.EntityID, 1, uint64(len(p0)), p1)
	sendResultPart(t, a.s, a.h.EntityID, 0, 0, p0)
	sum := sha256.Sum256(whole)
	sendResultSummary(t, a.s, a.h.EntityID, 3, uint64(len(whole)), sum[:])
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool {
		return d.State != gatewayv1.State_RUNNING && d.State != gatewayv1.State_PENDING
	})
	if got.State != gatewayv1.State_SUCCEEDED || got.ResultSizeBytes != uint64(len(whole)) {
		t.Fatalf("state %s error %q result size %d, want SUCCEEDED with %d octets", got.State, got.Error, got.ResultSizeBytes, len(whole))
	}
	if r := readResult(t, b, d.Id); !bytes.Equal(r, whole) {
		t.Fatalf("result is %d octets and differs from the %d octets of the parts in part order", len(r), len(whole))
	}
}

// A summary whose SHA-256 (or length) does not match the parts fails the
// document (Section 10.2: rehydration is not committed unverified), and no
// result is served.
func TestStreamedResultSummaryMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(length uint64, sum []byte) (uint64, []byte)
	}{
		{"sha256", func(l uint64, s []byte) (uint64, []byte) { s[0] ^= 1; return l, s }},
		{"length", func(l uint64, s []byte) (uint64, []byte) { return l + 1, s }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newScriptedEnv(t, false)
			d, a := submitStreamed(t, p, b)
			part := randomBytes(t, 4096)
			sendResultPart(t, a.s, a.h.EntityID, 0, 0, part)
			sum := sha256.Sum256(part)
			l, s := tc.bad(uint64(len(part)), sum[:])
			sendResultSummary(t, a.s, a.h.EntityID, 1, l, s)
			status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
			got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_FAILED })
			if !contains(got.Error, "failed verification") {
				t.Fatalf("error %q, want a verification failure", got.Error)
			}
			if _, _, _, err := b.Result(context.Background(), "", d.Id); err == nil {
				t.Fatal("a failed document serves a result")
			}
		})
	}
}

// A part whose offset leaves a gap (or overlaps) fails the result.
func TestStreamedResultOffsetGap(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	d, a := submitStreamed(t, p, b)
	part := randomBytes(t, 1000)
	sendResultPart(t, a.s, a.h.EntityID, 0, 0, part)
	sendResultPart(t, a.s, a.h.EntityID, 1, uint64(len(part))+1, part)
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool { return d.State == gatewayv1.State_FAILED })
	if !contains(got.Error, "offset 1001") {
		t.Fatalf("error %q, want the offset gap named", got.Error)
	}
}

// A streamed result with no parts is an empty result.
func TestStreamedResultEmpty(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	d, a := submitStreamed(t, p, b)
	sum := sha256.Sum256(nil)
	sendResultSummary(t, a.s, a.h.EntityID, 0, 0, sum[:])
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool {
		return d.State != gatewayv1.State_RUNNING && d.State != gatewayv1.State_PENDING
	})
	if got.State != gatewayv1.State_SUCCEEDED || got.ResultSizeBytes != 0 {
		t.Fatalf("state %s error %q size %d, want SUCCEEDED and empty", got.State, got.Error, got.ResultSizeBytes)
	}
	if r := readResult(t, b, d.Id); len(r) != 0 {
		t.Fatalf("result has %d octets, want none", len(r))
	}
}

// A peer whose streaming had to stop sends the whole result as one stream
// (profile 4.3.1): the gateway takes that result and drops the parts.
func TestStreamedResultFallbackToOneStream(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	d, a := submitStreamed(t, p, b)
	sendResultPart(t, a.s, a.h.EntityID, 0, 0, []byte("partial "))
	whole := randomBytes(t, 80<<10)
	sendResult(t, a.s, a.h.EntityID, whole)
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool {
		return d.State != gatewayv1.State_RUNNING && d.State != gatewayv1.State_PENDING
	})
	if got.State != gatewayv1.State_SUCCEEDED || got.ResultSizeBytes != uint64(len(whole)) {
		t.Fatalf("state %s error %q size %d, want SUCCEEDED with the one-stream result (%d octets)", got.State, got.Error, got.ResultSizeBytes, len(whole))
	}
	if r := readResult(t, b, d.Id); !bytes.Equal(r, whole) {
		t.Fatalf("result is %d octets and is not the one-stream result", len(r))
	}
}

// A peer that shuts down while a streamed result part is on the wire (its
// root already COMPLETE): the lost connection is not the result's fault.
// The document runs again on the next session and succeeds there; it does
// not fail with "the streamed result failed" (a CI run caught this in
// TestManyPeersOneDiesEverythingSucceeds, where the read error and the
// session's close raced either way).
func TestStreamedResultSessionLostMidPart(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	d, a := submitStreamed(t, p, b)
	status(t, a.s, wire.StatusComplete, a.h.EntityID, 0, 0)
	part := randomBytes(t, 64<<10)
	release := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		sum := sha256.Sum256(part)
		r := io.MultiReader(bytes.NewReader(part[:len(part)/2]), blockUntil(release))
		sent <- a.s.SendEntity(context.Background(), &wire.EntityHeader{EntityID: a.h.EntityID, ContentType: "text/plain",
			PayloadLength: uint64(len(part)), Checksum: sum[:], Metadata: map[string]string{"pipestream.role": "result-part"},
			ChunkInfo: &wire.ChunkInfo{ChunkIndex: 0, ChunkOffset: 0}}, r)
	}()
	must(t, a.s.CloseWithError(0, "graceful shutdown"))
	close(release)
	if err := <-sent; err == nil {
		t.Fatal("a result part sent whole over a closed session")
	}
	// The bridge dials again; the document's next attempt arrives there.
	var again arrival
	select {
	case again = <-p.arrived:
	case <-time.After(10 * time.Second):
		got, err := b.GetDocument(context.Background(), "", d.Id, false)
		must(t, err)
		t.Fatalf("the document never ran again after the session was lost: state %s error %q", got.State, got.Error)
	}
	if again.s == a.s {
		t.Fatal("the document's next attempt arrived on the closed session")
	}
	status(t, again.s, wire.StatusProcessing, again.h.EntityID, 0, 0)
	sendResultPart(t, again.s, again.h.EntityID, 0, 0, part)
	sum := sha256.Sum256(part)
	sendResultSummary(t, again.s, again.h.EntityID, 1, uint64(len(part)), sum[:])
	status(t, again.s, wire.StatusComplete, again.h.EntityID, 0, 0)
	got := waitDoc(t, b, d.Id, func(d *gatewayv1.Document) bool {
		return d.State != gatewayv1.State_RUNNING && d.State != gatewayv1.State_PENDING
	})
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q, want SUCCEEDED on the next session", got.State, got.Error)
	}
	if r := readResult(t, b, d.Id); !bytes.Equal(r, part) {
		t.Fatalf("result is %d octets and differs from the part's %d", len(r), len(part))
	}
}

// blockUntil is a reader that returns EOF once release is closed.
type blockUntil chan struct{}

func (c blockUntil) Read([]byte) (int, error) { <-c; return 0, io.EOF }
