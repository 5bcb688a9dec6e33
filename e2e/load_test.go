package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fxamacker/cbor/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Load: loadClients concurrent clients for loadDuration mix REST and gRPC
// submissions, gRPC watches, NDJSON and WebSocket event subscriptions and
// claim redemptions against one gateway whose rate and per-tenant limits
// are lifted. Zero unexpected errors; afterwards the gateway's goroutines
// and heap (after a forced GC) are back near where they started.

const (
	loadClients  = 500
	loadDuration = 20 * time.Second
	loadPause    = 50 * time.Millisecond // between one client's operations
	// Tolerances after the load (settled, GC forced through pprof): a few
	// goroutines for pooled connections and timers. The live heap (bytes
	// reachable after the GC; heap in use adds span fragmentation, which
	// is not retention, and is only logged) may grow by exactly what the
	// gateway keeps by design, plus loadHeapSlack:
	//   - the event log's tail, a bounded cache that stays full:
	//     loadTailEvents x loadTailEventHeap;
	//   - the retention index, bounded whatever the number of retained
	//     events (all are retained: --retain-min is 1 h): loadIndexHeap,
	//     its 16,384 buckets of 56 bytes (docs/retention.md, "Index
	//     memory"), not a per-event allowance;
	//   - loadHeapSlack for the SQLite page cache, connection and sync
	//     pools, and the deferred documents still waiting on their claims.
	// A finished document costs ~3 KiB when retained (the session leak fixed
	// in bridge: ~36 MiB for this load), far above the slack.
	loadGoroutineSlack = 30
	// loadTailEvents is the event log's shared in-memory tail (a bounded
	// cache that stays full after the load: docs/retention.md), passed
	// explicitly at its default (eventlog.DefaultTailEvents). A smaller tail
	// is no option: 16,384 made the live NDJSON/WebSocket subscribers of
	// this load ConsumerTooSlow early in the run (they lag far behind the
	// submissions on 2 cores).
	loadTailEvents = 1 << 16
	loadHeapSlack  = 16 << 20
	// loadTailEventHeap: one decoded event on the tail (item, Event
	// message, strings, timestamps; measured ~390 B), rounded up.
	loadTailEventHeap = 512
	// loadIndexHeap: the retention index at its bound, with its slice's
	// growth headroom (2 x 16,384 x 56 B).
	loadIndexHeap = 2 * 16384 * 56
)

// processStats reads go_goroutines, go_memstats_heap_alloc_bytes (live
// heap), go_memstats_heap_inuse_bytes and the event log's appended events
// from /metrics after forcing a GC through pprof's heap?gc=1.
func processStats(t *testing.T, g *gatewayProc, pprof string) (goroutines, heap, inuse, events float64) {
	t.Helper()
	if resp, err := http.Get("http://" + pprof + "/debug/pprof/heap?gc=1"); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	} else {
		t.Fatalf("pprof GC: %v", err)
	}
	_, b, err := doJSON(context.Background(), "GET", g.baseURL()+"/metrics", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	goroutines, heap, inuse = -1, -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_goroutines":
			goroutines = v
		case "go_memstats_heap_alloc_bytes":
			heap = v
		case "go_memstats_heap_inuse_bytes":
			inuse = v
		case "pipestream_eventlog_appended_events_total":
			events = v
		}
	}
	if goroutines < 0 || heap < 0 || inuse < 0 {
		t.Fatalf("/metrics lacks go_goroutines or go_memstats_heap_{alloc,inuse}_bytes (the Go collector is not registered)")
	}
	return goroutines, heap, inuse, events
}

// saveHeapProfile writes the gateway's heap profile to path (debugging aid:
// set LOAD_PROFILE_DIR to keep the profiles before and after the load).
func saveHeapProfile(t *testing.T, g *gatewayProc, pprof, path string) {
	t.Helper()
	resp, err := http.Get("http://" + pprof + "/debug/pprof/heap")
	if err != nil {
		t.Fatalf("heap profile: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, url := range map[string]string{".metrics": g.baseURL() + "/metrics", ".heap.txt": "http://" + pprof + "/debug/pprof/heap?debug=1", ".goroutines.txt": "http://" + pprof + "/debug/pprof/goroutine?debug=1"} {
		_, b, err := doJSON(context.Background(), "GET", url, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(path+name, b, 0o644)
	}
}

type loadErrs struct {
	mu    sync.Mutex
	n     atomic.Int64
	first []string
}

func (e *loadErrs) add(format string, args ...any) {
	e.n.Add(1)
	e.mu.Lock()
	if len(e.first) < 10 {
		e.first = append(e.first, fmt.Sprintf(format, args...))
	}
	e.mu.Unlock()
}

func TestLoad(t *testing.T) {
	pprof := freeTCPAddr(t)
	g := startGateway(t, gwOpts{args: []string{"--rate-limit", "0", "--max-uploads-per-tenant", "0",
		"--max-subscribers-per-tenant", "0", "--max-concurrent-streams", "4096", "--max-conns-per-ip", "0", "--max-downloads-per-tenant", "0",
		"--event-tail-events", strconv.Itoa(loadTailEvents), "--pprof-addr", pprof, "--log-level", "warn"}})
	r := newLoadRun(t, g)
	defer r.close()

	// Warm up every path once, then take the baseline.
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	if _, err := r.conns[0].SubmitDocument(wctx, &gatewayv1.SubmitDocumentRequest{Content: []byte("warm"), ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	wcancel()
	before := settledStats(t, g, pprof, time.Now().Add(5*time.Second), func(s loadStats) bool { return s.goroutines >= 0 })
	if dir := os.Getenv("LOAD_PROFILE_DIR"); dir != "" {
		saveHeapProfile(t, g, pprof, dir+"/before.pb.gz")
	}

	r.run()
	r.check()

	// Settle: the gateway finishes queued work; connections and streams
	// close. Then goroutines and heap must be back within the slack.
	after := settledStats(t, g, pprof, time.Now().Add(30*time.Second), func(s loadStats) bool {
		return s.goroutines <= before.goroutines+loadGoroutineSlack && s.heap <= before.heap+allowedHeapGrowth(before, s)
	})
	if dir := os.Getenv("LOAD_PROFILE_DIR"); dir != "" {
		saveHeapProfile(t, g, pprof, dir+"/after.pb.gz")
	}
	checkNoLeak(t, before, after)
}

// loadStats is one processStats sample.
type loadStats struct{ goroutines, heap, inuse, events float64 }

// settledStats samples the gateway's stats once a second until ok holds or
// deadline passes, and returns the last sample.
func settledStats(t *testing.T, g *gatewayProc, pprof string, deadline time.Time, ok func(loadStats) bool) loadStats {
	t.Helper()
	for {
		var s loadStats
		s.goroutines, s.heap, s.inuse, s.events = processStats(t, g, pprof)
		if ok(s) || time.Now().After(deadline) {
			return s
		}
		time.Sleep(time.Second) // sampling period of a poll with a deadline
	}
}

// allowedHeapGrowth is what the gateway keeps by design after the load: the
// full tail, the retention index at its bound, and the slack. None of it
// grows with the number of events appended.
func allowedHeapGrowth(_, _ loadStats) float64 {
	return loadTailEvents*loadTailEventHeap + loadIndexHeap + loadHeapSlack
}

func checkNoLeak(t *testing.T, before, after loadStats) {
	t.Helper()
	allowed := allowedHeapGrowth(before, after)
	t.Logf("gateway goroutines %v -> %v (slack %d); live heap %.1f MiB -> %.1f MiB (allowed growth %.1f MiB: tail %d events, index %.0f events, slack %d MiB); heap in use %.1f MiB -> %.1f MiB",
		before.goroutines, after.goroutines, loadGoroutineSlack, before.heap/(1<<20), after.heap/(1<<20), allowed/(1<<20),
		loadTailEvents, after.events-before.events, loadHeapSlack>>20, before.inuse/(1<<20), after.inuse/(1<<20))
	if after.goroutines > before.goroutines+loadGoroutineSlack {
		t.Errorf("goroutines grew from %v to %v after the load settled (slack %d): a leak", before.goroutines, after.goroutines, loadGoroutineSlack)
	}
	if after.heap > before.heap+allowed {
		t.Errorf("live heap grew from %.1f to %.1f MiB after the load and a GC, more than the tail, the retention index and the slack allow (%.1f MiB): a leak",
			before.heap/(1<<20), after.heap/(1<<20), allowed/(1<<20))
	}
}

// Client kinds of the load: i % loadKinds picks one per client.
const (
	kindRESTSubmit = iota
	kindGRPCSubmit
	kindWatch
	kindNDJSON
	kindWebSocket
	kindRedeem
	loadKinds
)

var loadKindNames = [loadKinds]string{"REST submits", "gRPC submits", "watches", "NDJSON events", "WebSocket frames", "redemptions"}

// loadRun is one load: its clients, deadline, counters and errors.
type loadRun struct {
	t       *testing.T
	g       *gatewayProc
	ccs     []*grpc.ClientConn
	conns   []gatewayv1.DocumentServiceClient
	hc      *http.Client
	ctx     context.Context
	cancel  context.CancelFunc
	loadEnd time.Time
	errs    loadErrs
	ops     [loadKinds]atomic.Int64
	// resumes counts live subscriptions cut with ConsumerTooSlow and
	// resumed from their last seq (the documented recovery).
	resumes [loadKinds]atomic.Int64
}

func newLoadRun(t *testing.T, g *gatewayProc) *loadRun {
	r := &loadRun{t: t, g: g, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: loadClients}}}
	for range 8 {
		cc, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		r.ccs = append(r.ccs, cc)
		r.conns = append(r.conns, gatewayv1.NewDocumentServiceClient(cc))
	}
	return r
}

func (r *loadRun) close() {
	r.hc.CloseIdleConnections()
	for _, cc := range r.ccs {
		cc.Close()
	}
}

// run starts loadClients clients and waits until loadDuration has passed
// and every client has returned.
func (r *loadRun) run() {
	r.ctx, r.cancel = context.WithTimeout(context.Background(), loadDuration)
	defer r.cancel()
	r.loadEnd, _ = r.ctx.Deadline()
	var wg sync.WaitGroup
	for i := range loadClients {
		wg.Go(func() { r.client(i) })
	}
	wg.Wait()
	r.hc.CloseIdleConnections()
}

// check reports the unexpected errors and a kind of operation that never
// completed.
func (r *loadRun) check() {
	t := r.t
	t.Logf("%d clients for %v: REST submits %d, gRPC submits %d, watches %d, NDJSON events %d, WebSocket frames %d, redemptions %d; live subscriptions resumed after ConsumerTooSlow: NDJSON %d, WebSocket %d",
		loadClients, loadDuration, r.ops[0].Load(), r.ops[1].Load(), r.ops[2].Load(), r.ops[3].Load(), r.ops[4].Load(), r.ops[5].Load(),
		r.resumes[kindNDJSON].Load(), r.resumes[kindWebSocket].Load())
	if n := r.errs.n.Load(); n > 0 {
		t.Errorf("%d unexpected errors under load; first: %s", n, strings.Join(r.errs.first, "\n  "))
	}
	for k, name := range loadKindNames {
		if r.ops[k].Load() == 0 {
			t.Errorf("no %s completed under load", name)
		}
	}
}

// client i runs its kind of operation until the load ends; a subscriber
// client follows the log for the whole run.
func (r *loadRun) client(i int) {
	kind := i % loadKinds
	docs := r.conns[i%len(r.conns)]
	switch kind {
	case kindNDJSON:
		r.followNDJSON()
		return
	case kindWebSocket:
		r.followWebSocket()
		return
	}
	for n := 0; r.ctx.Err() == nil; n++ {
		var done bool
		switch kind {
		case kindRESTSubmit:
			done = r.restSubmit(i, n)
		case kindGRPCSubmit:
			done = r.grpcSubmit(docs, i, n)
		case kindWatch:
			done = r.submitAndWatch(docs, i, n)
		case kindRedeem:
			done = r.deferAndRedeem(i, n)
		}
		if done {
			return
		}
		r.ops[kind].Add(1)
		select {
		case <-r.ctx.Done():
		case <-time.After(loadPause):
		}
	}
}

// over: err is the load's end (its context), not a failure.
func (r *loadRun) over(err error) bool { return r.ctx.Err() != nil && err != nil }

// grpcOver: the gateway gets the call's deadline as a timeout and may expire
// it a little before the client's ctx does: DeadlineExceeded in the last
// second of the run is the run's end too.
func (r *loadRun) grpcOver(err error) bool {
	c := status.Code(err)
	return (r.ctx.Err() != nil && c == codes.Canceled) ||
		((r.ctx.Err() != nil || time.Until(r.loadEnd) < time.Second) && c == codes.DeadlineExceeded)
}

func (r *loadRun) post(url string, body []byte, ct string) (int, []byte, error) {
	req, _ := http.NewRequestWithContext(r.ctx, "POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	resp, err := r.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// restSubmit submits one document over REST; true when the load is over.
func (r *loadRun) restSubmit(i, n int) bool {
	st, b, err := r.post(r.g.baseURL()+"/v1/documents", mustJSON(r.t, map[string]any{"content": b64([]byte(fmt.Sprintf("rest %d/%d", i, n))), "contentType": "text/plain"}), "application/json")
	if r.over(err) {
		return true
	}
	if err != nil || st != 200 {
		r.errs.add("REST submit: %d %v %.200s", st, err, b)
	}
	return false
}

// grpcSubmit submits one document over gRPC; true when the load is over.
func (r *loadRun) grpcSubmit(docs gatewayv1.DocumentServiceClient, i, n int) bool {
	start := time.Now()
	_, err := docs.SubmitDocument(r.ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte(fmt.Sprintf("grpc %d/%d", i, n)), ContentType: "text/plain"})
	if r.grpcOver(err) {
		return true
	}
	if err != nil {
		r.errs.add("gRPC submit after %v (load ends in %v): %v", time.Since(start).Round(time.Millisecond), time.Until(r.loadEnd).Round(time.Millisecond), err)
	}
	return false
}

// submitAndWatch submits a document and watches it to a terminal state;
// true when the load is over.
func (r *loadRun) submitAndWatch(docs gatewayv1.DocumentServiceClient, i, n int) bool {
	d, err := docs.SubmitDocument(r.ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte(fmt.Sprintf("watched %d/%d", i, n)), ContentType: "text/plain"})
	if r.grpcOver(err) {
		return true
	}
	if err != nil {
		r.errs.add("gRPC submit (watch): %v", err)
		return false
	}
	w, err := docs.WatchDocument(r.ctx, &gatewayv1.WatchDocumentRequest{Id: d.GetId()})
	for err == nil {
		var u *gatewayv1.WatchDocumentResponse
		if u, err = w.Recv(); err == nil && terminal(u.GetDocument().GetState()) {
			err = io.EOF
		}
	}
	if r.grpcOver(err) {
		return true
	}
	if err != io.EOF {
		r.errs.add("watch %s: %v", d.GetId(), err)
	}
	return false
}

// deferAndRedeem submits a deferred document, waits for its claim and
// redeems it; true when the load is over.
func (r *loadRun) deferAndRedeem(i, n int) bool {
	st, b, err := r.post(r.g.baseURL()+"/v1/documents", mustJSON(r.t, deferredDoc([]byte(fmt.Sprintf("claim %d/%d", i, n)), 10*time.Minute, nil, nil)), "application/json")
	if r.over(err) {
		return true
	}
	var d docJSON
	if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
		r.errs.add("deferred submit: %d %v %.200s", st, err, b)
		return false
	}
	claim := r.awaitClaim(d.Id)
	if claim == "" {
		return false
	}
	st, b, err = r.post(r.g.baseURL()+"/v1/claims/"+claim+":redeem", []byte("{}"), "application/json")
	if r.over(err) {
		return true
	}
	if err != nil || st != 200 {
		r.errs.add("redeem %s: %d %v %.200s", claim, st, err, b)
	}
	return false
}

// awaitClaim polls a deferred document until it lists a claim ("" when the
// load ends first or the document ended without one, an error).
func (r *loadRun) awaitClaim(id string) string {
	for r.ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond) // polling period
		req, _ := http.NewRequestWithContext(r.ctx, "GET", r.g.baseURL()+"/v1/documents/"+id, nil)
		resp, err := r.hc.Do(req)
		if err != nil {
			if !r.over(err) {
				r.errs.add("get deferred: %v", err)
			}
			return ""
		}
		var cur docJSON
		json.NewDecoder(resp.Body).Decode(&cur)
		resp.Body.Close()
		if len(cur.ClaimChecks) > 0 {
			return cur.ClaimChecks[0].ClaimId
		}
		if terminalState(cur.State) {
			r.errs.add("deferred document %s ended %s without a claim", id, cur.State)
			return ""
		}
	}
	return ""
}

// errTooSlow is a live subscription cut with the documented ConsumerTooSlow
// error: the subscriber resumes from the last seq it processed.
var errTooSlow = errors.New("ConsumerTooSlow")

// seqFollower checks one subscriber's view of the log across resumptions:
// seqs are contiguous (the store's last_seq + 1; one tenant, no filter), a
// resumption replays the last processed event first (cursor rules:
// inclusive) and nothing is lost or repeated.
type seqFollower struct {
	last     uint64 // last seq processed; 0 before the first event
	resuming bool   // the next event is the replay of last
}

// cursor is where to subscribe: nil (live only) before any event, else the
// last seq processed.
func (f *seqFollower) cursor() *uint64 {
	if f.last == 0 {
		return nil
	}
	c := f.last
	f.resuming = true
	return &c
}

// see processes seq; false with an error when it is a gap or a duplicate,
// false without one for the replayed event of a resumption.
func (f *seqFollower) see(seq uint64) (bool, error) {
	if f.resuming {
		f.resuming = false
		if seq != f.last {
			return false, fmt.Errorf("resumed with cursor=%d, first event has seq %d (the cursor is inclusive: want the same event first)", f.last, seq)
		}
		return false, nil
	}
	if f.last != 0 && seq != f.last+1 {
		return false, fmt.Errorf("seq %d after %d: events lost or repeated", seq, f.last)
	}
	f.last = seq
	return true, nil
}

// followNDJSON follows the log over NDJSON for the whole run, resuming
// after ConsumerTooSlow.
func (r *loadRun) followNDJSON() {
	var f seqFollower
	for {
		err := r.ndjsonOnce(&f)
		if errors.Is(err, errTooSlow) && r.ctx.Err() == nil {
			r.resumes[kindNDJSON].Add(1)
			continue
		}
		if err != nil && !r.over(err) && !errors.Is(err, context.DeadlineExceeded) {
			r.errs.add("NDJSON subscription: %v", err)
		}
		return
	}
}

// ndjsonOnce is one NDJSON subscription from f's cursor until it ends.
func (r *loadRun) ndjsonOnce(f *seqFollower) error {
	u := r.g.baseURL() + "/v1/events:subscribe"
	if c := f.cursor(); c != nil {
		u += "?cursor=" + strconv.FormatUint(*c, 10)
	}
	req, err := http.NewRequestWithContext(r.ctx, "GET", u, nil)
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("subscribe: HTTP %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var line struct {
			Result *eventKey
			Error  *rpcStatus
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("event line %q: %v", sc.Bytes(), err)
		}
		if line.Error != nil {
			return ndjsonStreamError(*line.Error)
		}
		if line.Result == nil || line.Result.Seq == 0 {
			continue
		}
		if ok, err := f.see(line.Result.Seq); err != nil {
			return fmt.Errorf("NDJSON: %v", err)
		} else if ok {
			r.ops[kindNDJSON].Add(1)
		}
	}
	return sc.Err()
}

// ndjsonStreamError is errTooSlow for the documented ConsumerTooSlow error
// line (ResourceExhausted, ErrorInfo reason ConsumerTooSlow), else an error
// quoting the line.
func ndjsonStreamError(s rpcStatus) error {
	if s.Code == int(codes.ResourceExhausted) && slices.Contains(s.reasons(), "ConsumerTooSlow") {
		return errTooSlow
	}
	return fmt.Errorf("event stream error: code %d %q reasons %v", s.Code, s.Message, s.reasons())
}

// followWebSocket follows the log over WebSocket for the whole run,
// resuming after a ConsumerTooSlow error frame.
func (r *loadRun) followWebSocket() {
	var f seqFollower
	for {
		err := r.wsOnce(&f)
		if errors.Is(err, errTooSlow) && r.ctx.Err() == nil {
			r.resumes[kindWebSocket].Add(1)
			continue
		}
		if err != nil && !r.over(err) {
			r.errs.add("WebSocket: %v", err)
		}
		return
	}
}

// wsOnce is one WebSocket subscription from f's cursor until it ends.
func (r *loadRun) wsOnce(f *seqFollower) error {
	u := "ws://" + r.g.httpAddr + "/v1/events/ws"
	if c := f.cursor(); c != nil {
		u += "?cursor=" + strconv.FormatUint(*c, 10)
	}
	c, _, err := websocket.Dial(r.ctx, u, nil)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(8 << 20)
	for {
		_, msg, err := c.Read(r.ctx)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		seq, err := wsFrameSeq(msg)
		if err != nil {
			return err
		}
		if seq == 0 { // an #info frame
			continue
		}
		if ok, err := f.see(seq); err != nil {
			return fmt.Errorf("WebSocket: %v", err)
		} else if ok {
			r.ops[kindWebSocket].Add(1)
		}
	}
}

// wsFrameSeq decodes a frame: CBOR {op, t} then the payload. A message
// frame (op 1) gives its seq; the ConsumerTooSlow error frame (op -1) is
// errTooSlow; anything else is an error.
func wsFrameSeq(msg []byte) (uint64, error) {
	dec := cbor.NewDecoder(bytes.NewReader(msg))
	var hdr struct {
		Op int `cbor:"op"`
	}
	if err := dec.Decode(&hdr); err != nil {
		return 0, fmt.Errorf("frame header: %v (% x)", err, msg[:min(len(msg), 64)])
	}
	var p struct {
		Seq     uint64 `cbor:"seq"`
		Error   string `cbor:"error"`
		Message string `cbor:"message"`
	}
	if err := dec.Decode(&p); err != nil {
		return 0, fmt.Errorf("frame op %d payload: %v (% x)", hdr.Op, err, msg[:min(len(msg), 64)])
	}
	switch {
	case hdr.Op == 1:
		return p.Seq, nil
	case hdr.Op == -1 && p.Error == "ConsumerTooSlow":
		return 0, errTooSlow
	}
	return 0, fmt.Errorf("frame op %d error %q message %q seq %d, want an event or ConsumerTooSlow", hdr.Op, p.Error, p.Message, p.Seq)
}

// TestLoadSubscriberRules: the load's subscribers accept exactly the
// documented ConsumerTooSlow forms (NDJSON error line, WebSocket error
// frame) as a reason to resume, and their seq check refuses a gap, a
// duplicate and a resumption that does not replay the cursor's event.
func TestLoadSubscriberRules(t *testing.T) {
	var f seqFollower
	if f.cursor() != nil {
		t.Fatal("a subscriber without events must subscribe live (no cursor)")
	}
	for _, seq := range []uint64{7, 8, 9} {
		if ok, err := f.see(seq); !ok || err != nil {
			t.Fatalf("seq %d: %v %v", seq, ok, err)
		}
	}
	if c := f.cursor(); c == nil || *c != 9 {
		t.Fatalf("resume cursor %v, want the last seq processed (9)", c)
	}
	if ok, err := f.see(9); ok || err != nil {
		t.Fatalf("replayed cursor event: processed %v, err %v; want skipped", ok, err)
	}
	if ok, err := f.see(10); !ok || err != nil {
		t.Fatalf("seq 10 after the resume: %v %v", ok, err)
	}
	if _, err := f.see(12); err == nil {
		t.Error("a gap (10 then 12) was accepted")
	}
	g := seqFollower{last: 5}
	if _, err := g.see(5); err == nil {
		t.Error("a duplicate (5 after 5) was accepted")
	}
	g.cursor()
	if _, err := g.see(6); err == nil {
		t.Error("a resumption with cursor 5 that starts at 6 was accepted (the cursor is inclusive)")
	}

	tooSlow := rpcStatus{Code: int(codes.ResourceExhausted), Message: "ConsumerTooSlow: ...", Details: []map[string]any{{"reason": "ConsumerTooSlow"}}}
	if err := ndjsonStreamError(tooSlow); !errors.Is(err, errTooSlow) {
		t.Errorf("NDJSON ConsumerTooSlow line: %v", err)
	}
	other := rpcStatus{Code: int(codes.Internal), Message: "boom", Details: []map[string]any{{"reason": "ConsumerTooSlow"}}}
	if err := ndjsonStreamError(other); errors.Is(err, errTooSlow) {
		t.Error("an Internal error line was taken for ConsumerTooSlow")
	}

	frame := func(hdr, payload any) []byte {
		h, _ := cbor.Marshal(hdr)
		p, _ := cbor.Marshal(payload)
		return append(h, p...)
	}
	if seq, err := wsFrameSeq(frame(map[string]any{"op": 1, "t": "#status"}, map[string]any{"seq": 42, "time": "x"})); seq != 42 || err != nil {
		t.Errorf("message frame: seq %d, %v", seq, err)
	}
	if _, err := wsFrameSeq(frame(map[string]any{"op": -1}, map[string]any{"error": "ConsumerTooSlow", "message": "m"})); !errors.Is(err, errTooSlow) {
		t.Errorf("ConsumerTooSlow error frame: %v", err)
	}
	if _, err := wsFrameSeq(frame(map[string]any{"op": -1}, map[string]any{"error": "FutureCursor"})); err == nil || errors.Is(err, errTooSlow) {
		t.Errorf("FutureCursor error frame: %v, want a plain error", err)
	}
	if _, err := wsFrameSeq([]byte{0xff}); err == nil {
		t.Error("a garbage frame was accepted")
	}
}
