package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// textStats is the textstats processor's JSON result (docs/profile.md: the
// peer's TextStats processor, ParsedData as application/json).
type textStats struct {
	Bytes     uint64 `json:"bytes"`
	Lines     uint64 `json:"lines"`
	Words     uint64 `json:"words"`
	Sentences uint64 `json:"sentences"`
	TopWords  []struct {
		Word  string `json:"word"`
		Count uint64 `json:"count"`
	} `json:"top_words"`
}

// TestRESTProcessorResults submits inline JSON (base64 content) and checks
// that the result bytes are exactly what each processor defines, whole and
// dehydrated.
func TestRESTProcessorResults(t *testing.T) {
	g := shared(t)
	t.Run("passthrough returns identical bytes", func(t *testing.T) { restPassthroughIdentical(t, g) })
	t.Run("textstats counts", func(t *testing.T) { restTextstatsCounts(t, g) })
	t.Run("sentences one per line", func(t *testing.T) { restSentencesPerLine(t, g) })
}

// restPassthroughIdentical: passthrough returns the input bytes, whole and dehydrated.
func restPassthroughIdentical(t *testing.T, g *gatewayProc) {
	for _, split := range []map[string]any{
		nil, // whole: under the inline threshold
		{"strategy": "SPLIT_FIXED_BYTES", "chunkBytes": 7000, "processor": "passthrough"},
	} {
		in := binaryData(100_000, 1)
		req := map[string]any{"content": b64(in), "contentType": "application/octet-stream", "displayName": "blob.bin"}
		if split != nil {
			req["split"] = split
		}
		d := submitREST(t, g, req)
		if d.GetSizeBytes() != uint64(len(in)) || d.GetChecksum() != sha256Hex(in) {
			t.Errorf("accepted document: sizeBytes %d checksum %s, want %d %s", d.GetSizeBytes(), d.GetChecksum(), len(in), sha256Hex(in))
		}
		if d.GetDisplayName() != "blob.bin" {
			t.Errorf("displayName %q, want blob.bin", d.GetDisplayName())
		}
		fin := awaitREST(t, g, d.GetId())
		if fin.GetState() != gatewayv1.State_SUCCEEDED {
			t.Fatalf("split %v: state %v (%s), want SUCCEEDED", split, fin.GetState(), fin.GetError())
		}
		if split != nil && fin.GetEntityCounts().GetTotal() != 1+15 {
			t.Errorf("split %v: entityCounts.total %d, want 16 (root + 15 chunks of 7000)", split, fin.GetEntityCounts().GetTotal())
		}
		out := resultREST(t, g, d.GetId()).body
		if !bytes.Equal(out, in) {
			t.Errorf("split %v: result is %d bytes (sha256 %s), want the %d input bytes (sha256 %s)", split, len(out), sha256Hex(out), len(in), sha256Hex(in))
		}
		if fin.GetResultSizeBytes() != uint64(len(in)) {
			t.Errorf("resultSizeBytes %d, want %d", fin.GetResultSizeBytes(), len(in))
		}
	}
}

// restTextstatsCounts: textstats returns the documented JSON counts, whole
// and dehydrated (lines, fixed bytes).
func restTextstatsCounts(t *testing.T, g *gatewayProc) {
	small := []byte("The cat sat. The dog ran!\nA bird?\n")
	corpus := textCorpus(64 << 10)
	n := uint64(bytes.Count(corpus, []byte{'\n'}))
	cases := []struct {
		name  string
		in    []byte
		split map[string]any
		want  textStats
		top   string
		topN  uint64
	}{
		{"whole", small, map[string]any{"processor": "textstats"}, textStats{Bytes: uint64(len(small)), Lines: 2, Words: 8, Sentences: 3}, "the", 2},
		{"lines", corpus, map[string]any{"strategy": "SPLIT_LINES", "chunkBytes": 4096, "processor": "textstats"},
			textStats{Bytes: uint64(len(corpus)), Lines: n, Words: 11 * n, Sentences: 2 * n}, "the", 2 * n},
		// Fixed-size chunks cut words and sentences; the peer's
		// rehydration must correct for that.
		{"fixed bytes", corpus, map[string]any{"strategy": "SPLIT_FIXED_BYTES", "chunkBytes": 1000, "processor": "textstats"},
			textStats{Bytes: uint64(len(corpus)), Lines: n, Words: 11 * n, Sentences: 2 * n}, "the", 2 * n},
	}
	for _, c := range cases {
		d := submitREST(t, g, map[string]any{"content": b64(c.in), "contentType": "text/plain", "split": c.split})
		fin := awaitREST(t, g, d.GetId())
		if fin.GetState() != gatewayv1.State_SUCCEEDED {
			t.Fatalf("%s: state %v (%s), want SUCCEEDED", c.name, fin.GetState(), fin.GetError())
		}
		r := resultREST(t, g, d.GetId())
		if !strings.Contains(r.headers, "application/json") {
			t.Errorf("%s: result Content-Type is not application/json:\n%s", c.name, r.headers)
		}
		var got textStats
		dec := json.NewDecoder(bytes.NewReader(r.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s: textstats result is not the documented JSON: %v\n%s", c.name, err, r.body)
		}
		if got.Bytes != c.want.Bytes || got.Lines != c.want.Lines || got.Words != c.want.Words || got.Sentences != c.want.Sentences {
			t.Errorf("%s: got bytes=%d lines=%d words=%d sentences=%d, want %d %d %d %d", c.name,
				got.Bytes, got.Lines, got.Words, got.Sentences, c.want.Bytes, c.want.Lines, c.want.Words, c.want.Sentences)
		}
		if len(got.TopWords) == 0 || got.TopWords[0].Word != c.top || got.TopWords[0].Count != c.topN {
			t.Errorf("%s: top_words %+v, want first {%s %d}", c.name, got.TopWords, c.top, c.topN)
		}
	}
}

// restSentencesPerLine: sentences returns one sentence per line, whole and
// at Layer 1 (verified digests).
func restSentencesPerLine(t *testing.T, g *gatewayProc) {
	in := "Hello world. This is PipeStream!  Is it?\n\nNew paragraph\nwithout an end"
	want := "Hello world.\nThis is PipeStream!\nIs it?\nNew paragraph without an end\n"
	for _, split := range []map[string]any{
		{"processor": "sentences"},
		{"processor": "sentences", "maxDepth": 2}, // Layer 1: one sub-entity per sentence
	} {
		d := submitREST(t, g, map[string]any{"content": b64([]byte(in)), "contentType": "text/plain", "split": split})
		fin := awaitREST(t, g, d.GetId())
		if fin.GetState() != gatewayv1.State_SUCCEEDED {
			t.Fatalf("%v: state %v (%s), want SUCCEEDED", split, fin.GetState(), fin.GetError())
		}
		if got := string(resultREST(t, g, d.GetId()).body); got != want {
			t.Errorf("%v: result %q, want %q", split, got, want)
		}
		for _, dg := range fin.GetDigests() {
			if !dg.GetVerified() {
				t.Errorf("%v: scope digest %d not verified: %v", split, dg.GetScopeId(), dg)
			}
		}
	}
}

// TestRESTLargeUpload streams 64 MiB with curl --data-binary @file into
// POST /v1/documents:upload, follows it with curl -N on the NDJSON watch
// stream and downloads the identical bytes.
func TestRESTLargeUpload(t *testing.T) {
	g := shared(t)
	const size = 64 << 20
	in := binaryData(size, 64)
	path := writeTemp(t, "large.bin", in)
	u := g.baseURL() + "/v1/documents:upload?split.strategy=SPLIT_FIXED_BYTES&split.chunkBytes=4194304&displayName=large.bin&requestId=" + uniq("large")
	r := curl(t, "POST", u, nil, "--data-binary", "@"+path, "-H", "Content-Type: application/octet-stream")
	d := docOf(t, "POST "+u, r)
	if d.GetSizeBytes() != size || d.GetChecksum() != sha256Hex(in) {
		t.Fatalf("upload accepted as %d bytes sha256 %s, want %d %s", d.GetSizeBytes(), d.GetChecksum(), size, sha256Hex(in))
	}
	if d.GetContentType() != "application/octet-stream" {
		t.Errorf("contentType %q, want the request's Content-Type", d.GetContentType())
	}

	ups := watchREST(t, g, d.GetId())
	checkWatch(t, d.GetId(), ups)
	last := ups[len(ups)-1].GetDocument()
	if last.GetState() != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %v (%s), want SUCCEEDED", last.GetState(), last.GetError())
	}
	if got := last.GetEntityCounts().GetTotal(); got != 1+16 {
		t.Errorf("entityCounts.total %d, want 17 (root + 16 chunks of 4 MiB)", got)
	}

	out := resultREST(t, g, d.GetId()).body
	if len(out) != size || !bytes.Equal(out, in) {
		t.Fatalf("result: %d bytes sha256 %s, want %d bytes sha256 %s", len(out), sha256Hex(out), size, sha256Hex(in))
	}
}

// checkWatch checks a watch stream: every update is about id, event seqs
// strictly increase, revisions chain (since = previous rev), and the stream
// ends at a terminal state.
func checkWatch(t testing.TB, id string, ups []*gatewayv1.WatchDocumentResponse) {
	t.Helper()
	var lastSeq, lastRev uint64
	for i, u := range ups {
		if u.GetDocument().GetId() != id {
			t.Errorf("update %d is about document %q, want %q", i, u.GetDocument().GetId(), id)
		}
		ev := u.GetEvent()
		if ev == nil {
			if i != 0 {
				t.Errorf("update %d has no event (only the first, the current state, may omit it)", i)
			}
			lastRev = u.GetDocument().GetRev()
			continue
		}
		if ev.GetSeq() <= lastSeq {
			t.Errorf("update %d: event seq %d after %d, want strictly increasing", i, ev.GetSeq(), lastSeq)
		}
		if ev.GetDocumentId() != id {
			t.Errorf("update %d: event.documentId %q, want %q", i, ev.GetDocumentId(), id)
		}
		if lastRev != 0 && ev.GetSince() != lastRev && ev.GetRev() > lastRev {
			t.Errorf("update %d: event since=%d rev=%d after rev %d: a gap", i, ev.GetSince(), ev.GetRev(), lastRev)
		}
		lastSeq = ev.GetSeq()
		if ev.GetRev() > lastRev {
			lastRev = ev.GetRev()
		}
	}
	if st := ups[len(ups)-1].GetDocument().GetState(); !terminal(st) {
		t.Errorf("watch stream ended at %v, want a terminal state", st)
	}
}

// TestEmbeddedPeerTransports: the embedded peer gives the same results
// over both transports --embedded-peer-transport takes: in process (the
// default; quicpeer/inproc.go) and QUIC on a loopback port. Whole and
// dehydrated documents, each checked byte for byte.
func TestEmbeddedPeerTransports(t *testing.T) {
	for _, tc := range []struct{ transport, addr string }{
		{"inproc", "addr=inproc:"},
		{"quic", "addr=127.0.0.1:"},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			var g *gatewayProc
			if tc.transport == "inproc" {
				g = shared(t) // default flags
			} else {
				g = startGateway(t, gwOpts{args: []string{"--embedded-peer-transport", tc.transport}})
			}
			if !g.proc.logContains(tc.addr) || !g.proc.logContains("transport="+tc.transport) {
				t.Fatalf("the gateway's log does not show its embedded peer at %q over %s", tc.addr, tc.transport)
			}
			restPassthroughIdentical(t, g)
		})
	}
}

var uploadSeed = flag.Uint64("upload.seed", 0, "TestRESTUploadsConcurrentExact: seed of the sizes and contents (0: from the clock)")

// TestRESTUploadsConcurrentExact: raw-body uploads run in the gateway's
// process and reuse their chunk buffers (gateway/localupload.go); many at
// once, of seeded sizes around the 256 KiB chunk's edges, each document
// must be accepted with exactly its bytes (size and SHA-256) and its
// passthrough result must be those bytes. A buffer handed to the next
// read while the bridge still held it would mix documents' bytes.
func TestRESTUploadsConcurrentExact(t *testing.T) {
	g := shared(t)
	seed := *uploadSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: -args -upload.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 1))
	const chunk = 256 << 10
	edges := []int{1, chunk - 1, chunk, chunk + 1, 3 * chunk, 3*chunk + 7}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 { // --max-uploads-per-tenant's default
		n := edges[r.IntN(len(edges))] + r.IntN(2)*r.IntN(chunk)
		in := binaryData(n, seed+uint64(i))
		wg.Go(func() { errs <- uploadExact(g, in) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
}

// uploadExact uploads in through POST /v1/documents:upload, split into
// passthrough chunks, and checks the accepted document, its end and its
// result. It returns its finding (it runs on goroutines the test started).
func uploadExact(g *gatewayProc, in []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := "?contentType=application/octet-stream&split.strategy=SPLIT_FIXED_BYTES&split.chunkBytes=100000&split.processor=passthrough"
	code, body, err := doJSON(ctx, "POST", g.baseURL()+"/v1/documents:upload"+q, in, "application/octet-stream")
	if err != nil || code != 200 {
		return fmt.Errorf("upload of %d bytes: HTTP %d %.300s %v", len(in), code, body, err)
	}
	var d struct {
		ID        string `json:"id"`
		SizeBytes string `json:"sizeBytes"`
		Checksum  string `json:"checksum"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		return err
	}
	if d.SizeBytes != strconv.Itoa(len(in)) || d.Checksum != sha256Hex(in) {
		return fmt.Errorf("accepted %s: sizeBytes %q checksum %s, want %d %s", d.ID, d.SizeBytes, d.Checksum, len(in), sha256Hex(in))
	}
	if err := watchEndsSucceeded(ctx, g, d.ID); err != nil {
		return fmt.Errorf("document of %d bytes: %w", len(in), err)
	}
	code, out, err := doJSON(ctx, "GET", g.baseURL()+"/v1/documents/"+d.ID+"/result", nil, "")
	if err != nil || code != 200 {
		return fmt.Errorf("result %s: HTTP %d %v", d.ID, code, err)
	}
	if !bytes.Equal(out, in) {
		return fmt.Errorf("result of %s: %d bytes sha256 %s, want the %d input bytes sha256 %s", d.ID, len(out), sha256Hex(out), len(in), sha256Hex(in))
	}
	return nil
}

// watchEndsSucceeded reads GET /v1/documents/{id}:watch (NDJSON, ending
// at the document's end) and checks that its last update is SUCCEEDED.
func watchEndsSucceeded(ctx context.Context, g *gatewayProc, id string) error {
	code, body, err := doJSON(ctx, "GET", g.baseURL()+"/v1/documents/"+id+":watch", nil, "")
	if err != nil || code != 200 {
		return fmt.Errorf("watch %s: HTTP %d %.300s %v", id, code, body, err)
	}
	lines := scanLines(body)
	if len(lines) == 0 {
		return fmt.Errorf("watch %s: empty stream", id)
	}
	var last struct {
		Result struct {
			Document struct{ State, Error string }
		}
		Error json.RawMessage
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Error != nil {
		return fmt.Errorf("watch %s: last line %.300s (%v)", id, lines[len(lines)-1], err)
	}
	if st := last.Result.Document; st.State != "SUCCEEDED" {
		return fmt.Errorf("%s ended %s (%s), want SUCCEEDED", id, st.State, st.Error)
	}
	return nil
}
