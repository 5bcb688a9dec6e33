package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Interoperability (issue 10): the real `gateway` binary against partners
// written from the drafts' text (interop_partner_*_test.go), not from the
// project's quicpeer package.
//
//   - a plain draft-02 client against `gateway peer`;
//   - `gateway serve --peer` at a plain draft-02 peer that returns results
//     as new entities, at one that returns none, at one that stalls, at a
//     closed port and at one that refuses every session;
//   - the reference suite's draft-04 client conversation against `gateway
//     peer`, and `gateway serve` against the draft-04 reference server
//     conversation (--peer-framing draft-04 and auto).

// startInteropGateway starts `gateway serve` with args and waits until
// its HTTP port answers (any status: /healthz may be 503 while the peer
// is absent, which some of these tests want).
func startInteropGateway(t *testing.T, args ...string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{grpcAddr: freeTCPAddr(t), httpAddr: freeTCPAddr(t), dataDir: t.TempDir(), args: args}
	full := append([]string{"serve", "--grpc-addr", g.grpcAddr, "--http-addr", g.httpAddr, "--data-dir", g.dataDir, "--shutdown-timeout", "5s"}, args...)
	g.proc = startProc(t, "gateway", t.TempDir(), full...)
	t.Cleanup(g.proc.stop)
	attachLog(t, g.proc)
	waitFor(t, "the gateway's HTTP port", startTimeout, func() bool {
		if g.proc.exited() {
			t.Fatalf("gateway %v exited: %v\n%s", full, g.proc.waitErr, g.proc.tail(logTailLines))
		}
		st, _, err := doJSON(context.Background(), "GET", g.baseURL()+"/healthz", nil, "")
		return err == nil && st != 0
	})
	return g
}

// docMap is a Document as plain JSON (fields this test suite predates,
// such as resultAbsent and waitReason, are read by name).
type docMap map[string]any

func (d docMap) str(k string) string {
	s, _ := d[k].(string)
	return s
}

func (d docMap) String() string {
	b, _ := json.Marshal(d)
	return truncate(string(b), 1500)
}

func getDocMap(t *testing.T, g *gatewayProc, id string) docMap {
	t.Helper()
	st, b, err := doJSON(context.Background(), "GET", g.baseURL()+"/v1/documents/"+id, nil, "")
	var d docMap
	if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("GET document %s: %d %v %.500s", id, st, err, b)
	}
	return d
}

// pollDoc polls the document until pred holds (or fails t after within).
func pollDoc(t *testing.T, g *gatewayProc, id string, within time.Duration, what string, pred func(docMap) bool) docMap {
	t.Helper()
	var d docMap
	deadline := time.Now().Add(within)
	for {
		d = getDocMap(t, g, id)
		if pred(d) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("document %s: not %s within %v: %v", id, what, within, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func awaitTerminalDoc(t *testing.T, g *gatewayProc, id string, within time.Duration) docMap {
	t.Helper()
	return pollDoc(t, g, id, within, "terminal", func(d docMap) bool { return terminalState(d.str("state")) })
}

// submitDoc posts a JSON submission and returns the document id.
func submitDoc(t *testing.T, g *gatewayProc, req map[string]any) string {
	t.Helper()
	st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents", mustJSON(t, req), "application/json")
	var d docMap
	if err != nil || st != 200 || json.Unmarshal(b, &d) != nil || d.str("id") == "" {
		t.Fatalf("submit: %d %v %.500s", st, err, b)
	}
	return d.str("id")
}

// uploadDoc uploads body raw with the query options and returns the id.
func uploadDoc(t *testing.T, g *gatewayProc, query string, body []byte) string {
	t.Helper()
	st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents:upload?"+query, body, "text/plain")
	var d docMap
	if err != nil || st != 200 || json.Unmarshal(b, &d) != nil || d.str("id") == "" {
		t.Fatalf("upload: %d %v %.500s", st, err, b)
	}
	return d.str("id")
}

func wantSucceededWith(t *testing.T, g *gatewayProc, id string, want []byte, within time.Duration) {
	t.Helper()
	if d := awaitTerminalDoc(t, g, id, within); d.str("state") != "SUCCEEDED" {
		t.Fatalf("document %s: %s, want SUCCEEDED: %v", id, d.str("state"), d)
	}
	wantResult(t, g, id, want)
}

// ---- 1. plain draft-02 client -> gateway peer ----

// TestInteropPlainClient: a plain draft-02 client (raw payload, SHA-256,
// no profile metadata) against `gateway peer`: 1 KiB, 8 MiB and 200
// concurrent round trips (passthrough: the result is the input), the
// textstats processor named in metadata, and a DEHYDRATING parent with
// three chunk children rehydrated into one result of the parent's id.
func TestInteropPlainClient(t *testing.T) {
	t.Parallel()
	addr, cert, _ := startPeer(t)
	c, err := dialD02Client(ctxT(t, 30*time.Second), addr, cert)
	if err != nil {
		t.Fatalf("plain draft-02 client: connect/CAPABILITIES: %v", err)
	}
	defer c.close()
	// Each case waits on events with its own deadline.
	t.Run("1KiB", func(t *testing.T) { plainRoundTrip(ctxT(t, 30*time.Second), t, c, binaryData(1<<10, 101)) })
	t.Run("8MiB", func(t *testing.T) { plainRoundTrip(ctxT(t, time.Minute), t, c, binaryData(8<<20, 102)) })
	t.Run("200concurrent", func(t *testing.T) { plainConcurrent(ctxT(t, time.Minute), t, c, 200) })
	t.Run("textstats", func(t *testing.T) { plainTextstats(ctxT(t, 30*time.Second), t, c) })
	t.Run("dehydrated", func(t *testing.T) { plainDehydrated(ctxT(t, 30*time.Second), t, c) })
	if errs := c.protocolErrors(); len(errs) > 0 {
		t.Errorf("protocol errors seen by the plain client: %v", errs)
	}
	t.Run("result read after COMPLETE", func(t *testing.T) { plainLazyReader(t, addr, cert) })
	t.Run("peer --framing draft-02", func(t *testing.T) {
		addr, cert, _ := startPeer(t, "--framing", "draft-02")
		c, err := dialD02Client(ctxT(t, 30*time.Second), addr, cert)
		if err != nil {
			t.Fatalf("plain draft-02 client: connect/CAPABILITIES: %v", err)
		}
		defer c.close()
		plainRoundTrip(ctxT(t, 30*time.Second), t, c, textCorpus(1<<10))
		plainDehydrated(ctxT(t, 30*time.Second), t, c)
	})
}

// checkPlainResult checks the generic result form: entity-id = the input's
// id, layer 0 (or one of layers: textstats' JSON is ParsedData, draft-02
// data layer 2), content-type, payload-length, checksum, no metadata.
func checkPlainResult(id uint32, res gotEntity, layers ...uint8) error {
	h := res.hdr
	var probs []string
	if h.EntityID != id {
		probs = append(probs, fmt.Sprintf("entity-id %d, want %d", h.EntityID, id))
	}
	if len(layers) == 0 {
		layers = []uint8{0}
	}
	if !bytes.Contains(layers, []byte{h.Layer}) || h.ContentType == "" || len(h.Checksum) != 32 {
		probs = append(probs, fmt.Sprintf("layer %d, content-type %q, checksum %d octets", h.Layer, h.ContentType, len(h.Checksum)))
	}
	if contains(res.keys, "metadata") {
		probs = append(probs, fmt.Sprintf("metadata %v", h.Metadata))
	}
	if len(probs) > 0 {
		return fmt.Errorf("result of %d: %s (header keys %v)", id, strings.Join(probs, "; "), res.keys)
	}
	return nil
}

func wantStatusSeq(got []uint8, want ...uint8) error {
	if !bytes.Equal(got, want) {
		return fmt.Errorf("statuses %v, want %v", namesOf(got), namesOf(want))
	}
	return nil
}

func plainRoundTrip(ctx context.Context, t *testing.T, c *d02Client, in []byte) {
	id, res, err := c.roundTrip(ctx, in, "application/octet-stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPlainResult(id, res); err != nil {
		t.Error(err)
	}
	if !bytes.Equal(res.payload, in) {
		t.Errorf("passthrough result of %d: %d octets sha256 %s, want %d octets sha256 %s", id, len(res.payload), sha256Hex(res.payload), len(in), sha256Hex(in))
	}
	if err := wantStatusSeq(c.statusesOf(id), stProcessing, stComplete); err != nil {
		t.Errorf("entity %d: %v", id, err)
	}
}

// plainLazyReader: a plain client that accepts the server's entity
// streams only after it saw COMPLETE (with quinn's windows an unread
// stream stops at 1.25 MB) still gets COMPLETE for 8 MiB, then the result.
func plainLazyReader(t *testing.T, addr, cert string) {
	ctx := ctxT(t, 30*time.Second)
	c, err := dialD02ClientOpts(ctx, addr, cert, true)
	if err != nil {
		t.Fatalf("plain draft-02 client: connect/CAPABILITIES: %v", err)
	}
	defer c.close()
	in := binaryData(8<<20, 103)
	id := c.newID()
	if err := c.sendEntity(ctx, entityHeader{EntityID: id, ContentType: "application/octet-stream"}, in); err != nil {
		t.Fatal(err)
	}
	if err := c.wait(ctx, fmt.Sprintf("entity %d terminal before its result is read", id), func() bool { return c.terminalLocked(id) }); err != nil {
		t.Fatalf("%v (a result that must be read before COMPLETE deadlocks a client that reads after COMPLETE)", err)
	}
	c.startAccepting()
	res, err := c.awaitResult(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPlainResult(id, res); err != nil || !bytes.Equal(res.payload, in) {
		t.Errorf("result read after COMPLETE: %v, %d octets (want the %d input octets)", err, len(res.payload), len(in))
	}
}

func plainConcurrent(ctx context.Context, t *testing.T, c *d02Client, n int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := binaryData(1024+i*16, uint64(1000+i))
			id, res, err := c.roundTrip(ctx, in, "application/octet-stream", nil)
			if err == nil {
				err = checkPlainResult(id, res)
			}
			if err == nil && !bytes.Equal(res.payload, in) {
				err = fmt.Errorf("entity %d: result differs from the input", id)
			}
			if err != nil {
				mu.Lock()
				failed = append(failed, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d of %d concurrent entities failed; first: %s", len(failed), n, failed[0])
	}
}

func plainTextstats(ctx context.Context, t *testing.T, c *d02Client) {
	in := textCorpus(20 << 10)
	id, res, err := c.roundTrip(ctx, in, "text/plain", map[string]string{"pipestream.processor": "textstats"})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPlainResult(id, res, 0, 2); err != nil {
		t.Error(err)
	}
	var stats map[string]any
	if json.Unmarshal(res.payload, &stats) != nil || len(stats) == 0 {
		t.Errorf("textstats result is not a JSON object: %.300q", res.payload)
	}
	if !strings.Contains(res.hdr.ContentType, "json") {
		t.Errorf("textstats result content-type %q", res.hdr.ContentType)
	}
}

func plainDehydrated(ctx context.Context, t *testing.T, c *d02Client) {
	chunks := [][]byte{[]byte("first chunk, "), binaryData(70<<10, 7), []byte(" and the last one")}
	r, kids, res, err := c.dehydrate(ctx, chunks, "application/octet-stream")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPlainResult(r, res); err != nil {
		t.Error(err)
	}
	if want := bytes.Join(chunks, nil); !bytes.Equal(res.payload, want) {
		t.Errorf("rehydrated result: %d octets, want the %d-octet concatenation in chunk order", len(res.payload), len(want))
	}
	if err := wantStatusSeq(c.statusesOf(r), stRehydrating, stComplete); err != nil {
		t.Errorf("parent %d: %v", r, err)
	}
	for _, k := range kids {
		if err := wantStatusSeq(c.statusesOf(k), stProcessing, stComplete); err != nil {
			t.Errorf("child %d: %v", k, err)
		}
		if n := len(c.resultsOf(k)) + len(c.resultsFor(k)); n > 0 {
			t.Errorf("child %d: %d result entities, want one result for the parent only", k, n)
		}
	}
	if n := len(c.resultsOf(r)); n != 1 {
		t.Errorf("parent %d: %d result entities, want 1", r, n)
	}
}

// ---- 2. gateway -> plain draft-02 peer ----

// plainPeerArgs points the gateway at p (default framing and profile:
// auto).
func plainPeerArgs(addr, caPEM string, extra ...string) []string {
	return append([]string{"--peer", addr, "--peer-ca", caPEM}, extra...)
}

// TestInteropPlainPeer: `gateway serve --peer` at a plain draft-02 peer
// that answers PROCESSING, COMPLETE and then returns the upper-cased input
// as a new entity (parent-id = the input): a small document (one plain
// root entity) and a 3 MiB upload in 1 MiB chunks (DEHYDRATING + plain
// children) end SUCCEEDED with the upper-cased content in order; a peer
// that returns nothing gives SUCCEEDED, resultAbsent and 404 RESULT_ABSENT.
func TestInteropPlainPeer(t *testing.T) {
	t.Parallel()
	t.Run("results", func(t *testing.T) {
		p := startD02Peer(t, peerEcho)
		g := startInteropGateway(t, plainPeerArgs(p.addr, p.caPEM)...)
		small := []byte("hello, plain draft-02 peer\n")
		id := submitDoc(t, g, map[string]any{"content": b64(small), "contentType": "text/plain"})
		wantSucceededWith(t, g, id, bytes.ToUpper(small), time.Minute)
		checkPlainRoot(t, p, small)

		big := textCorpus(3 << 20)
		id = uploadDoc(t, g, "split.strategy=fixed_bytes&split.chunkBytes=1048576", big)
		wantSucceededWith(t, g, id, bytes.ToUpper(big), 2*time.Minute)
		checkPlainChildren(t, p, big, 1<<20)
		_, _, offered, errs, conns := p.snapshot()
		if len(errs) > 0 {
			t.Errorf("the plain peer saw protocol errors: %v", errs)
		}
		t.Logf("plain peer: %d connections; CAPABILITIES members offered: %v", conns, offered)
	})
	t.Run("results under the input's id", func(t *testing.T) {
		p := startD02Peer(t, peerEchoSameID)
		g := startInteropGateway(t, plainPeerArgs(p.addr, p.caPEM)...)
		small := []byte("same id back\n")
		id := submitDoc(t, g, map[string]any{"content": b64(small), "contentType": "text/plain"})
		wantSucceededWith(t, g, id, bytes.ToUpper(small), time.Minute)
		big := textCorpus(3 << 20)
		id = uploadDoc(t, g, "split.strategy=fixed_bytes&split.chunkBytes=1048576", big)
		wantSucceededWith(t, g, id, bytes.ToUpper(big), 2*time.Minute)
	})
	t.Run("framing draft-02, profile off", func(t *testing.T) {
		p := startD02Peer(t, peerEcho)
		g := startInteropGateway(t, plainPeerArgs(p.addr, p.caPEM, "--peer-framing", "draft-02", "--peer-profile", "off")...)
		small := []byte("no discovery member, please\n")
		id := submitDoc(t, g, map[string]any{"content": b64(small), "contentType": "text/plain"})
		wantSucceededWith(t, g, id, bytes.ToUpper(small), time.Minute)
		checkPlainRoot(t, p, small)
		_, _, offered, _, _ := p.snapshot()
		for _, keys := range offered {
			for _, k := range keys {
				if !contains(draft02CapsMembers, k) {
					t.Errorf("--peer-profile off: the gateway offered CAPABILITIES member %q (all: %v)", k, keys)
				}
			}
		}
	})
	t.Run("no result", func(t *testing.T) {
		p := startD02Peer(t, peerNoResult)
		g := startInteropGateway(t, plainPeerArgs(p.addr, p.caPEM)...)
		id := submitDoc(t, g, map[string]any{"content": b64([]byte("nothing comes back")), "contentType": "text/plain"})
		d := awaitTerminalDoc(t, g, id, time.Minute)
		if d.str("state") != "SUCCEEDED" || d["resultAbsent"] != true {
			t.Errorf("document with no result: want SUCCEEDED and resultAbsent true, got %v", d)
		}
		wantResultAbsent(t, g, id)
	})
}

// draft02CapsMembers are the capabilities members draft-02 defines.
var draft02CapsMembers = []string{"layer0-core", "layer1-recursive", "layer2-resilience", "max-scope-depth",
	"max-entities-per-scope", "max-window-size", "serialization-format", "keepalive-timeout-ms"}

// checkPlainRoot: the small document reached the peer as one plain root
// entity: the raw content, no parent, no profile.
func checkPlainRoot(t *testing.T, p *d02Peer, content []byte) {
	t.Helper()
	ents, _, _, _, _ := p.snapshot()
	for _, e := range ents {
		if bytes.Equal(e.payload, content) {
			if e.hdr.ParentID != nil || e.hdr.Metadata["pipestream.profile"] == "1" {
				t.Errorf("small document: entity %d is not a plain root: %+v", e.hdr.EntityID, e.hdr)
			}
			return
		}
	}
	t.Errorf("small document: no entity carried the raw content (%d entities seen; an envelope instead of the content?)", len(ents))
}

// checkPlainChildren: the large document reached the peer as
// STATUS(R, DEHYDRATING) plus chunk children of R whose payloads in
// chunk-index order are the content; R itself was not sent as an entity.
func checkPlainChildren(t *testing.T, p *d02Peer, content []byte, chunk int) {
	t.Helper()
	ents, statusIn, _, _, _ := p.snapshot()
	byParent := map[uint32][]gotEntity{}
	for _, e := range ents {
		if e.hdr.ParentID != nil {
			byParent[*e.hdr.ParentID] = append(byParent[*e.hdr.ParentID], e)
		}
	}
	for r, kids := range byParent {
		if !dehydratingSent(statusIn, r) {
			t.Errorf("children of %d arrived without STATUS(%d, DEHYDRATING)", r, r)
		}
		if got := concatByChunk(t, kids); !bytes.Equal(got, content) {
			t.Errorf("children of %d: %d of them, %d octets in chunk order, want %d octets", r, len(kids), len(got), len(content))
		}
		if want := (len(content) + chunk - 1) / chunk; len(kids) < want {
			t.Errorf("children of %d: %d, want at least %d chunks of at most %d octets", r, len(kids), want, chunk)
		}
		for _, e := range ents {
			if e.hdr.EntityID == r {
				t.Errorf("the parent %d was also sent as an entity (%d octets, metadata %v)", r, len(e.payload), e.hdr.Metadata)
			}
		}
		return
	}
	t.Errorf("the large document reached the peer without chunk children (%d entities)", len(ents))
}

func dehydratingSent(ss []statusFrame, r uint32) bool {
	for _, s := range ss {
		if s.entity == r && s.stat == stDehydrating {
			return true
		}
	}
	return false
}

// concatByChunk joins the children's payloads in chunk-index order.
func concatByChunk(t *testing.T, kids []gotEntity) []byte {
	t.Helper()
	parts := make([][]byte, len(kids))
	for _, k := range kids {
		ci := k.hdr.ChunkInfo
		if ci == nil || ci.Index >= uint64(len(kids)) || parts[ci.Index] != nil {
			t.Errorf("child %d: chunk-info %+v", k.hdr.EntityID, ci)
			return nil
		}
		parts[ci.Index] = k.payload
	}
	return bytes.Join(parts, nil)
}

// wantResultAbsent: GET .../result answers 404 with reason RESULT_ABSENT.
func wantResultAbsent(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	st, b, err := doJSON(context.Background(), "GET", g.baseURL()+"/v1/documents/"+id+"/result", nil, "")
	var s rpcStatus
	if err != nil || st != 404 || json.Unmarshal(b, &s) != nil || !contains(s.reasons(), "RESULT_ABSENT") {
		t.Errorf("GET result of a document without one: HTTP %d %v %.300s, want 404 with ErrorInfo reason RESULT_ABSENT", st, err, b)
	}
}

// ---- 3. stalling peer ----

// TestInteropStallingPeer: a peer that reads the entity, says PROCESSING
// and never finishes; with completionPolicy.timeoutMs 3000 the document
// ends FAILED long before the 300 s default, and its error names the
// entity, the peer and PROCESSING.
func TestInteropStallingPeer(t *testing.T) {
	t.Parallel()
	p := startD02Peer(t, peerStall)
	g := startInteropGateway(t, plainPeerArgs(p.addr, p.caPEM)...)
	start := time.Now()
	id := submitDoc(t, g, map[string]any{"content": b64([]byte("this never finishes")), "contentType": "text/plain",
		"completionPolicy": map[string]any{"timeoutMs": 3000}})
	d := awaitTerminalDoc(t, g, id, time.Minute)
	took := time.Since(start)
	ents, _, _, _, _ := p.snapshot()
	if len(ents) == 0 {
		t.Fatalf("the stalling peer never received an entity; document: %v", d)
	}
	eid := strconv.FormatUint(uint64(ents[0].hdr.EntityID), 10)
	msg := d.str("error")
	if d.str("state") != "FAILED" {
		t.Errorf("stalled document: %s, want FAILED: %v", d.str("state"), d)
	}
	for _, want := range []string{eid, p.addr, "PROCESSING"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q (the entity, the peer, what the peer last reported)", msg, want)
		}
	}
	if took < 2500*time.Millisecond {
		t.Errorf("document ended after %v, before its 3 s timeout", took)
	}
	_, statusIn, _, _, _ := p.snapshot()
	t.Logf("ended %s after %v: %q; the stalling peer received %v", d.str("state"), took.Round(time.Millisecond), msg, statusIn)
}

// ---- 4. peer down or refusing ----

// TestInteropPeerUnavailable: --peer at a closed port, and at a peer that
// closes every session after CAPABILITIES, with --peer-wait 3s: while the
// document waits, GET shows waitReason and /healthz names the peer; then
// it FAILS with an error naming the peer.
func TestInteropPeerUnavailable(t *testing.T) {
	t.Parallel()
	t.Run("closed port", func(t *testing.T) {
		_, pemPath := partnerCert(t, t.TempDir())
		peerUnavailable(t, freeUDPAddr(t), pemPath)
	})
	t.Run("refusing", func(t *testing.T) {
		p := startD02Peer(t, peerRefuse)
		peerUnavailable(t, p.addr, p.caPEM)
		if _, _, _, _, conns := p.snapshot(); conns == 0 {
			t.Errorf("the gateway never connected to the refusing peer")
		}
	})
}

func peerUnavailable(t *testing.T, addr, caPEM string) {
	g := startInteropGateway(t, plainPeerArgs(addr, caPEM, "--peer-wait", "3s")...)
	start := time.Now()
	id := submitDoc(t, g, map[string]any{"content": b64([]byte("nobody to process me")), "contentType": "text/plain"})
	d := pollDoc(t, g, id, 30*time.Second, "showing a waitReason", func(d docMap) bool {
		return d.str("waitReason") != "" || terminalState(d.str("state"))
	})
	if d.str("waitReason") == "" {
		t.Errorf("no waitReason while the document waited for the peer: %v", d)
	} else if terminalState(d.str("state")) {
		t.Errorf("waitReason only on the terminal document: %v", d)
	}
	_, hb, err := doJSON(context.Background(), "GET", g.baseURL()+"/healthz", nil, "")
	if err != nil || !strings.Contains(string(hb), addr) {
		t.Errorf("/healthz does not name the peer %s: %v %.300s", addr, err, hb)
	}
	t.Logf("waitReason %q; /healthz %.300s", d.str("waitReason"), bytes.TrimSpace(hb))
	d = awaitTerminalDoc(t, g, id, 60*time.Second)
	if d.str("state") != "FAILED" || !strings.Contains(d.str("error"), addr) {
		t.Errorf("after --peer-wait 3s: want FAILED with an error naming %s, got %v", addr, d)
	}
	took := time.Since(start)
	if took < 2500*time.Millisecond {
		t.Errorf("FAILED after %v, before --peer-wait 3s", took)
	}
	t.Logf("%s after %v: %q", d.str("state"), took.Round(time.Millisecond), d.str("error"))
}

// ---- 5. draft-04 (reference suite) ----

// TestInteropDraft04Client: the reference client conversation against
// `gateway peer` (default framing auto): the whole conversation completes
// on two connections, the server CAPABILITIES is the closed canonical
// six-member map holding the negotiated set (Layer 0 only, window 1024,
// keepalive 30000: what the reference client offered, which its
// validate_response requires), and any entity the peer opens would pass the
// reference's decoder.
func TestInteropDraft04Client(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		args []string
	}{{"default", nil}, {"framing draft-04", []string{"--framing", "draft-04"}}} {
		t.Run(mode.name, func(t *testing.T) {
			addr, cert, _ := startPeer(t, mode.args...)
			for _, c := range []struct {
				id      uint32
				payload []byte
			}{{1, []byte("PipeStream Layer 0\n")}, {7, binaryData(2<<20, 44)}} { // 2 MiB: a result stream the client never reads stalls at 1.25 MB
				rep, err := runD04Client(ctxT(t, 30*time.Second), addr, cert, c.id, c.payload, "text/plain; charset=utf-8")
				if err != nil {
					hint := ""
					if len(c.payload) > 1250000 {
						hint = " (the reference client never reads a server-initiated stream: quinn holds one at its 1.25 MB stream window, so a result must not hold back PROCESSING/COMPLETE)"
					}
					t.Errorf("reference client conversation (entity %d, %d octets): %v; statuses received: %v%s", c.id, len(c.payload), err, rep.statuses, hint)
					continue
				}
				if want := negotiateD04(referenceCaps(), referenceCaps()); capsText(rep.serverCaps) != capsText(want) {
					t.Errorf("entity %d: the peer answered CAPABILITIES %s, want the negotiated set %s", c.id, capsText(rep.serverCaps), capsText(want))
				}
				if len(rep.resultErrs) > 0 {
					t.Errorf("entity %d: the peer opened entities the reference decoder refuses: %v", c.id, rep.resultErrs)
				}
				for _, r := range rep.results {
					t.Logf("entity %d: the peer also opened entity %d (%d octets, members %v), which the reference client never reads", c.id, r.hdr.EntityID, len(r.payload), r.keys)
				}
				for _, err := range rep.drainErrs {
					t.Logf("entity %d: a stream the peer opened could not be read after the conversation: %v", c.id, err)
				}
			}
		})
	}
}

// TestInteropDraft04Server: `gateway serve` against the reference server
// conversation with --peer-framing draft-04 and auto: two documents, each
// on its own connection, end SUCCEEDED with the result absent, and the
// server got each document's exact bytes in a header of only the six
// reference members. A document that names a processor never reaches
// it (the header has no metadata: docs/profile.md 9.3): refused at
// submission under draft-04, held with its reason under auto.
func TestInteropDraft04Server(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"draft-04", "auto"} {
		t.Run(mode, func(t *testing.T) {
			s := startD04Server(t)
			g := startInteropGateway(t, plainPeerArgs(s.addr, s.caPEM, "--peer-framing", mode)...)
			// the second is above the 1 MiB inline threshold: still one entity
			docs := [][]byte{[]byte("first document for the reference server\n"), textCorpus(2 << 20)}
			checkProcessorNotToD04(t, g, mode)
			for _, content := range docs {
				id := submitDoc(t, g, map[string]any{"content": b64(content), "contentType": "text/plain"})
				d := awaitTerminalDoc(t, g, id, 90*time.Second)
				if d.str("state") != "SUCCEEDED" || d["resultAbsent"] != true {
					sess, errs, conns := s.snapshot()
					t.Errorf("document: want SUCCEEDED with resultAbsent, got %v (server: %d connections, %d sessions, errors %s)", d, conns, len(sess), errorsText(errs))
				}
			}
			checkD04Sessions(t, s, docs, mode)
		})
	}
}

// TestInteropSlammingPeer (issue 20 items 4 and 5): `gateway serve` onto
// a plain draft-02 peer that answers CAPABILITIES and closes every
// session at once. The gateway backs off as for failed dials (the sixth
// connection comes at least 50+100+200+400+800 ms after the first: a few
// a second at most, not hundreds), /healthz and the document's waitReason
// name the peer and its last failure, and after --peer-wait the document
// FAILS with an error that names both, its dispatch attempts unspent.
func TestInteropSlammingPeer(t *testing.T) {
	t.Parallel()
	p := startD02Peer(t, peerSlam)
	g := startInteropGateway(t, plainPeerArgs(p.addr, p.caPEM, "--peer-wait", "4s")...)
	id := submitDoc(t, g, map[string]any{"content": b64([]byte("held up by a peer that closes every session\n")), "contentType": "text/plain"})
	ctx := ctxT(t, 60*time.Second)
	if err := p.wait(ctx, "six connections", func() bool { return p.conns >= 6 }); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	span := p.connAt[5].Sub(p.connAt[0])
	p.mu.Unlock()
	if span < 1550*time.Millisecond {
		t.Errorf("6 connections within %v: the gateway reconnects faster than its backoff allows", span)
	}
	const why = "this peer closes every session at once"
	_, body, err := doJSON(context.Background(), "GET", g.baseURL()+"/healthz", nil, "")
	if err != nil || !strings.Contains(string(body), why) || !strings.Contains(string(body), p.addr) {
		t.Errorf("/healthz %s (%v): want the peer and its last failure %q", body, err, why)
	}
	d := pollDoc(t, g, id, 20*time.Second, "a waitReason naming the peer's last failure", func(d docMap) bool {
		return strings.Contains(d.str("waitReason"), why) || terminalState(d.str("state"))
	})
	if w := d.str("waitReason"); !strings.Contains(w, p.addr) || !strings.Contains(w, why) {
		t.Errorf("waitReason %q: want the peer %s and its last failure", w, p.addr)
	}
	d = awaitTerminalDoc(t, g, id, 60*time.Second)
	if e := d.str("error"); d.str("state") != "FAILED" || !strings.Contains(e, p.addr) || !strings.Contains(e, why) || !strings.Contains(e, "--peer-wait") {
		t.Errorf("document %s %q: want FAILED after --peer-wait naming the peer and its last failure", d.str("state"), e)
	}
	p.mu.Lock()
	n := p.conns
	p.mu.Unlock()
	t.Logf("%d connections, the first six over %v; final error: %s", n, span.Round(time.Millisecond), d.str("error"))
}

// TestPeerNewCertificateSIGHUP (issue 20 item 6): `gateway peer`
// restarted on the same address with a new self-signed certificate is
// reached without restarting the gateway: once its --peer-ca file holds
// the new certificate, SIGHUP (or the next re-dial) reads it again.
func TestPeerNewCertificateSIGHUP(t *testing.T) {
	t.Parallel()
	addr, cert, p := startPeer(t)
	caFile := filepath.Join(t.TempDir(), "peer-ca.pem")
	copyFile := func(from string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(caFile, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	copyFile(cert)
	g := startInteropGateway(t, plainPeerArgs(addr, caFile)...)
	run := func(what string) {
		t.Helper()
		id := submitDoc(t, g, map[string]any{"content": b64([]byte("document for " + what)), "contentType": "text/plain"})
		if d := awaitTerminalDoc(t, g, id, 60*time.Second); d.str("state") != "SUCCEEDED" {
			t.Fatalf("%s: %v", what, d)
		}
	}
	run("the first certificate")
	p.stop()
	_, cert2, _ := startPeerAt(t, addr)
	waitFor(t, "the gateway to refuse the new certificate", 30*time.Second, func() bool {
		_, body, err := doJSON(context.Background(), "GET", g.baseURL()+"/healthz", nil, "")
		return err == nil && strings.Contains(string(body), "certificate")
	})
	copyFile(cert2)
	signalProc(t, g.proc, syscall.SIGHUP)
	waitFor(t, "the gateway to log the reload", 10*time.Second, func() bool { return g.proc.logContains("--peer-ca files read again") })
	run("the new certificate")
}

// TestInteropDraft04NoHeartbeatAuto (issue 20 item 3): `gateway serve`
// with auto framing onto a draft-04 peer that sends no heartbeat after
// CAPABILITIES (it is optional): the first session settles on draft-02
// and the peer closes it at once; the next dial tries draft-04, both
// documents SUCCEED with no attempt spent on the failed session, and
// /healthz shows draft-04 as the framing that worked.
func TestInteropDraft04NoHeartbeatAuto(t *testing.T) {
	t.Parallel()
	s := startD04ServerWith(t, true)
	g := startInteropGateway(t, plainPeerArgs(s.addr, s.caPEM, "--peer-framing", "auto")...)
	docs := [][]byte{[]byte("first document for a draft-04 peer without heartbeat\n"), []byte("second one\n")}
	for _, content := range docs {
		id := submitDoc(t, g, map[string]any{"content": b64(content), "contentType": "text/plain"})
		d := awaitTerminalDoc(t, g, id, 90*time.Second)
		if d.str("state") != "SUCCEEDED" || d["resultAbsent"] != true {
			sess, errs, conns := s.snapshot()
			t.Errorf("document: want SUCCEEDED with resultAbsent, got %v (server: %d connections, %d sessions, errors %s)", d, conns, len(sess), errorsText(errs))
		}
	}
	var hz struct {
		Peers []struct {
			Addr, State, Framing, FramingWorked string
		} `json:"peers"`
	}
	st, body, err := doJSON(context.Background(), "GET", g.baseURL()+"/healthz", nil, "")
	if err != nil || json.Unmarshal(body, &hz) != nil || len(hz.Peers) != 1 {
		t.Fatalf("/healthz: %d %s %v", st, body, err)
	}
	if p := hz.Peers[0]; p.FramingWorked != "draft-04" || p.Framing != "draft-04" {
		t.Errorf("/healthz peer %+v: want draft-04 as the framing that worked and the one used", p)
	}
	_, errs, conns := s.snapshot()
	t.Logf("reference server without heartbeat: %d connections, refused: %s; /healthz %s", conns, errorsText(errs), bytes.TrimSpace(body))
}

// checkProcessorNotToD04 submits a textstats document to a gateway whose
// only peer is the draft-04 reference server: with --peer-framing
// draft-04 it is refused (400 FAILED_PRECONDITION naming what it needs);
// with auto it is accepted and waits, its waitReason naming entity
// metadata, until its client cancels it. checkD04Sessions then shows the
// server never received it.
func checkProcessorNotToD04(t *testing.T, g *gatewayProc, mode string) {
	t.Helper()
	req := mustJSON(t, map[string]any{"content": b64([]byte("count my words\n")), "contentType": "text/plain", "split": map[string]any{"processor": "textstats"}})
	st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents", req, "application/json")
	if err != nil {
		t.Fatal(err)
	}
	if mode == "draft-04" {
		msg, reason := rpcMessage(t, httpResp{body: b})
		if st != 400 || reason != "FAILED_PRECONDITION" || !strings.Contains(msg, "split.processor textstats") || !strings.Contains(msg, "draft-04") {
			t.Errorf("textstats toward a draft-04 peer only: %d %s, want 400 FAILED_PRECONDITION naming the processor and draft-04", st, b)
		}
		return
	}
	var d docMap
	if st != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("submit textstats: %d %s", st, b)
	}
	id := d.str("id")
	d = pollDoc(t, g, id, 30*time.Second, "a waitReason naming entity metadata", func(d docMap) bool {
		return strings.Contains(d.str("waitReason"), "entity metadata") || terminalState(d.str("state"))
	})
	if terminalState(d.str("state")) {
		t.Fatalf("textstats document with only a draft-04 peer: %v, want it held", d)
	}
	if st, b, err := doJSON(context.Background(), "POST", g.baseURL()+"/v1/documents/"+id+":cancel", []byte("{}"), "application/json"); err != nil || st != 200 {
		t.Fatalf("cancel: %d %v %s", st, err, b)
	}
}

func checkD04Sessions(t *testing.T, s *d04Server, docs [][]byte, mode string) {
	t.Helper()
	// The server records a session once it read the cursor update that
	// follows the terminal COMPLETE, which the gateway may send after it
	// marked the document SUCCEEDED: wait for it rather than look early.
	_ = s.wait(ctxT(t, 30*time.Second), "the reference server's sessions", func() bool { return len(s.sessions) >= len(docs) })
	sess, errs, conns := s.snapshot()
	t.Logf("reference server (%s): %d connections, %d sessions, refused: %s", mode, conns, len(sess), errorsText(errs))
	if len(sess) != len(docs) {
		t.Fatalf("the reference server completed %d sessions over %d connections, want %d; its errors: %s", len(sess), conns, len(docs), errorsText(errs))
	}
	if mode == "draft-04" && len(errs) > 0 {
		t.Errorf("with --peer-framing draft-04 the reference server refused connections: %s", errorsText(errs))
	}
	for i, ss := range sess {
		e := ss.entity
		if !bytes.Equal(e.payload, docs[i]) {
			t.Errorf("session %d: entity %d carries %d octets, want document %d's %d exact octets", i, e.hdr.EntityID, len(e.payload), i, len(docs[i]))
		}
		for _, k := range []string{"entity-id", "layer", "content-type", "payload-length", "checksum"} {
			if !contains(e.keys, k) {
				t.Errorf("session %d: header lacks %s (members %v)", i, k, e.keys)
			}
		}
		for _, k := range e.keys {
			if !contains(d04HeaderMembers, k) {
				t.Errorf("session %d: header member %q is not one of the reference's six", i, k)
			}
		}
	}
}
