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
	g := startGateway(t, gwOpts{args: []string{"--rate-limit", "0", "--max-uploads-per-tenant", "0"}})
	var cur atomic.Pointer[gatewayProc]
	cur.Store(g)

	var (
		mu      sync.Mutex
		acked   []ackDoc
		live    = map[uint64]eventKey{} // every event a live subscriber saw, by seq
		liveDup []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup

	// A live subscriber per gateway lifetime.
	subscribe := func(gp *gatewayProc) {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-stop:
				case <-gp.proc.done:
				}
				cancel()
			}()
			_ = followEvents(ctx, gp.baseURL(), nil, func(ev eventKey) {
				mu.Lock()
				defer mu.Unlock()
				if old, ok := live[ev.Seq]; ok && old != ev {
					liveDup = append(liveDup, fmt.Sprintf("seq %d was %+v, then %+v", ev.Seq, old, ev))
				}
				live[ev.Seq] = ev
			})
		})
	}
	subscribe(g)

	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 77))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				gp := cur.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				var (
					status int
					body   []byte
					err    error
					ack    ackDoc
				)
				switch i % 4 {
				case 0, 1: // small inline
					ack.input = []byte(fmt.Sprintf("writer %d doc %d %x", w, i, rng.Uint64()))
					status, body, err = doJSON(ctx, "POST", gp.baseURL()+"/v1/documents",
						mustJSON(t, map[string]any{"content": b64(ack.input), "contentType": "text/plain"}), "application/json")
				case 2: // larger upload, dehydrated into 128 KiB chunks
					ack.input = binaryData(256<<10+rng.IntN(768<<10), rng.Uint64())
					status, body, err = doJSON(ctx, "POST", gp.baseURL()+"/v1/documents:upload?split.strategy=fixed_bytes&split.chunkBytes=131072",
						ack.input, "application/octet-stream")
				case 3: // deferred: a claim check to redeem at the end
					ack.input, ack.deferred = []byte(fmt.Sprintf("deferred %d/%d", w, i)), true
					status, body, err = doJSON(ctx, "POST", gp.baseURL()+"/v1/documents",
						mustJSON(t, deferredDoc(ack.input, 10*time.Minute, nil, nil)), "application/json")
				}
				cancel()
				if err != nil || status != 200 {
					if err == nil && status != 503 {
						t.Errorf("submit: HTTP %d %s (only a crash may refuse a submission)", status, body)
					}
					time.Sleep(20 * time.Millisecond) // the gateway is down: retry soon
					continue
				}
				var d docJSON
				if json.Unmarshal(body, &d) != nil || d.Id == "" {
					t.Errorf("submit answered 200 without an id: %s", body)
					continue
				}
				ack.id = d.Id
				mu.Lock()
				acked = append(acked, ack)
				mu.Unlock()
			}
		})
	}

	rng := rand.New(rand.NewPCG(1, 2))
	for k := range kills {
		time.Sleep(time.Duration(800+rng.IntN(1700)) * time.Millisecond)
		gp := cur.Load()
		gp.proc.kill()
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		t.Logf("kill %d: SIGKILLed the gateway with %d documents acknowledged so far", k+1, n)
		ng := gp.restart(t)
		cur.Store(ng)
		subscribe(ng)
	}
	time.Sleep(time.Second) // the last lifetime takes submissions too
	close(stop)
	wg.Wait()
	g = cur.Load()
	base := g.baseURL()
	ctx := ctxT(t, 3*time.Minute)

	// Every document in the store, each listed once.
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
	for _, a := range acked {
		if seen[a.id] != 1 {
			t.Errorf("acknowledged document %s is listed %d times, want exactly once", a.id, seen[a.id])
		}
	}
	t.Logf("%d acknowledged documents, %d in the store", len(acked), len(all))

	// Redeem every issued claim once (a replay is refused), until every
	// document is terminal.
	redeemed := map[string]bool{} // claims tried
	done := map[string]bool{}     // documents with a successful redemption
	refused := 0                  // ISSUED claims whose redemption was refused
	pending := map[string]bool{}
	for _, d := range all {
		pending[d.Id] = true
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(pending) > 0 && time.Now().Before(deadline) {
		for id := range pending {
			st, b, err := doJSON(ctx, "GET", base+"/v1/documents/"+id, nil, "")
			if err != nil || st != 200 {
				t.Fatalf("get %s: %d %v %s", id, st, err, b)
			}
			var d docJSON
			json.Unmarshal(b, &d)
			if terminalState(d.State) {
				delete(pending, id)
				continue
			}
			// A whole deferred document has one deferred entity: one
			// redemption finishes it. Claims of earlier dispatch attempts
			// stay redeemable (docs/profile.md 6): any ISSUED claim will do,
			// and after it every claim of the document is spent.
			if done[id] {
				continue
			}
			for _, c := range d.ClaimChecks {
				if c.State != "ISSUED" || redeemed[c.ClaimId] {
					continue
				}
				redeemed[c.ClaimId] = true
				st, b, err := doJSON(ctx, "POST", base+"/v1/claims/"+c.ClaimId+":redeem", []byte("{}"), "application/json")
				if err != nil || st != 200 {
					refused++
					if refused <= 3 {
						t.Errorf("redeem ISSUED claim %s of %s (%d claims listed): %d %v %s", c.ClaimId, id, len(d.ClaimChecks), st, err, b)
					}
					continue
				}
				done[id] = true
				st, b, _ = doJSON(ctx, "POST", base+"/v1/claims/"+c.ClaimId+":redeem", []byte("{}"), "application/json")
				if st != 400 || !strings.Contains(string(b), "CLAIM_ALREADY_REDEEMED") {
					t.Errorf("second redemption of claim %s: HTTP %d %s, want 400 CLAIM_ALREADY_REDEEMED", c.ClaimId, st, b)
				}
				break
			}
		}
		if len(pending) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if refused > 0 {
		t.Errorf("%d redemptions of ISSUED claims were refused (docs/profile.md 6: a claim of an earlier attempt stays redeemable)", refused)
	}
	if len(pending) > 0 {
		for id := range pending {
			_, b, _ := doJSON(ctx, "GET", base+"/v1/documents/"+id, nil, "")
			t.Errorf("document %s not terminal 2 min after the last restart: %.400s", id, b)
		}
		t.FailNow()
	}

	// Results are intact.
	for _, a := range acked {
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

	// Event seqs: the whole window replayed from cursor=0 is strictly
	// increasing, and every event a live subscriber saw in any lifetime is
	// the one the replay shows at that seq (a seq reused after a crash
	// would show a different event).
	st, b, err := doJSON(ctx, "GET", base+"/v1/events:window", nil, "")
	if err != nil || st != 200 {
		t.Fatalf("window: %d %v", st, err)
	}
	var win struct {
		LatestSeq string
	}
	json.Unmarshal(b, &win)
	var latest uint64
	fmt.Sscan(win.LatestSeq, &latest)
	replay := map[uint64]eventKey{}
	var last, first uint64
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
	mu.Lock()
	defer mu.Unlock()
	for _, d := range liveDup {
		t.Errorf("live subscribers saw one seq twice with different events: %s", d)
	}
	mismatch := 0
	for seq, ev := range live {
		if r, ok := replay[seq]; ok && r != ev {
			if mismatch++; mismatch <= 5 {
				t.Errorf("seq %d: a live subscriber saw %+v, the replay shows %+v (seq reused after a crash)", seq, ev, r)
			}
		} else if !ok && seq >= first && seq <= latest {
			// Retention prunes a prefix of the log (docs/retention.md):
			// only a seq inside the retained window must be in the replay.
			if mismatch++; mismatch <= 5 {
				t.Errorf("seq %d: a live subscriber saw %+v, the replay does not have it (an event delivered before it was durable)", seq, ev)
			}
		}
	}
	t.Logf("%d events replayed (seqs %d-%d; older ones pruned by retention), %d seen live across %d lifetimes, %d documents redeemed", len(replay), first, latest, len(live), kills+1, len(done))
}
