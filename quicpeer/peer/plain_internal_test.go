package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// orderConn is the engine's conn for plain-entity tests: it logs every
// status and result stream in the order the engine sends them ("COMPLETE
// 7", "RESULT 7").
type orderConn struct {
	statusSink
	mu      sync.Mutex
	changed chan struct{}
	events  []string
	results map[uint32]sentResult
}

func (c *orderConn) log(ev string, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, ev)
	if f != nil {
		f()
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *orderConn) SendStatus(f wire.StatusFrame) error {
	c.log(fmt.Sprintf("%s %d", f.Status, f.EntityID), nil)
	return nil
}

// SendEntity logs the result stream when it starts (its header is on the
// wire once SendEntity is called, as on a real session): the engine sends
// COMPLETE after the start of the stream, not after its end, so logging at
// the end raced with COMPLETE. The bytes are kept once read.
func (c *orderConn) SendEntity(_ context.Context, h *wire.EntityHeader, r io.Reader) error {
	c.log(fmt.Sprintf("RESULT %d", h.EntityID), nil)
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.results[h.EntityID] = sentResult{h: h, data: data}
	c.mu.Unlock()
	return nil
}

// wait blocks until ev was sent (event-driven; the deadline only bounds a
// broken engine).
func (c *orderConn) wait(t *testing.T, ev string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		ok, ch := slices.Contains(c.events, ev), c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no %q; events %v", ev, c.snapshot())
		}
	}
}

func (c *orderConn) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// of returns the events of entity id, in order.
func (c *orderConn) of(id uint32) []string {
	suffix := fmt.Sprintf(" %d", id)
	var out []string
	for _, ev := range c.snapshot() {
		if strings.HasSuffix(ev, suffix) {
			out = append(out, ev)
		}
	}
	return out
}

// newPlainRig is an engine on an orderConn with Layer 2 and streamed
// results on (a plain document must still get one result stream).
func newPlainRig(t *testing.T) (*engine, *orderConn) {
	co := &core{procs: DefaultProcessors(), yields: newYieldBook(nil), work: t.TempDir(), log: quiet, now: time.Now, pool: make(chan struct{}, 2),
		budget: semaphore.NewWeighted(1 << 20),
		lim: resolvedLimits{maxEntityBytes: 1 << 20, maxChunkBytes: 1 << 20, payloadBudget: 1 << 20, orphanDocs: 8, orphanChildren: 64, childrenPerMB: 1000,
			claimExpiry: time.Minute}}
	c := &orderConn{changed: make(chan struct{}), results: map[uint32]sentResult{}}
	g := newEngine(context.Background(), co, c, negotiation{format: wire.FormatCBOR, maxPerScope: 1000, layer2: true}, quiet)
	t.Cleanup(func() { g.close(errSessionGone) })
	return g, c
}

// plainEntityTo hands a plain entity to g and returns the abort code it
// used (0xFF: none).
func plainEntityTo(g *engine, h *wire.EntityHeader, data string) wire.ErrorCode {
	sum := sha256.Sum256([]byte(data))
	h.PayloadLength, h.Checksum = uint64(len(data)), sum[:]
	code := wire.ErrorCode(0xFF)
	g.handleEntity(h, bytes.NewReader([]byte(data)), func(c wire.ErrorCode) { code = c })
	return code
}

// plainChildTo hands plain child idx of root to g; result parts are
// accepted, which a plain document must ignore.
func plainChildTo(g *engine, root, id uint32, total, idx int, data string, md map[string]string) wire.ErrorCode {
	p := root
	cmd := map[string]string{MetaAcceptResultParts: "1"}
	for k, v := range md {
		cmd[k] = v
	}
	return plainEntityTo(g, &wire.EntityHeader{EntityID: id, ParentID: &p, ContentType: "text/plain", Metadata: cmd,
		ChunkInfo: &wire.ChunkInfo{TotalChunks: uint64(total), ChunkIndex: uint64(idx)}}, data)
}

func announceTo(g *engine, root uint32) {
	g.handleStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root})
}

func checkGenericHeader(t *testing.T, h *wire.EntityHeader, id uint32, n int) {
	t.Helper()
	want := plainResultHeader(id, h.ContentType, h.Layer, uint64(n), h.Checksum)
	if h.ContentType == "" || len(h.Checksum) != sha256.Size || fmt.Sprintf("%+v", *h) != fmt.Sprintf("%+v", *want) {
		t.Fatalf("result header %+v, want exactly entity-id %d, layer, content-type, payload-length %d, checksum", h, id, n)
	}
}

// A plain entity: PROCESSING, the result (fully sent), COMPLETE; nothing
// else.
func TestPlainOrder1to1(t *testing.T) {
	g, c := newPlainRig(t)
	if code := plainEntityTo(g, &wire.EntityHeader{EntityID: 7, ContentType: "text/plain"}, "hello"); code != 0xFF {
		t.Fatalf("stream aborted with %v", code)
	}
	if got, want := c.snapshot(), []string{"PROCESSING 7", "RESULT 7", "COMPLETE 7"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	res := c.results[7]
	checkGenericHeader(t, res.h, 7, 5)
	if string(res.data) != "hello" || res.h.ContentType != "text/plain" {
		t.Fatalf("result %q %+v", res.data, res.h)
	}
}

// Plain N:1: children PROCESSING/COMPLETE, then REHYDRATING(R), one result
// stream of R (not parts, although the children accept them), COMPLETE(R).
func TestPlainOrderNto1(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 10)
	plainChildTo(g, 10, 11, 0, 0, "one ", nil)
	plainChildTo(g, 10, 12, 0, 1, "two ", nil)
	plainChildTo(g, 10, 13, 3, 2, "three", nil)
	c.wait(t, "COMPLETE 10")
	if got, want := c.of(10), []string{"REHYDRATING 10", "RESULT 10", "COMPLETE 10"}; !slices.Equal(got, want) {
		t.Fatalf("events of the parent %v, want %v (all: %v)", got, want, c.snapshot())
	}
	for _, k := range []uint32{11, 12, 13} {
		if got := c.of(k); !slices.Equal(got, []string{"PROCESSING " + fmt.Sprint(k), "COMPLETE " + fmt.Sprint(k)}) {
			t.Fatalf("events of child %d: %v", k, got)
		}
	}
	res := c.results[10]
	checkGenericHeader(t, res.h, 10, len("one two three"))
	if string(res.data) != "one two three" {
		t.Fatalf("result %q", res.data)
	}
}

// STRICT: a failed child makes R REHYDRATING -> FAILED with no result.
func TestPlainOrderNto1Failure(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 20)
	plainChildTo(g, 20, 21, 0, 0, "ok", nil)
	plainChildTo(g, 20, 22, 2, 1, "no", map[string]string{MetaProcessor: "fault", MetaFault: FaultFail})
	c.wait(t, "FAILED 20")
	if got, want := c.of(20), []string{"REHYDRATING 20", "FAILED 20"}; !slices.Equal(got, want) {
		t.Fatalf("events of the parent %v, want %v", got, want)
	}
}

// Children that disagree on total-chunks fail R at once; the disagreeing
// child is refused (FAILED), the others finish on their own. R's document
// is forgotten when its last child is terminal.
func TestPlainTotalDisagreement(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 30)
	plainChildTo(g, 30, 31, 3, 0, "a", nil)
	if code := plainChildTo(g, 30, 32, 4, 1, "b", nil); code != wire.CodeEntityInvalid {
		t.Fatalf("disagreeing child aborted with %v, want 0x05", code)
	}
	c.wait(t, "FAILED 30")
	if got := c.of(30); !slices.Equal(got, []string{"FAILED 30"}) {
		t.Fatalf("events of the parent %v", got)
	}
	for k, want := range map[uint32][]string{31: {"PROCESSING 31", "COMPLETE 31"}, 32: {"FAILED 32"}} {
		if got := c.of(k); !slices.Equal(got, want) {
			t.Fatalf("events of child %d: %v, want %v", k, got, want)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.docs[30] != nil {
		t.Fatal("the failed parent is still kept after its last child finished")
	}
}

// While a child of a failed plain parent still runs, the parent is kept:
// the running child finishes on its own and a new child is refused (FAILED).
func TestPlainFailedParentRefusesChildren(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 35)
	done := make(chan struct{})
	go func() { // stalls until the session ends (timeout-ms default 300 s)
		defer close(done)
		plainChildTo(g, 35, 36, 3, 0, "a", map[string]string{MetaProcessor: "fault", MetaFault: FaultTimeout})
	}()
	c.wait(t, "PROCESSING 36")
	plainChildTo(g, 35, 37, 2, 1, "b", nil)
	c.wait(t, "FAILED 35")
	if code := plainChildTo(g, 35, 38, 3, 2, "c", nil); code != wire.CodeEntityInvalid {
		t.Fatalf("child after the parent failed: aborted with %v, want 0x05", code)
	}
	if got := c.of(38); !slices.Equal(got, []string{"FAILED 38"}) {
		t.Fatalf("events of the late child %v", got)
	}
	g.mu.Lock()
	kept := g.docs[35] != nil
	g.mu.Unlock()
	if !kept {
		t.Fatal("the failed parent was forgotten while a child still runs")
	}
	g.close(errSessionGone)
	<-done
}

// total-chunks may arrive on any child; a chunk-index at or above it
// fails R (the document could never be complete).
func TestPlainChunkIndexBeyondTotal(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 40)
	plainChildTo(g, 40, 41, 0, 5, "a", nil)
	plainChildTo(g, 40, 42, 2, 1, "b", nil)
	c.wait(t, "FAILED 40")
	if got := c.of(40); !slices.Equal(got, []string{"FAILED 40"}) {
		t.Fatalf("events of the parent %v", got)
	}
}

// An entity stream for a parent announced DEHYDRATING is stopped with
// 0x00 and gets no status; the parent still rehydrates from its children.
func TestPlainRootStreamIgnored(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 50)
	if code := plainEntityTo(g, &wire.EntityHeader{EntityID: 50}, "root payload"); code != wire.CodeNoError {
		t.Fatalf("root stream aborted with %v, want 0x00", code)
	}
	if got := c.of(50); len(got) != 0 {
		t.Fatalf("events of the parent %v, want none", got)
	}
	plainChildTo(g, 50, 51, 1, 0, "only", nil)
	c.wait(t, "COMPLETE 50")
	if string(c.results[50].data) != "only" {
		t.Fatalf("result %q", c.results[50].data)
	}
}

// Children whose parent is never announced are orphans: processed at once,
// dropped when the client's cursor passes the parent (not before).
func TestPlainOrphansDroppedBehindCursor(t *testing.T) {
	g, c := newPlainRig(t)
	plainChildTo(g, 60, 61, 1, 0, "x", nil)
	plainChildTo(g, 70, 71, 1, 0, "y", nil)
	if got := c.of(61); !slices.Equal(got, []string{"PROCESSING 61", "COMPLETE 61"}) {
		t.Fatalf("orphan child events %v", got)
	}
	cursor := func(v uint32) {
		g.handleStatus(wire.StatusFrame{EntityID: wire.ConnectionEntity, HasCursor: true, Cursor: v})
	}
	cursor(60) // 60 is the cursor itself: not behind it
	g.mu.Lock()
	kept := g.docs[60] != nil && g.docs[70] != nil && g.orphanDocs == 2
	g.mu.Unlock()
	if !kept {
		t.Fatal("orphan documents dropped before the cursor passed them")
	}
	cursor(65)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.docs[60] != nil || g.docs[70] == nil || g.orphanDocs != 1 || g.orphanChildren != 1 {
		t.Fatalf("after cursor 65: doc 60 kept %v, doc 70 kept %v, orphans %d/%d", g.docs[60] != nil, g.docs[70] != nil, g.orphanDocs, g.orphanChildren)
	}
}

// Children naming different processors are concatenated; children that
// agree are merged by their processor.
func TestPlainMergeProcessor(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 80)
	ts := map[string]string{MetaProcessor: "textstats"}
	plainChildTo(g, 80, 81, 0, 0, "A cat. ", ts)
	plainChildTo(g, 80, 82, 2, 1, "A dog.", ts)
	c.wait(t, "COMPLETE 80")
	want, err := TextStats{}.Process(context.Background(), &Input{Header: &wire.EntityHeader{}, Payload: []byte("A cat. A dog."), ChunkIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res := c.results[80]; !bytes.Equal(res.data, want.Data) || res.h.Layer != want.Layer {
		t.Fatalf("merged textstats %s (layer %d), want %s (layer %d)", res.data, res.h.Layer, want.Data, want.Layer)
	}
}

// R's completion policy comes from the children's headers: under LENIENT
// a failed child leaves R COMPLETE with the others' outputs.
func TestPlainPolicyFromChildren(t *testing.T) {
	g, c := newPlainRig(t)
	announceTo(g, 90)
	lenient := wire.ModeLenient
	pol := &wire.CompletionPolicy{Mode: &lenient}
	sum := func(s string) []byte { b := sha256.Sum256([]byte(s)); return b[:] }
	p := uint32(90)
	send := func(id uint32, idx, total int, data string, md map[string]string, pol *wire.CompletionPolicy) {
		h := &wire.EntityHeader{EntityID: id, ParentID: &p, Metadata: md, CompletionPolicy: pol, PayloadLength: uint64(len(data)), Checksum: sum(data),
			ChunkInfo: &wire.ChunkInfo{TotalChunks: uint64(total), ChunkIndex: uint64(idx)}}
		g.handleEntity(h, bytes.NewReader([]byte(data)), func(wire.ErrorCode) {})
	}
	send(91, 0, 0, "kept", nil, nil)
	send(92, 1, 2, "lost", map[string]string{MetaProcessor: "fault", MetaFault: FaultFail}, pol)
	c.wait(t, "COMPLETE 90")
	if got := c.of(90); !slices.Equal(got, []string{"REHYDRATING 90", "RESULT 90", "COMPLETE 90"}) {
		t.Fatalf("events of the parent %v", got)
	}
	if string(c.results[90].data) != "kept" {
		t.Fatalf("result %q, want the succeeded child's output", c.results[90].data)
	}
}
