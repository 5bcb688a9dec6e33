package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scale-out (issue 15, docs/scale-out.md "End-to-end evidence"): three
// `gateway serve --store postgres://...` replicas and two `gateway peer`
// processes on one throwaway PostgreSQL cluster (scripts/pg-throwaway.sh).
// 300 documents are submitted round-robin over the replicas, alternating
// REST (curl) and gRPC (grpcurl), small and multi-chunk; one replica and
// one peer get
// SIGKILL mid-run. Then every acknowledged document is SUCCEEDED with a
// byte-identical result downloaded through a surviving replica, the
// subscriber of every replica saw the same gapless seq sequence (the
// killed replica's a prefix of it), and 30 concurrent redemptions of one
// claim spread over the surviving replicas give exactly one success.

const (
	scaleDocs      = 300
	scaleReplicas  = 3
	scaleKillAfter = 100 // acknowledged documents before the kills
	scaleRESTBatch = 5   // REST documents per curl process (--next)
	scaleWorkers   = 4   // concurrent client processes
	scaleRedeems   = 30
	scaleVictim    = 2 // the replica killed mid-run
	scalePeerVic   = 1 // the peer killed mid-run
)

// scaleDoc is one submission: its request and, once acknowledged, its id.
type scaleDoc struct {
	i        int
	rest     bool
	upload   bool   // REST POST :upload (streamed) rather than inline JSON
	body     []byte // the request body (JSON, or the raw upload)
	query    string // the :upload query (split options)
	input    []byte // the content: the result must equal it
	replica  int    // the replica it was sent to (round-robin, a live one)
	deferred bool   // the fault processor defers it with a claim check
	id       string
}

// seqSub is one replica's event subscriber (REST NDJSON from cursor 0).
type seqSub struct {
	mu   sync.Mutex
	evs  []eventKey
	err  error
	done chan struct{}
}

func (s *seqSub) snapshot() []eventKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]eventKey(nil), s.evs...)
}

// scaleRig is the cluster of TestScaleOut and what the run recorded.
type scaleRig struct {
	t     *testing.T
	db    *pgx.Conn
	peers []*proc
	gws   []*gatewayProc
	subs  []*seqSub
	dir   string
	// curlBin and grpcurlBin are the clients, found by submitAll.
	curlBin, grpcurlBin string

	mu       sync.Mutex
	acked    []*scaleDoc
	unack    int // submissions that got no acknowledgement (the killed replica)
	redeemed int // claims of deferred documents redeemed
	ackCh    chan struct{}
	killed   time.Time
	// killing is set before the victim is sent SIGKILL: its clients may
	// see their connection drop before the harness has reaped it.
	killing bool
}

func TestScaleOut(t *testing.T) {
	start := time.Now()
	r := newScaleRig(t)
	for i := range r.gws {
		r.subscribe(i)
	}
	docs := scaleWorkload(t)
	type takeover struct {
		victims    []string
		first, all time.Duration
	}
	killDone := make(chan takeover, 1)
	killed := make(chan struct{})
	// A test that fails before the kill still waits for the killer, which
	// may report (t.Errorf) only later: never after the test completed.
	t.Cleanup(func() { <-killed })
	go func() {
		defer close(killed)
		var to takeover
		to.victims = r.killMidRun()
		to.first, to.all = r.measureTakeover(to.victims)
		killDone <- to
	}()
	submitStart := time.Now()
	r.submitAll(docs)
	submitted := time.Since(submitStart)
	to := <-killDone
	if t.Failed() {
		t.FailNow()
	}
	victims, first, all := to.victims, to.first, to.all
	r.awaitTerminal(90 * time.Second)
	processed := time.Since(submitStart)
	r.checkResults()
	r.checkPeerLoss()
	r.redeemRace()
	n := r.checkSequences()

	t.Logf("%d documents acknowledged (%d submissions unacknowledged: sent to the killed replica), %d REST in batches of %d per curl, the rest one grpcurl each; %d claims of deferred documents redeemed",
		len(r.acked), r.unack, r.countREST(), scaleRESTBatch, r.redeemed)
	t.Logf("submitted in %v (%.0f docs/s); all terminal %v after the first submission (%.0f docs/s end to end)",
		submitted.Round(10*time.Millisecond), float64(len(r.acked))/submitted.Seconds(),
		processed.Round(10*time.Millisecond), float64(len(r.acked))/processed.Seconds())
	t.Logf("takeover after kill -9 of replica %d: %d of its documents in flight; first taken over %v, all %v after the kill",
		scaleVictim, len(victims), first.Round(100*time.Millisecond), all.Round(100*time.Millisecond))
	t.Logf("event sequence 1..%d identical on every subscriber; wall time %v", n, time.Since(start).Round(100*time.Millisecond))
}

// newScaleRig starts the database, two peers and three replicas using both.
func newScaleRig(t *testing.T) *scaleRig {
	dsn := startPostgres(t)
	r := &scaleRig{t: t, dir: t.TempDir(), ackCh: make(chan struct{}, scaleDocs)}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	r.db = conn
	args := []string{"--store", dsn, "--rate-limit", "0", "--max-uploads-per-tenant", "0", "--max-subscribers-per-tenant", "0"}
	for range 2 {
		addr, cert, p := startPeer(t)
		r.peers = append(r.peers, p)
		args = append(args, "--peer", addr, "--peer-ca", cert)
	}
	for range scaleReplicas {
		r.gws = append(r.gws, startGateway(t, gwOpts{args: args}))
	}
	return r
}

// subscribe follows replica i's event stream from cursor 0 until the
// replica dies or the test ends.
func (r *scaleRig) subscribe(i int) {
	s := &seqSub{done: make(chan struct{})}
	r.subs = append(r.subs, s)
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(func() { cancel(); <-s.done })
	var zero uint64
	go func() {
		defer close(s.done)
		err := followEvents(ctx, r.gws[i].baseURL(), &zero, func(ev eventKey) {
			s.mu.Lock()
			s.evs = append(s.evs, ev)
			s.mu.Unlock()
		})
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}()
}

// scaleWorkload builds the 300 submissions: replica i%3, REST and gRPC
// alternating every three documents (so each replica gets both clients),
// and by i%10: a deferred one (the fault processor defers it with a claim
// check: it is in flight, on a replica and at a peer, until the claim is
// redeemed, so the kills certainly hit documents mid-way), multi-chunk inline documents (24 KiB in
// 4 KiB chunks), a streamed multi-chunk upload (320 KiB in 64 KiB chunks,
// REST) and small ones.
func scaleWorkload(t *testing.T) []*scaleDoc {
	docs := make([]*scaleDoc, scaleDocs)
	for i := range docs {
		d := &scaleDoc{i: i, rest: (i/scaleReplicas)%2 == 0, replica: i % scaleReplicas}
		var req map[string]any
		switch k := i % 10; {
		case k == 0:
			d.deferred = true
			d.input = []byte(fmt.Sprintf("deferred document %d: in flight until its claim is redeemed\n", i))
			req = deferredDoc(d.input, 5*time.Minute, nil, nil)
		case k == 5 && d.rest:
			d.upload, d.input = true, binaryData(320<<10, uint64(i))
			d.query = "?split.strategy=fixed_bytes&split.chunkBytes=65536"
		case k == 1 || k == 4 || k == 5 || k == 7:
			d.input = binaryData(24<<10, uint64(i))
			req = map[string]any{"content": b64(d.input), "contentType": "application/octet-stream",
				"split": map[string]any{"strategy": "SPLIT_FIXED_BYTES", "chunkBytes": 4096}}
		default:
			d.input = []byte(strings.Repeat(fmt.Sprintf("small document %d. ", i), 1+i%17))
			req = map[string]any{"content": b64(d.input), "contentType": "text/plain"}
		}
		if d.upload {
			d.body = d.input
		} else {
			d.body = mustJSON(t, req)
		}
		docs[i] = d
	}
	return docs
}

// scaleJob is one client process: a batch of REST documents for one
// replica, or one gRPC document.
type scaleJob []*scaleDoc

// jobs groups docs into client processes, in submission order.
func scaleJobs(docs []*scaleDoc) []scaleJob {
	var out []scaleJob
	pending := make([]scaleJob, scaleReplicas)
	for _, d := range docs {
		if !d.rest {
			out = append(out, scaleJob{d})
			continue
		}
		pending[d.replica] = append(pending[d.replica], d)
		if len(pending[d.replica]) == scaleRESTBatch {
			out, pending[d.replica] = append(out, pending[d.replica]), nil
		}
	}
	for _, p := range pending {
		if len(p) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// submitAll runs the jobs on scaleWorkers concurrent client processes.
// The tools are found here, on the test's goroutine (need fails the test
// when one is missing); a worker reports a client that cannot run with
// t.Error and stops every worker and the sender, so that a missing tool or
// a dead process ends the run at once instead of blocking the sender.
func (r *scaleRig) submitAll(docs []*scaleDoc) {
	r.curlBin, r.grpcurlBin = need(r.t, toolCurl), need(r.t, toolGrpcurl)
	jobs := make(chan scaleJob)
	stop := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range scaleWorkers {
		wg.Go(func() {
			for j := range jobs {
				if err := r.runJob(j); err != nil {
					r.t.Error(err)
					once.Do(func() { close(stop) })
					return
				}
			}
		})
	}
send:
	for _, j := range scaleJobs(docs) {
		select {
		case jobs <- j:
		case <-stop:
			break send
		}
	}
	close(jobs)
	wg.Wait()
}

// live returns replica i, or the next live one when i was killed.
func (r *scaleRig) live(i int) int {
	for k := range scaleReplicas {
		if j := (i + k) % scaleReplicas; !r.gws[j].proc.exited() {
			return j
		}
	}
	return -1
}

// runJob submits one job on a worker goroutine; an error means a client
// could not run at all (the submissions' answers are checked by ack).
func (r *scaleRig) runJob(j scaleJob) error {
	g := r.live(j[0].replica)
	if g < 0 {
		return errors.New("no live replica")
	}
	for _, d := range j {
		d.replica = g
	}
	if j[0].rest {
		return r.submitCurl(j, r.gws[g])
	}
	return r.submitGrpcurl(j[0], r.gws[g])
}

// submitCurl sends a batch of documents with one curl process: one
// transfer per document (--next), each with its own output file and its
// status on its own -w line.
func (r *scaleRig) submitCurl(j scaleJob, g *gatewayProc) error {
	dir, err := os.MkdirTemp(r.dir, "curl-")
	if err != nil {
		return err
	}
	var args []string
	for k, d := range j {
		in, out := filepath.Join(dir, fmt.Sprintf("in%d", k)), filepath.Join(dir, fmt.Sprintf("out%d", k))
		if err := os.WriteFile(in, d.body, 0o600); err != nil {
			return err
		}
		url, ct := g.baseURL()+"/v1/documents", "application/json"
		if d.upload {
			url, ct = g.baseURL()+"/v1/documents:upload"+d.query, "application/octet-stream"
		}
		if k > 0 {
			args = append(args, "--next")
		}
		args = append(args, "-sS", "--max-time", "60", "-X", "POST", "-H", "Content-Type: "+ct,
			"--data-binary", "@"+in, "-o", out, "-w", "%{http_code}\n", url)
	}
	stdout, stderr, _, err := runE(clientTimeout, nil, r.curlBin, args...)
	if err != nil {
		return err
	}
	codes := strings.Fields(string(stdout))
	for k, d := range j {
		body, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("out%d", k)))
		ok := k < len(codes) && codes[k] == "200"
		if !ok {
			body = fmt.Appendf(body, " (curl: HTTP %s; %s)", strings.Join(codes, ","), stderr) // curl says why on stderr
		}
		r.ack(d, ok, body, g)
	}
	return nil
}

// submitGrpcurl sends one document with grpcurl (SubmitDocument, the JSON
// request on stdin).
func (r *scaleRig) submitGrpcurl(d *scaleDoc, g *gatewayProc) error {
	stdout, stderr, code, err := runE(clientTimeout, d.body, r.grpcurlBin,
		"-plaintext", "-max-time", "60", "-d", "@", g.grpcAddr, "pipestream.gateway.v1.DocumentService/SubmitDocument")
	if err != nil {
		return err
	}
	if code != 0 {
		stdout = append(stdout, stderr...) // grpcurl says why on stderr
	}
	r.ack(d, code == 0, stdout, g)
	return nil
}

// ack records an acknowledged document (a 200 / exit 0 with a document
// id); a failed submission is fine only when its replica was killed.
func (r *scaleRig) ack(d *scaleDoc, ok bool, body []byte, g *gatewayProc) {
	var doc struct{ Id string }
	if ok && json.Unmarshal(body, &doc) == nil && doc.Id != "" {
		d.id = doc.Id
		r.mu.Lock()
		r.acked = append(r.acked, d)
		r.mu.Unlock()
		r.ackCh <- struct{}{}
		return
	}
	r.mu.Lock()
	r.unack++
	victim := r.killing && g == r.gws[scaleVictim]
	r.mu.Unlock()
	if !victim && !g.proc.exited() {
		r.t.Errorf("document %d through live replica %d not acknowledged: %.300s", d.i, d.replica, body)
	}
}

// killMidRun waits for scaleKillAfter acknowledgements, then SIGKILLs
// replica scaleVictim and peer scalePeerVic at once. It returns the ids
// of the killed replica's documents that were not terminal at the kill:
// the ones another replica must take over.
func (r *scaleRig) killMidRun() []string {
	timeout := time.After(time.Minute)
	for range scaleKillAfter {
		select {
		case <-r.ackCh:
		case <-timeout:
			r.t.Errorf("fewer than %d documents acknowledged within a minute: no kill", scaleKillAfter)
			return nil
		}
	}
	r.mu.Lock()
	r.killing = true
	r.mu.Unlock()
	r.gws[scaleVictim].proc.kill()
	r.peers[scalePeerVic].kill()
	r.mu.Lock()
	r.killed = time.Now()
	var mine []string
	for _, d := range r.acked {
		if d.replica == scaleVictim {
			mine = append(mine, d.id)
		}
	}
	r.mu.Unlock()
	var open []string
	if err := r.db.QueryRow(context.Background(),
		"SELECT coalesce(array_agg(id), '{}') FROM documents WHERE id = ANY($1) AND NOT terminal", mine).Scan(&open); err != nil {
		r.t.Errorf("documents of the killed replica: %v", err)
	}
	if len(open) == 0 {
		r.t.Errorf("none of the %d documents acknowledged by replica %d was in flight at its kill: nothing to take over", len(mine), scaleVictim)
	}
	return open
}

// measureTakeover polls the database until every document the killed
// replica drove has a new lease holder (epoch >= 2), and returns the time
// from the kill to the first and to the last takeover. Bound: lease 10 s
// + scan 2 s (docs/scale-out.md), with 3 s of slack for this machine. It
// runs while the submissions go on (not the test's goroutine: it reports
// with Errorf).
func (r *scaleRig) measureTakeover(ids []string) (first, all time.Duration) {
	deadline := r.killed.Add(15 * time.Second)
	for {
		var taken int
		if err := r.db.QueryRow(context.Background(),
			"SELECT count(*) FROM documents WHERE id = ANY($1) AND lease_epoch >= 2", ids).Scan(&taken); err != nil {
			r.t.Errorf("takeover: %v", err)
			return first, 0
		}
		if taken > 0 && first == 0 {
			first = time.Since(r.killed)
		}
		if taken == len(ids) {
			return first, time.Since(r.killed)
		}
		if time.Now().After(deadline) {
			r.t.Errorf("%d of the killed replica's %d documents taken over within 15 s of the kill", taken, len(ids))
			return first, 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *scaleRig) ackedIDs() []string {
	ids := make([]string, len(r.acked))
	for i, d := range r.acked {
		ids[i] = d.id
	}
	return ids
}

func (r *scaleRig) countREST() (n int) {
	for _, d := range r.acked {
		if d.rest {
			n++
		}
	}
	return n
}

// awaitTerminal polls the database until every acknowledged document is
// terminal, redeeming the ISSUED claims of the deferred ones meanwhile
// (after a takeover or a lost peer session the new attempt is deferred
// again; an earlier claim still resumes it, docs/scale-out.md).
func (r *scaleRig) awaitTerminal(within time.Duration) {
	ids := r.ackedIDs()
	deadline := time.Now().Add(within)
	for {
		var open []string
		if err := r.db.QueryRow(context.Background(),
			"SELECT coalesce(array_agg(id), '{}') FROM documents WHERE id = ANY($1) AND NOT terminal", ids).Scan(&open); err != nil {
			r.t.Fatal(err)
		}
		if len(open) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d acknowledged documents not terminal within %v: %v", len(open), len(ids), within, open[:min(len(open), 10)])
		}
		r.redeemIssued(open)
		time.Sleep(200 * time.Millisecond)
	}
}

// redeemIssued tries every ISSUED claim of the documents ids through each
// surviving replica until one accepts it. Refusals are expected here (the
// replica does not drive the document, or its peer is gone and the
// document waits for re-dispatch): the loop comes back.
func (r *scaleRig) redeemIssued(ids []string) {
	var claims []string
	if err := r.db.QueryRow(context.Background(),
		"SELECT coalesce(array_agg(claim_id), '{}') FROM claims WHERE doc_id = ANY($1) AND state = 1", ids).Scan(&claims); err != nil {
		r.t.Fatal(err)
	}
	ctx := ctxT(r.t, time.Minute)
	for _, c := range claims {
		for _, g := range r.survivors() {
			if st, _, err := doJSON(ctx, "POST", redeemURL(g, c), []byte("{}"), "application/json"); err == nil && st == 200 {
				r.mu.Lock()
				r.redeemed++
				r.mu.Unlock()
				break
			}
		}
	}
}

// checkPeerLoss: the killed peer held documents of a surviving replica
// (deferred ones stay there until redeemed), and that replica noticed the
// lost session and dispatched them again (to the other peer: the only
// one left; they all ended SUCCEEDED, checkResults).
func (r *scaleRig) checkPeerLoss() {
	for _, g := range r.survivors() {
		if g.proc.logContains("session ended with documents in flight; re-dispatching") {
			return
		}
	}
	r.t.Errorf("no surviving replica logged re-dispatching documents of the killed peer's session")
}

// survivors are the replicas that were not killed.
func (r *scaleRig) survivors() []*gatewayProc {
	var out []*gatewayProc
	for i, g := range r.gws {
		if i != scaleVictim {
			out = append(out, g)
		}
	}
	return out
}

// checkResults reads every acknowledged document and its result through a
// surviving replica (alternating; often not the one it was submitted to):
// SUCCEEDED, and the result byte-identical to the input.
func (r *scaleRig) checkResults() {
	ctx := ctxT(r.t, 2*time.Minute)
	sv := r.survivors()
	for k, d := range r.acked {
		base := sv[k%len(sv)].baseURL() + "/v1/documents/" + d.id
		st, b, err := doJSON(ctx, "GET", base, nil, "")
		var doc docJSON
		if err != nil || st != 200 || json.Unmarshal(b, &doc) != nil {
			r.t.Errorf("GET %s: %d %v %.300s", base, st, err, b)
			continue
		}
		if doc.State != "SUCCEEDED" {
			r.t.Errorf("document %d (%s, via replica %d) ended %s: %s", d.i, d.id, d.replica, doc.State, doc.Error)
			continue
		}
		st, out, err := doJSON(ctx, "GET", base+"/result", nil, "")
		if err != nil || st != 200 || !bytes.Equal(out, d.input) {
			r.t.Errorf("result of document %d (%s): HTTP %d %v, %d bytes (sha256 %s), want the %d input bytes (sha256 %s)",
				d.i, d.id, st, err, len(out), sha256Hex(out), len(d.input), sha256Hex(d.input))
		}
	}
}

// redeemRace defers one document (a claim check from the surviving peer)
// and redeems its claim 30 times at once, one curl each, spread over the
// surviving replicas: exactly one succeeds, whichever replica it went
// through, every other one is a FailedPrecondition (HTTP 400)
// CLAIM_ALREADY_REDEEMED, and the document finishes with its input as the
// result.
func (r *scaleRig) redeemRace() {
	t := r.t
	sv := r.survivors()
	in := []byte("one claim, thirty redemptions, three replicas")
	d := submitREST(t, sv[0], deferredDoc(in, 5*time.Minute, nil, nil))
	claim := awaitClaims(t, sv[0], d.GetId(), 1).GetClaimChecks()[0].GetClaimId()
	resps := make([]httpResp, scaleRedeems)
	var wg sync.WaitGroup
	curlBin := need(t, toolCurl)
	for i := range scaleRedeems {
		wg.Go(func() {
			r, err := curlE(curlBin, "POST", redeemURL(sv[i%len(sv)], claim), []byte("{}"), "-H", "Content-Type: application/json")
			if err != nil {
				t.Errorf("redemption %d: %v", i, err)
			}
			resps[i] = r
		})
	}
	wg.Wait()
	won, reasons := 0, map[string]int{}
	for i, resp := range resps {
		if resp.status == 200 {
			won++
			continue
		}
		var st rpcStatus
		if resp.status != 400 || json.Unmarshal(resp.body, &st) != nil || st.Code != 9 || !slices.Contains(st.reasons(), "CLAIM_ALREADY_REDEEMED") {
			t.Errorf("redemption %d (replica %s): want 200 or 400 FailedPrecondition CLAIM_ALREADY_REDEEMED, got %s", i, sv[i%len(sv)].httpAddr, resp)
			continue
		}
		reasons[strings.Join(st.reasons(), ",")+": "+firstWords(st.Message, 12)]++
	}
	if won != 1 {
		t.Errorf("%d of %d concurrent redemptions of claim %s succeeded, want exactly 1", won, scaleRedeems, claim)
	}
	t.Logf("%d concurrent redemptions of claim %s over %d replicas: %d succeeded; refusals: %v", scaleRedeems, claim, len(sv), won, reasons)
	fin := awaitREST(t, sv[1], d.GetId())
	if out := resultREST(t, sv[1], d.GetId()).body; fin.GetState().String() != "SUCCEEDED" || !bytes.Equal(out, in) {
		t.Errorf("redeemed document: %v, result %q, want SUCCEEDED with %q", fin.GetState(), out, in)
	}
}

func firstWords(s string, n int) string {
	w := strings.Fields(s)
	return strings.Join(w[:min(n, len(w))], " ")
}

// checkSequences waits until the surviving subscribers reached the
// database's last seq, then checks that each saw 1..N in order, once each,
// with the same events, and that the killed replica's subscriber saw a
// prefix of it. It returns N.
func (r *scaleRig) checkSequences() int {
	var last int
	if err := r.db.QueryRow(context.Background(), "SELECT last_seq FROM meta").Scan(&last); err != nil {
		r.t.Fatal(err)
	}
	for i, s := range r.subs {
		if i == scaleVictim {
			continue
		}
		waitFor(r.t, fmt.Sprintf("replica %d's subscriber to reach seq %d", i, last), 30*time.Second, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.err != nil {
				r.t.Fatalf("replica %d's subscriber ended: %v", i, s.err)
			}
			return len(s.evs) >= last
		})
	}
	ref := r.subs[0].snapshot()
	for i, s := range r.subs {
		evs := s.snapshot()
		if i != scaleVictim && len(evs) < last || len(evs) == 0 {
			r.t.Errorf("replica %d's subscriber saw %d events, want at least %d", i, len(evs), last)
		}
		for k, ev := range evs {
			if ev.Seq != uint64(k+1) {
				r.t.Errorf("replica %d's subscriber: event %d has seq %d, want %d (a gap or a duplicate)", i, k, ev.Seq, k+1)
				break
			}
			if k < len(ref) && ev != ref[k] {
				r.t.Errorf("seq %d differs between subscribers: replica 0 saw %+v, replica %d %+v", ev.Seq, ref[k], i, ev)
				break
			}
		}
	}
	r.t.Logf("killed replica's subscriber saw seqs 1..%d before its death", len(r.subs[scaleVictim].snapshot()))
	return last
}
