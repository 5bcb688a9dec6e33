package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Crash safety (docs/architecture.md, "Where state lives"): documents are submitted continuously
// while the gateway is SIGKILLed at random points and restarted on the
// same data dir. Afterwards every acknowledged document exists exactly
// once and is terminal with intact results, event seqs never repeat (every
// event a live subscriber saw is the event a cursor=0 replay shows at that
// seq), and every claim redeems exactly once.

var httpc = &http.Client{Timeout: 30 * time.Second}

// doJSON sends body (nil: none) and returns status and response body.
func doJSON(ctx context.Context, method, url string, body []byte, contentType string) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// docJSON is the part of a Document JSON the crash checks read.
type docJSON struct {
	Id          string
	State       string
	Error       string
	ClaimChecks []struct {
		ClaimId string
		State   string
	}
}

func terminalState(s string) bool {
	switch s {
	case "SUCCEEDED", "PARTIALLY_SUCCEEDED", "FAILED", "CANCELLED":
		return true
	}
	return false
}

// eventKey identifies an event's content for the seq comparison.
type eventKey struct {
	Seq        uint64 `json:"seq,string"`
	DocumentId string `json:"documentId"`
	Kind       string `json:"kind"`
	Rev        string `json:"rev"`
	ClaimId    string `json:"claimId"`
	State      string `json:"state"`
}

// followEvents subscribes with cursor (nil: live only) and hands every
// event to fn until ctx ends or the stream breaks (a crash).
func followEvents(ctx context.Context, base string, cursor *uint64, fn func(eventKey)) error {
	u := base + "/v1/events:subscribe"
	if cursor != nil {
		u += fmt.Sprintf("?cursor=%d", *cursor)
	}
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{}).Do(req)
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
		var env struct {
			Result *eventKey
			Error  json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &env); err != nil {
			return fmt.Errorf("event line %q: %v", sc.Bytes(), err)
		}
		if env.Error != nil {
			return fmt.Errorf("event stream error: %s", env.Error)
		}
		if env.Result != nil && env.Result.Seq > 0 {
			fn(*env.Result)
		}
	}
	return sc.Err()
}

type ackDoc struct {
	id       string
	input    []byte
	deferred bool
}

func TestCrashSafety(t *testing.T) {
	const (
		writers = 4
		kills   = 4
	)
	r := &crashRun{t: t, live: map[uint64]eventKey{}, stop: make(chan struct{})}
	g := startGateway(t, gwOpts{args: []string{"--rate-limit", "0", "--max-uploads-per-tenant", "0"}})
	r.cur.Store(g)
	r.subscribe(g)
	for w := range writers {
		r.wg.Go(func() { r.writer(w) })
	}
	r.killAndRestart(kills)
	time.Sleep(time.Second) // the subject: the last lifetime takes submissions too
	close(r.stop)
	r.wg.Wait()

	base := r.cur.Load().baseURL()
	ctx := ctxT(t, 3*time.Minute)
	all := r.listedOnce(ctx, base)
	done := r.redeemUntilTerminal(ctx, base, all)
	r.checkResults(ctx, base)
	replayed, first, latest := r.checkEventSeqs(ctx, base)
	t.Logf("%d events replayed (seqs %d-%d; older ones pruned by retention), %d seen live across %d lifetimes, %d documents redeemed", replayed, first, latest, len(r.live), kills+1, done)
}

// crashRun is TestCrashSafety's state: the current gateway lifetime, the
// acknowledged submissions and what the live subscribers saw.
type crashRun struct {
	t    *testing.T
	cur  atomic.Pointer[gatewayProc]
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	acked   []ackDoc
	live    map[uint64]eventKey // every event a live subscriber saw, by seq
	liveDup []string
}

// subscribe runs a live subscriber for the lifetime of gp.
func (r *crashRun) subscribe(gp *gatewayProc) {
	r.wg.Go(func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-r.stop:
			case <-gp.proc.done:
			}
			cancel()
		}()
		_ = followEvents(ctx, gp.baseURL(), nil, func(ev eventKey) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if old, ok := r.live[ev.Seq]; ok && old != ev {
				r.liveDup = append(r.liveDup, fmt.Sprintf("seq %d was %+v, then %+v", ev.Seq, old, ev))
			}
			r.live[ev.Seq] = ev
		})
	})
}

// writer submits documents to whichever gateway lifetime is current until
// stop, recording every acknowledged one.
func (r *crashRun) writer(w int) {
	rng := rand.New(rand.NewPCG(uint64(w), 77))
	for i := 0; ; i++ {
		select {
		case <-r.stop:
			return
		default:
		}
		ack, status, body, err := r.submit(rng, w, i)
		if err != nil || status != 200 {
			if err == nil && status != 503 {
				r.t.Errorf("submit: HTTP %d %s (only a crash may refuse a submission)", status, body)
			}
			time.Sleep(20 * time.Millisecond) // the gateway is down: retry soon
			continue
		}
		var d docJSON
		if json.Unmarshal(body, &d) != nil || d.Id == "" {
			r.t.Errorf("submit answered 200 without an id: %s", body)
			continue
		}
		ack.id = d.Id
		r.mu.Lock()
		r.acked = append(r.acked, ack)
		r.mu.Unlock()
	}
}

// submit sends writer w's i-th document: small inline, a larger upload or
// a deferred one, in turn.
func (r *crashRun) submit(rng *rand.Rand, w, i int) (ack ackDoc, status int, body []byte, err error) {
	gp := r.cur.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch i % 4 {
	case 0, 1: // small inline
		ack.input = []byte(fmt.Sprintf("writer %d doc %d %x", w, i, rng.Uint64()))
		status, body, err = doJSON(ctx, "POST", gp.baseURL()+"/v1/documents",
			jsonOf(map[string]any{"content": b64(ack.input), "contentType": "text/plain"}), "application/json")
	case 2: // larger upload, dehydrated into 128 KiB chunks
		ack.input = binaryData(256<<10+rng.IntN(768<<10), rng.Uint64())
		status, body, err = doJSON(ctx, "POST", gp.baseURL()+"/v1/documents:upload?split.strategy=fixed_bytes&split.chunkBytes=131072",
			ack.input, "application/octet-stream")
	case 3: // deferred: a claim check to redeem at the end
		ack.input, ack.deferred = []byte(fmt.Sprintf("deferred %d/%d", w, i)), true
		status, body, err = doJSON(ctx, "POST", gp.baseURL()+"/v1/documents",
			jsonOf(deferredDoc(ack.input, 10*time.Minute, nil, nil)), "application/json")
	}
	return ack, status, body, err
}

// killAndRestart SIGKILLs the gateway kills times at random moments while
// the writers run, restarting it on the same data each time.
func (r *crashRun) killAndRestart(kills int) {
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range kills {
		time.Sleep(time.Duration(800+rng.IntN(1700)) * time.Millisecond) // the subject: a crash at a random moment
		gp := r.cur.Load()
		gp.proc.kill()
		r.mu.Lock()
		n := len(r.acked)
		r.mu.Unlock()
		r.t.Logf("kill %d: SIGKILLed the gateway with %d documents acknowledged so far", k+1, n)
		ng := gp.restart(r.t)
		r.cur.Store(ng)
		r.subscribe(ng)
	}
}

// listedOnce lists every document in the store and checks each
// acknowledged one is listed exactly once.
func (r *crashRun) listedOnce(ctx context.Context, base string) []docJSON {
	t := r.t
	seen := map[string]int{}
	var all []docJSON
	for token := ""; ; {
		st, b, err := doJSON(ctx, "GET", base+"/v1/documents?pageSize=1000&pageToken="+token, nil, "")
		if err != nil || st != 200 {
			t.Fatalf("list: %d %v %s", st, err, b)
		}
		var page struct {
			Documents     []docJSON
			NextPageToken string
		}
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Documents {
			seen[d.Id]++
			all = append(all, d)
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	for _, a := range r.acked {
		if seen[a.id] != 1 {
			t.Errorf("acknowledged document %s is listed %d times, want exactly once", a.id, seen[a.id])
		}
	}
	t.Logf("%d acknowledged documents, %d in the store", len(r.acked), len(all))
	return all
}

// redeemer redeems every issued claim once (a replay is refused).
type redeemer struct {
	t        *testing.T
	base     string
	redeemed map[string]bool // claims tried
	done     map[string]bool // documents with a successful redemption
	refused  int             // ISSUED claims whose redemption was refused
}

// redeemUntilTerminal redeems claims until every document is terminal and
// returns how many documents a redemption finished.
func (r *crashRun) redeemUntilTerminal(ctx context.Context, base string, all []docJSON) int {
	t := r.t
	rd := &redeemer{t: t, base: base, redeemed: map[string]bool{}, done: map[string]bool{}}
	pending := map[string]bool{}
	for _, d := range all {
		pending[d.Id] = true
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(pending) > 0 && time.Now().Before(deadline) {
		for id := range pending {
			if rd.step(ctx, id) {
				delete(pending, id)
			}
		}
		if len(pending) > 0 {
			time.Sleep(200 * time.Millisecond) // polling period
		}
	}
	if rd.refused > 0 {
		t.Errorf("%d redemptions of ISSUED claims were refused (docs/profile.md 6: a claim of an earlier attempt stays redeemable)", rd.refused)
	}
	if len(pending) > 0 {
		for id := range pending {
			_, b, _ := doJSON(ctx, "GET", base+"/v1/documents/"+id, nil, "")
			t.Errorf("document %s not terminal 2 min after the last restart: %.400s", id, b)
		}
		t.FailNow()
	}
	return len(rd.done)
}

// step looks at document id once: true when it is terminal, else it
// redeems one of its ISSUED claims unless one already succeeded.
func (rd *redeemer) step(ctx context.Context, id string) bool {
	t := rd.t
	st, b, err := doJSON(ctx, "GET", rd.base+"/v1/documents/"+id, nil, "")
	if err != nil || st != 200 {
		t.Fatalf("get %s: %d %v %s", id, st, err, b)
	}
	var d docJSON
	json.Unmarshal(b, &d)
	if terminalState(d.State) {
		return true
	}
	// A whole deferred document has one deferred entity: one redemption
	// finishes it. Claims of earlier dispatch attempts stay redeemable
	// (docs/profile.md 6): any ISSUED claim will do, and after it every
	// claim of the document is spent.
	if rd.done[id] {
		return false
	}
	for _, c := range d.ClaimChecks {
		if c.State != "ISSUED" || rd.redeemed[c.ClaimId] {
			continue
		}
		rd.redeemed[c.ClaimId] = true
		if rd.redeemOnce(ctx, id, c.ClaimId, len(d.ClaimChecks)) {
			rd.done[id] = true
			return false
		}
	}
	return false
}

// redeemOnce redeems claim and checks a replay is refused; false when the
// redemption itself was refused.
func (rd *redeemer) redeemOnce(ctx context.Context, id, claim string, listed int) bool {
	t := rd.t
	st, b, err := doJSON(ctx, "POST", rd.base+"/v1/claims/"+claim+":redeem", []byte("{}"), "application/json")
	if err != nil || st != 200 {
		rd.refused++
		if rd.refused <= 3 {
			t.Errorf("redeem ISSUED claim %s of %s (%d claims listed): %d %v %s", claim, id, listed, st, err, b)
		}
		return false
	}
	st, b, _ = doJSON(ctx, "POST", rd.base+"/v1/claims/"+claim+":redeem", []byte("{}"), "application/json")
	if st != 400 || !strings.Contains(string(b), "CLAIM_ALREADY_REDEEMED") {
		t.Errorf("second redemption of claim %s: HTTP %d %s, want 400 CLAIM_ALREADY_REDEEMED", claim, st, b)
	}
	return true
}

// checkResults: every acknowledged document SUCCEEDED with its input as
// the result.
func (r *crashRun) checkResults(ctx context.Context, base string) {
	t := r.t
	for _, a := range r.acked {
		st, b, err := doJSON(ctx, "GET", base+"/v1/documents/"+a.id, nil, "")
		var d docJSON
		if err != nil || st != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("get %s: %d %v", a.id, st, err)
		}
		if d.State != "SUCCEEDED" {
			t.Errorf("document %s (deferred %v, %d bytes) ended %s (%s), want SUCCEEDED", a.id, a.deferred, len(a.input), d.State, d.Error)
			continue
		}
		st, out, err := doJSON(ctx, "GET", base+"/v1/documents/"+a.id+"/result", nil, "")
		if err != nil || st != 200 || !bytes.Equal(out, a.input) {
			t.Errorf("result of %s: HTTP %d, %d bytes sha256 %s, want %d bytes sha256 %s (%v)", a.id, st, len(out), sha256Hex(out), len(a.input), sha256Hex(a.input), err)
		}
	}
}

// checkEventSeqs: the whole window replayed from cursor=0 is strictly
// increasing, and every event a live subscriber saw in any lifetime is the
// one the replay shows at that seq (a seq reused after a crash would show a
// different event). It returns the replay's size and seq range.
func (r *crashRun) checkEventSeqs(ctx context.Context, base string) (replayed int, first, latest uint64) {
	t := r.t
	replay, first, latest := replayWindow(t, ctx, base)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.liveDup {
		t.Errorf("live subscribers saw one seq twice with different events: %s", d)
	}
	mismatch := 0
	for seq, ev := range r.live {
		if rp, ok := replay[seq]; ok && rp != ev {
			if mismatch++; mismatch <= 5 {
				t.Errorf("seq %d: a live subscriber saw %+v, the replay shows %+v (seq reused after a crash)", seq, ev, rp)
			}
		} else if !ok && seq >= first && seq <= latest {
			// Retention prunes a prefix of the log (docs/retention.md):
			// only a seq inside the retained window must be in the replay.
			if mismatch++; mismatch <= 5 {
				t.Errorf("seq %d: a live subscriber saw %+v, the replay does not have it (an event delivered before it was durable)", seq, ev)
			}
		}
	}
	return len(replay), first, latest
}

// replayWindow replays the retained window from cursor=0 up to the latest
// seq, checking the seqs are strictly increasing.
func replayWindow(t *testing.T, ctx context.Context, base string) (replay map[uint64]eventKey, first, latest uint64) {
	st, b, err := doJSON(ctx, "GET", base+"/v1/events:window", nil, "")
	if err != nil || st != 200 {
		t.Fatalf("window: %d %v", st, err)
	}
	var win struct {
		LatestSeq string
	}
	json.Unmarshal(b, &win)
	fmt.Sscan(win.LatestSeq, &latest)
	replay = map[uint64]eventKey{}
	var last uint64
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	zero := uint64(0)
	err = followEvents(rctx, base, &zero, func(ev eventKey) {
		if ev.Seq <= last {
			t.Errorf("replay: seq %d after %d: not strictly increasing", ev.Seq, last)
		}
		last = ev.Seq
		if first == 0 {
			first = ev.Seq
		}
		replay[ev.Seq] = ev
		if ev.Seq >= latest {
			cancel()
		}
	})
	cancel()
	if last < latest {
		t.Fatalf("replay from cursor=0 ended at seq %d, latest is %d: %v", last, latest, err)
	}
	return replay, first, latest
}
