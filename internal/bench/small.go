package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/cputime"
)

// small measures 4 KiB documents at Options.Concurrency, submit ->
// SUCCEEDED, over gRPC (SubmitDocument) and REST (POST /v1/documents),
// against a bare grpc-go unary call over plaintext loopback (like the
// gateway's listener here).
//
// Completion: one event subscription per path, filtered to "#document"
// events and opened at the log's latest seq before the first submit
// (SubscribeEvents over gRPC, NDJSON /v1/events:subscribe over REST). That
// is the cheapest correct wait: one stream for all documents instead of a
// WatchDocument stream or polling per document, and the cursor makes sure
// no terminal event is missed.
func (b *runner) small(ctx context.Context) error {
	payload := patternBlock[:b.o.SmallBytes]
	d := b.o.Duration

	b.progress("  bare grpc-go unary (plaintext), %d in flight, %s", b.o.Concurrency, d)
	c0 := cputime.Process()
	lat, secs, err := b.unaryBaseline(ctx, payload)
	if err != nil {
		return fmt.Errorf("grpc-go unary baseline: %w", err)
	}
	unary := latResult("small", "bare grpc-go unary (plaintext)", true, lat, secs)
	unary.Note = fmt.Sprintf("%.1f µs of CPU per call (this process: client and server)", perOp(cputime.Process()-c0, len(lat)))
	b.add(unary)
	if err := b.jetStreamBaselines(ctx); err != nil {
		return err
	}

	for _, path := range []string{"grpc", "rest"} {
		b.progress("  gateway %s submit -> SUCCEEDED, %d in flight, %s", path, b.o.Concurrency, d)
		var (
			lat  []time.Duration
			secs float64
		)
		prof := b.startProfile(ctx, "small-"+path, d)
		c0 := cputime.Process()
		ps, ok, err := b.gw.measure(func() (err error) {
			lat, secs, err = b.gw.smallDocs(ctx, path, payload, b.o.Concurrency, d)
			return err
		})
		client := perOp(cputime.Process()-c0, len(lat))
		if perr := prof(); err == nil && perr != nil {
			err = perr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		name := map[string]string{"grpc": "gateway gRPC Submit -> SUCCEEDED", "rest": "gateway REST POST -> SUCCEEDED"}[path]
		r := latResult("small", name, false, lat, secs)
		fill(&r, ps, ok, int64(len(lat)), secs)
		r.Note = fmt.Sprintf("the bench's client: %.1f µs of CPU per document", client)
		if path == "grpc" && ok {
			r.Note += "; " + budgetNote(unary.Rate, runtime.NumCPU(), client, r.CPUPerOpUs)
		}
		b.add(r)
	}
	b.ratios("small")
	return nil
}

// smallTarget is issue 25's target for small documents over gRPC: this
// share of the bare unary call's rate in the same run.
const smallTarget = 0.3

// targetBudget is the gateway's CPU per document (embedded peer included)
// that the small-document target leaves on cores when the bench's client
// takes clientUs per document: at smallTarget x unaryRate documents/s the
// machine has cores/rate of CPU per document, shared by the client and
// the gateway (negative: the client alone exceeds it).
func targetBudget(unaryRate float64, cores int, clientUs float64) float64 {
	if unaryRate <= 0 {
		return 0
	}
	return float64(cores)*1e6/(smallTarget*unaryRate) - clientUs
}

// budgetNote says what the target leaves the gateway in this run and
// what it used: the bound docs/performance.md explains, measured in every
// run.
func budgetNote(unaryRate float64, cores int, clientUs, gatewayUs float64) string {
	g := targetBudget(unaryRate, cores, clientUs)
	head := fmt.Sprintf("%.1fx bare unary is %.0f docs/s: %d CPUs give %.0f µs per document, the client took %.0f",
		smallTarget, smallTarget*unaryRate, cores, g+clientUs, clientUs)
	if g <= 0 {
		return head + ", nothing is left for the gateway"
	}
	return head + fmt.Sprintf(", leaving the gateway %.0f µs; it used %.0f (%.1fx that budget)", g, gatewayUs, gatewayUs/g)
}

func latResult(phase, path string, base bool, lat []time.Duration, secs float64) Result {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	return Result{Phase: phase, Path: path, Baseline: base, Unit: "docs/s", Rate: float64(len(lat)) / secs,
		Count: int64(len(lat)), Seconds: secs, P50ms: pct(0.50), P99ms: pct(0.99), P999ms: pct(0.999)}
}

// closedLoop runs conc workers calling op until d has passed and returns
// every latency and the elapsed seconds; the first error stops all.
func closedLoop(ctx context.Context, conc int, d time.Duration, op func(ctx context.Context) error) ([]time.Duration, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		all   []time.Duration
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range conc {
		wg.Go(func() {
			var lat []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				if err := op(ctx); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
					break
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, since(start), first
}

func (b *runner) unaryBaseline(ctx context.Context, payload []byte) ([]time.Duration, float64, error) {
	g, err := newGRPCBaseline(false)
	if err != nil {
		return nil, 0, err
	}
	defer g.close()
	return closedLoop(ctx, b.o.Concurrency, b.o.Duration, func(ctx context.Context) error {
		in, out := payload, []byte(nil)
		return g.conn.Invoke(ctx, unaryMethod, &in, &out)
	})
}

// smallDocs submits payload as documents over path ("grpc" or "rest") with
// conc in flight for d and waits for each to be SUCCEEDED.
func (g *gatewayProc) smallDocs(ctx context.Context, path string, payload []byte, conc int, d time.Duration) ([]time.Duration, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := g.follow(ctx, path)
	if err != nil {
		return nil, 0, err
	}
	body, _ := json.Marshal(map[string]string{"content": base64.StdEncoding.EncodeToString(payload), "contentType": "application/octet-stream"})
	return closedLoop(ctx, conc, d, func(ctx context.Context) error {
		var id string
		if path == "grpc" {
			doc, err := g.docs.SubmitDocument(g.ctx(ctx), &gatewayv1.SubmitDocumentRequest{Content: payload, ContentType: "application/octet-stream"})
			if err != nil {
				return err
			}
			id = doc.GetId()
		} else {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.httpAddr+"/v1/documents", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			g.authorize(req)
			if id, err = g.submitREST(req); err != nil {
				return err
			}
		}
		return w.wait(ctx, id)
	})
}

// waiter hands terminal #document events to the goroutine waiting for
// that document; events that arrive before their waiter are kept.
type waiter struct {
	mu      sync.Mutex
	waiting map[string]chan error
	early   map[string]error
	broken  error
}

func newWaiter() *waiter {
	return &waiter{waiting: map[string]chan error{}, early: map[string]error{}}
}

func (w *waiter) deliver(id string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.waiting[id]; ok {
		delete(w.waiting, id)
		ch <- err
		return
	}
	w.early[id] = err
}

// fail ends every wait with err (the subscription broke).
func (w *waiter) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.broken = err
	for id, ch := range w.waiting {
		delete(w.waiting, id)
		ch <- err
	}
}

func (w *waiter) wait(ctx context.Context, id string) error {
	w.mu.Lock()
	if err, ok := w.early[id]; ok {
		delete(w.early, id)
		w.mu.Unlock()
		return err
	}
	if w.broken != nil {
		w.mu.Unlock()
		return w.broken
	}
	ch := make(chan error, 1)
	w.waiting[id] = ch
	w.mu.Unlock()
	t := time.NewTimer(waitTimeout)
	defer t.Stop()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("document %s: no terminal event within %s", id, waitTimeout)
	}
}

// follow opens a "#document" subscription at the log's latest seq over
// path and feeds a waiter until ctx ends.
func (g *gatewayProc) follow(ctx context.Context, path string) (*waiter, error) {
	win, err := g.events.GetEventWindow(g.ctx(ctx), &gatewayv1.GetEventWindowRequest{})
	if err != nil {
		return nil, err
	}
	cursor := win.GetLatestSeq()
	w := newWaiter()
	onEvent := func(e *gatewayv1.Event) {
		if e.GetKind() != "#document" {
			return
		}
		if err := terminal(e.GetDocumentId(), e.GetState(), e.GetMessage()); err != errNotTerminal {
			w.deliver(e.GetDocumentId(), err)
		}
	}
	if path == "grpc" {
		st, err := g.events.SubscribeEvents(g.ctx(ctx), &gatewayv1.SubscribeEventsRequest{Cursor: &cursor, Kinds: []string{"#document"}})
		if err != nil {
			return nil, err
		}
		go func() {
			for {
				e, err := st.Recv()
				if err != nil {
					w.fail(fmt.Errorf("event subscription: %w", err))
					return
				}
				onEvent(e)
			}
		}()
		return w, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.httpAddr+"/v1/events:subscribe?kinds=%23document&cursor="+strconv.FormatUint(cursor, 10), nil)
	if err != nil {
		return nil, err
	}
	g.authorize(req)
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		resp.Body.Close()
		return nil, fmt.Errorf("subscribe: HTTP %d: %s", resp.StatusCode, b)
	}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Result *struct {
					Kind       string `json:"kind"`
					DocumentID string `json:"documentId"`
					State      string `json:"state"`
					Message    string `json:"message"`
				} `json:"result"`
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Error != nil {
				w.fail(fmt.Errorf("event subscription: %v %v", err, line.Error))
				return
			}
			if line.Result != nil {
				onEvent(&gatewayv1.Event{Kind: line.Result.Kind, DocumentId: line.Result.DocumentID,
					State: gatewayv1.State(gatewayv1.State_value[line.Result.State]), Message: line.Result.Message})
			}
		}
		w.fail(fmt.Errorf("event subscription ended: %v", sc.Err()))
	}()
	return w, nil
}

// submitREST sends a REST submission and returns the document's id. The
// answer is scanned for its top-level "id" (the gateway writes "name"
// and then "id" first, gateway/snapshotjson.go) instead of decoded whole
// with encoding/json: the load generator's CPU is taken from the
// gateway's two cores, and the decode was a fifth of the REST client's.
func (g *gatewayProc) submitREST(req *http.Request) (string, error) {
	resp, err := g.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s: HTTP %d: %.2048s", req.Method, req.URL.Path, resp.StatusCode, b)
	}
	if id, ok := topLevelID(b); ok {
		return id, nil
	}
	var doc struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.ID == "" {
		return "", fmt.Errorf("%s %s: no document id in the answer (%v): %.256s", req.Method, req.URL.Path, err, b)
	}
	return doc.ID, nil
}

// topLevelID finds "id":"<id>" among the first two members of a
// Document's JSON ({"name":"documents/<id>","id":"<id>",...}), and only
// there; anything else is left to encoding/json.
func topLevelID(b []byte) (string, bool) {
	const name, key = `{"name":"documents/`, `","id":"`
	if !bytes.HasPrefix(b, []byte(name)) {
		return "", false
	}
	rest := b[len(name):]
	i := bytes.IndexByte(rest, '"')
	if i < 0 || !bytes.HasPrefix(rest[i:], []byte(key)) {
		return "", false
	}
	id := rest[:i]
	if !bytes.HasPrefix(rest[i+len(key):], append(append([]byte(nil), id...), '"')) {
		return "", false // "id" is not the name's id: let encoding/json say
	}
	return string(id), true
}
