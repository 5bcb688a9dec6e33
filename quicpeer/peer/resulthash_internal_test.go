package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// resultConn is the engine's conn for result-hash tests: it records each
// result stream and, at the moment it is sent, whether the document's
// output frontier had covered every chunk (the result hash was kept while
// the children finished, not computed by a pass over the spool).
type resultConn struct {
	statusSink
	mu      sync.Mutex
	results map[uint32]sentResult
	parts   map[uint32][]sentResult // result parts (profile 4.3.1) by root
	doc     func(id uint32) *doc
}

type sentResult struct {
	h        *wire.EntityHeader
	data     []byte
	frontier bool // output frontier complete and intact when sent
	parts    int  // a streamed result's summary: parts received before it
}

func (c *resultConn) SendEntity(_ context.Context, h *wire.EntityHeader, r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if h.Metadata[MetaRole] == roleResultPart { // sent with d.omu held
		c.mu.Lock()
		c.parts[h.EntityID] = append(c.parts[h.EntityID], sentResult{h: h, data: data})
		c.mu.Unlock()
		return nil
	}
	res := sentResult{h: h, data: data}
	if d := c.doc(h.EntityID); d != nil {
		d.omu.Lock()
		res.frontier = d.out.broken == nil && d.out.next == uint64(d.total)
		d.omu.Unlock()
	}
	c.mu.Lock()
	c.results[h.EntityID] = res
	c.mu.Unlock()
	return nil
}

// mixed is a Concatenator whose odd chunks are transformed (a copy) and
// even chunks passed through (aliasing the input).
type mixed struct{}

func (mixed) Process(_ context.Context, in *Input) (*Output, error) {
	if in.ChunkIndex%2 == 0 {
		return &Output{Data: in.Payload}, nil
	}
	return &Output{Data: bytes.ToUpper(in.Payload)}, nil
}
func (mixed) Rehydrate(context.Context, []*Output) (*Output, error) { panic("streamed") }
func (mixed) ConcatType(*Output) (string, uint8)                    { return "text/plain", 0 }

type hashRig struct {
	g      *engine
	accept bool // children say they take streamed results
	conn   *resultConn
	docs   map[uint32]*doc
	mu     sync.Mutex
}

func newHashRig(t *testing.T) *hashRig { return newHashRigStream(t, false) }

// newHashRigStream is newHashRig with streamed results off (stream false:
// one result stream, profile 4.3) or on (4.3.1).
func newHashRigStream(t *testing.T, stream bool) *hashRig {
	procs := DefaultProcessors()
	procs["mixed"] = mixed{}
	co := &core{procs: procs, yields: newYieldBook(nil), work: t.TempDir(), log: quiet, now: time.Now, pool: make(chan struct{}, 2),
		budget: semaphore.NewWeighted(1 << 20),
		lim: resolvedLimits{maxEntityBytes: 1 << 20, maxChunkBytes: 1 << 20, payloadBudget: 1 << 20, orphanDocs: 8, orphanChildren: 64, childrenPerMB: 1000,
			claimExpiry: time.Minute, noStreamResults: !stream}}
	r := &hashRig{docs: map[uint32]*doc{}, accept: stream}
	r.conn = &resultConn{results: map[uint32]sentResult{}, parts: map[uint32][]sentResult{}, doc: func(id uint32) *doc {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.docs[id]
	}}
	r.g = newEngine(context.Background(), co, r.conn, negotiation{format: wire.FormatCBOR, maxPerScope: 1000, layer2: true}, quiet)
	t.Cleanup(func() { r.g.close(errSessionGone) })
	return r
}

// child sends chunk idx of root as entity id through the engine.
func (r *hashRig) child(root, id uint32, idx, total int, data string, md map[string]string) {
	p := root
	sum := sha256.Sum256([]byte(data))
	cmd := map[string]string{MetaProfile: ProfileVersion}
	if r.accept {
		cmd[MetaAcceptResultParts] = "1"
	}
	for k, v := range md {
		cmd[k] = v
	}
	md = cmd
	h := &wire.EntityHeader{EntityID: id, ParentID: &p, PayloadLength: uint64(len(data)), Checksum: sum[:], Metadata: md,
		ChunkInfo: &wire.ChunkInfo{TotalChunks: uint64(total), ChunkIndex: uint64(idx)}}
	r.g.handleEntity(h, bytes.NewReader([]byte(data)), func(wire.ErrorCode) {})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.docs[root] == nil {
		r.g.mu.Lock()
		r.docs[root] = r.g.docs[root]
		r.g.mu.Unlock()
	}
}

// root sends STATUS(DEHYDRATING) and the root envelope; content is the
// concatenation of the children's inputs.
func (r *hashRig) root(t *testing.T, root uint32, total int, content string, md map[string]string, pol *wire.CompletionPolicy) {
	env, err := wire.CodecFor(wire.FormatCBOR).MarshalPipeDoc(&wire.PipeDoc{DocID: "d", EntityID: root})
	if err != nil {
		t.Fatal(err)
	}
	rmd := map[string]string{MetaProfile: ProfileVersion, MetaTotalChunks: strconv.Itoa(total), MetaContentLength: strconv.Itoa(len(content)),
		MetaContentSHA256: hex.EncodeToString(sha256Of(content))}
	for k, v := range md {
		rmd[k] = v
	}
	r.g.handleStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root})
	sum := sha256.Sum256(env)
	h := &wire.EntityHeader{EntityID: root, Metadata: rmd, PayloadLength: uint64(len(env)), Checksum: sum[:], CompletionPolicy: pol}
	r.g.handleEntity(h, bytes.NewReader(env), func(wire.ErrorCode) {})
}

func sha256Of(s string) []byte { b := sha256.Sum256([]byte(s)); return b[:] }

// streamedResult checks a streamed result (profile 4.3.1): parts numbered
// 0, 1, ... in order with contiguous offsets, each part's length and
// checksum right, and the summary's part count, length and SHA-256 those
// of the concatenation, which it returns as the result's data.
func streamedResult(t *testing.T, sum sentResult, parts []sentResult) sentResult {
	t.Helper()
	var all []byte
	for i, p := range parts {
		ci := p.h.ChunkInfo
		if ci == nil || ci.ChunkIndex != uint64(i) || ci.ChunkOffset != uint64(len(all)) {
			t.Fatalf("part %d has chunk-info %+v, want index %d offset %d", i, ci, i, len(all))
		}
		if p.h.PayloadLength != uint64(len(p.data)) || !bytes.Equal(p.h.Checksum, sha256Of(string(p.data))) {
			t.Fatalf("part %d header says %d octets %x, it carried %d octets %x", i, p.h.PayloadLength, p.h.Checksum, len(p.data), sha256Of(string(p.data)))
		}
		all = append(all, p.data...)
	}
	md := sum.h.Metadata
	if sum.h.PayloadLength != 0 || len(sum.data) != 0 || md[MetaRole] != "result" || md[MetaResultParts] != strconv.Itoa(len(parts)) ||
		md[MetaResultLength] != strconv.Itoa(len(all)) || md[MetaResultSHA256] != hex.EncodeToString(sha256Of(string(all))) {
		t.Fatalf("summary %d payload octets, metadata %v; the %d parts hold %d octets %x", len(sum.data), md, len(parts), len(all), sha256Of(string(all)))
	}
	sum.data, sum.parts = all, len(parts)
	return sum
}

// result waits for the result of root and checks its header against the
// bytes sent.
func (r *hashRig) result(t *testing.T, root uint32) sentResult {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.conn.mu.Lock()
		res, ok := r.conn.results[root]
		parts := r.conn.parts[root]
		r.conn.mu.Unlock()
		if ok && res.h.Metadata[MetaResultParts] != "" {
			return streamedResult(t, res, parts)
		}
		if ok {
			if res.h.PayloadLength != uint64(len(res.data)) || !bytes.Equal(res.h.Checksum, sha256Of(string(res.data))) {
				t.Fatalf("result header says %d octets %x, the stream carried %d octets %x", res.h.PayloadLength, res.h.Checksum, len(res.data), sha256Of(string(res.data)))
			}
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("no result for %d", root)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The result's payload-length and SHA-256 are kept while the children
// finish, in chunk order, whatever order they finish in, through
// passthrough streaks, transformed chunks and chunks a LENIENT policy
// leaves out (profile 4.3).
func TestResultHashKeptInChunkOrder(t *testing.T) {
	chunks := []string{"alpha ", "bravo ", "charlie ", "delta ", "echo"}
	lenient := wire.ModeLenient
	for _, tc := range []struct {
		name  string
		order []int
		md    map[string]string
		pol   *wire.CompletionPolicy
		want  string
	}{
		{"passthrough in order", []int{0, 1, 2, 3, 4}, nil, nil, "alpha bravo charlie delta echo"},
		{"passthrough reversed", []int{4, 3, 2, 1, 0}, nil, nil, "alpha bravo charlie delta echo"},
		{"transformed odd chunks", []int{0, 1, 3, 2, 4}, map[string]string{MetaProcessor: "mixed"}, nil, "alpha BRAVO charlie DELTA echo"},
		{"lenient skips a failed chunk", []int{0, 1, 2, 4, 3}, map[string]string{MetaProcessor: "fault", MetaFault: "fail", MetaFaultChunks: "2"},
			&wire.CompletionPolicy{Mode: &lenient}, "alpha bravo delta echo"},
		{"lenient skips the first chunk", []int{1, 2, 0, 3, 4}, map[string]string{MetaProcessor: "fault", MetaFault: "fail", MetaFaultChunks: "0"},
			&wire.CompletionPolicy{Mode: &lenient}, "bravo charlie delta echo"},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: "", true: "/streamed"}[stream], func(t *testing.T) {
				hashKeptCase(t, stream, chunks, tc.order, tc.md, tc.pol, tc.want)
			})
		}
	}
}

func hashKeptCase(t *testing.T, stream bool, chunks []string, order []int, md map[string]string, pol *wire.CompletionPolicy, want string) {
	tc := struct {
		order []int
		md    map[string]string
		pol   *wire.CompletionPolicy
		want  string
	}{order, md, pol, want}
	{
		{
			r := newHashRigStream(t, stream)
			const root = 100
			if tc.pol != nil { // the policy governs children that finish before the root arrives
				r.mu.Lock()
				r.g.mu.Lock()
				d := r.g.docFor(root)
				r.g.mu.Unlock()
				r.docs[root] = d
				r.mu.Unlock()
				r.root(t, root, len(chunks), concat(chunks), tc.md, tc.pol)
			}
			for _, i := range tc.order {
				r.child(root, uint32(101+i), i, len(chunks), chunks[i], tc.md)
			}
			r.conn.mu.Lock()
			early := len(r.conn.parts[root])
			r.conn.mu.Unlock()
			if tc.pol == nil {
				r.root(t, root, len(chunks), concat(chunks), tc.md, tc.pol)
				// Every child finished before the root arrived: streamed,
				// the whole result went out before it (profile 4.3.1).
				if want := map[bool]int{false: 0, true: len(chunks)}[stream]; early != want {
					t.Fatalf("%d result parts sent before the root arrived, want %d", early, want)
				}
			}
			res := r.result(t, root)
			if string(res.data) != tc.want {
				t.Fatalf("result %q, want %q", res.data, tc.want)
			}
			if !res.frontier {
				t.Fatal("the result hash was not kept while the children finished: rehydration hashed the spool")
			}
			if stream && res.parts == 0 {
				t.Fatal("streamed results on, but the result went as one stream")
			}
		}
	}
}

// A child output spooled again after its chunk was resolved (a late or
// repeated processing) changes neither the result nor its checksum: spool
// regions are never rewritten and the first resolution is final.
func TestReprocessedChildCannotCorruptResult(t *testing.T) {
	r := newHashRig(t)
	const root = 200
	chunks := []string{"one ", "two ", "three"}
	for i := range chunks {
		r.child(root, uint32(201+i), i, len(chunks), chunks[i], nil)
	}
	r.g.mu.Lock()
	e := r.g.docs[root].children[1].e
	r.g.mu.Unlock()
	r.g.finishChild(e, result{kind: resultSucceeded, out: &Output{Data: []byte("EVIL EVIL EVIL")}})
	r.root(t, root, len(chunks), concat(chunks), nil, nil)
	res := r.result(t, root)
	if string(res.data) != "one two three" || !res.frontier {
		t.Fatalf("result %q (frontier %v), want %q", res.data, res.frontier, "one two three")
	}
}

func concat(s []string) string {
	var b bytes.Buffer
	for _, x := range s {
		b.WriteString(x)
	}
	return b.String()
}

// A gateway that does not say it takes streamed results (no
// pipestream.accept-result-parts on its children, as before profile
// 4.3.1) gets the result as one stream, even with streaming on.
func TestNoResultPartsWithoutAcceptance(t *testing.T) {
	r := newHashRigStream(t, true)
	r.accept = false
	const root = 300
	chunks := []string{"one ", "two ", "three"}
	for i := range chunks {
		r.child(root, uint32(301+i), i, len(chunks), chunks[i], nil)
	}
	r.root(t, root, len(chunks), concat(chunks), nil, nil)
	res := r.result(t, root)
	r.conn.mu.Lock()
	parts := len(r.conn.parts[root])
	r.conn.mu.Unlock()
	if string(res.data) != "one two three" || res.parts != 0 || parts != 0 {
		t.Fatalf("result %q, %d parts streamed (summary counts %d), want one stream and no parts", res.data, parts, res.parts)
	}
}
