package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fxamacker/cbor/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The history checker (issue 24, docs/scale-out.md "The history checker"),
// in the style of Jepsen's: three `gateway serve` replicas on one
// PostgreSQL cluster and two `gateway peer` processes; a subscriber on
// every replica over each of NDJSON, gRPC and WebSocket; a seeded workload
// of submissions (REST and gRPC, small and deferred by the fault
// processor), redemptions of the deferred documents' claims through any
// replica, and cancels; and faults: a replica SIGSTOPped past its lease
// and past a prune (the event retention's max age is short), kill -9 of a
// replica (restarted) and of a peer, a PostgreSQL restart. After the run
// the whole history is checked:
//
//   - every subscriber's history is gapless, or announces each gap with
//     #info OutdatedCursor before the next event (a resumption replays the
//     cursor's event first, the AT sync rule);
//   - every subscriber saw the same event at the same seq;
//   - every document, entity and claim state in the database has its
//     event, and no event names a terminal state or a redemption the
//     database does not have;
//   - every read after an acknowledged write, on any replica, saw it;
//   - no client-facing error names the database.
//
// The seed fixes the workload and the fault schedule; a failing run
// prints it, and -history.seed replays it. -history.duration sets the
// workload's length.
var (
	historySeed     = flag.Uint64("history.seed", 0, "TestHistory: seed of the workload and the faults (0: from the clock)")
	historyDuration = flag.Duration("history.duration", 40*time.Second, "TestHistory: how long the workload and its faults run")
)

const (
	histReplicas = 3
	histWorkers  = 3
	histPause    = 14 * time.Second // SIGSTOP: past the 10 s lease and the 8 s retention max age
	histMaxAge   = "8s"
	histReqT     = 4 * time.Second // one client request (a paused replica does not answer)
)

var histTransports = []string{"ndjson", "grpc", "ws"}

// histEvent is what the checker keeps of an event, from any transport.
type histEvent struct {
	Seq          uint64
	Kind         string
	Doc          string
	ClaimID      string
	Action       string
	State        string
	EntityID     uint32
	ScopeID      uint32
	EntityStatus string
	Name         string
}

func (e histEvent) gapNotice() bool { return e.Kind == "#info" && e.Name == "OutdatedCursor" }

// norm drops the enum zero values one transport spells out and another
// omits.
func (e histEvent) norm() histEvent {
	if strings.HasSuffix(e.State, "_UNSPECIFIED") {
		e.State = ""
	}
	if strings.HasSuffix(e.EntityStatus, "_UNSPECIFIED") {
		e.EntityStatus = ""
	}
	return e
}

// histObs is one entry of a subscriber's history: an event, or the start
// of a (re)subscription with its cursor.
type histObs struct {
	ev     histEvent
	start  bool
	cursor uint64
}

type histSub struct {
	replica   int
	transport string
	mu        sync.Mutex
	log       []histObs
	last      uint64
	ends      map[string]int // how subscriptions ended (for the report)
}

func (s *histSub) add(o histObs) {
	o.ev = o.ev.norm()
	s.mu.Lock()
	s.log = append(s.log, o)
	if o.ev.Seq > 0 {
		s.last = o.ev.Seq
	}
	s.mu.Unlock()
}

func (s *histSub) lastSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// histDoc is a document the workload submitted and had acknowledged.
type histDoc struct {
	id       string
	deferred bool
}

type histRig struct {
	t       *testing.T
	seed    uint64
	dsn     string
	pgDir   string
	db      *pgxpool.Pool // reconnects after the restart
	peers   []*proc
	subs    []*histSub
	ctx     context.Context // the whole run
	secrets []string        // what no client-facing error may contain

	mu    sync.Mutex
	gws   [histReplicas]*gatewayProc
	conns map[*gatewayProc]grpcClients
	docs  []*histDoc
	viol  []string
	stats map[string]int
}

func (r *histRig) violation(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.viol) < 200 {
		r.viol = append(r.viol, fmt.Sprintf(format, args...))
	}
}

func (r *histRig) count(what string) {
	r.mu.Lock()
	r.stats[what]++
	r.mu.Unlock()
}

// gw is replica i's current process, nil while it is down.
func (r *histRig) gw(i int) *gatewayProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.gws[i]; g != nil && !g.proc.exited() {
		return g
	}
	return nil
}

// grpcOf dials g once.
func (r *histRig) grpcOf(g *gatewayProc) grpcClients {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[g]; ok {
		return c
	}
	conn, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		// Only a malformed address fails here, a bug of the test; grpcOf
		// runs on the workers' goroutines, where t.Fatal would end only the
		// worker (internal/lint/gofatal).
		panic(fmt.Sprintf("grpc.NewClient(%q): %v", g.grpcAddr, err))
	}
	r.t.Cleanup(func() { conn.Close() })
	c := grpcClients{docs: gatewayv1.NewDocumentServiceClient(conn), events: gatewayv1.NewEventServiceClient(conn)}
	r.conns[g] = c
	return c
}

func TestHistory(t *testing.T) {
	seed := *historySeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("history seed %d (replay: go test ./e2e -run 'TestHistory$' -history.seed %d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with history seed %d: replay with -history.seed %d", seed, seed)
		}
	})
	r := newHistRig(t, seed)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.ctx = ctx
	var subWG sync.WaitGroup
	for i := range histReplicas {
		for _, tr := range histTransports {
			s := &histSub{replica: i, transport: tr, ends: map[string]int{}}
			r.subs = append(r.subs, s)
			subWG.Go(func() { r.follow(s) })
		}
	}
	defer subWG.Wait()
	defer cancel()

	wctx, wcancel := context.WithTimeout(ctx, *historyDuration)
	defer wcancel()
	var wg sync.WaitGroup
	for w := range histWorkers {
		wg.Go(func() { r.work(wctx, w) })
	}
	r.faults(wctx)
	wg.Wait()
	r.drain(2 * time.Minute)
	last := r.awaitSubscribers(time.Minute)
	union := r.checkSubscribers()
	r.checkDatabase(union, last)
	r.mu.Lock()
	defer r.mu.Unlock()
	t.Logf("seed %d: %d documents acknowledged, last seq %d, %d distinct events seen; operations %v", seed, len(r.docs), last, len(union), r.stats)
	for _, s := range r.subs {
		t.Logf("replica %d %-6s: %d observations, subscriptions ended: %v", s.replica, s.transport, len(s.log), s.ends)
	}
	for i, g := range r.gws {
		b, _ := os.ReadFile(g.proc.logPath)
		t.Logf("replica %d's log: %d retention passes pruned, %d catch-ups found events pruned before it read them", i,
			bytes.Count(b, []byte("event log pruned")), bytes.Count(b, []byte("were pruned before this replica read them")))
	}
	for _, v := range r.viol {
		t.Errorf("violation: %s", v)
	}
}

// newHistRig starts PostgreSQL, two peers and three replicas using both.
func newHistRig(t *testing.T, seed uint64) *histRig {
	dsn, pgDir := startPostgresDir(t)
	r := &histRig{t: t, seed: seed, dsn: dsn, pgDir: pgDir, conns: map[*gatewayProc]grpcClients{}, stats: map[string]int{}}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r.db = pool
	args := []string{"--store", dsn, "--rate-limit", "0", "--max-uploads-per-tenant", "0", "--max-subscribers-per-tenant", "0",
		"--retention-max-age", histMaxAge, "--retention-prune-interval", "1s"}
	for range 2 {
		addr, cert, p := startPeer(t)
		r.peers = append(r.peers, p)
		args = append(args, "--peer", addr, "--peer-ca", cert)
	}
	for i := range histReplicas {
		r.gws[i] = startGateway(t, gwOpts{args: args})
		t.Cleanup(func() { // a paused replica must be able to stop
			if g := r.gws[i]; g != nil && !g.proc.exited() {
				_ = g.proc.cmd.Process.Signal(syscall.SIGCONT)
			}
		})
	}
	u := strings.TrimPrefix(dsn, "postgres://")
	host := u[strings.Index(u, "@")+1 : strings.Index(u, "/")]
	r.secrets = []string{"postgres://", "user=", "postgres@", host}
	return r
}

// ---- subscribers ----

// follow keeps one subscriber on its replica for the whole run: from
// cursor 0 first, then from the last seq it processed (inclusive) after
// every end (a killed, restarted or paused replica, ConsumerTooSlow, a
// database restart).
func (r *histRig) follow(s *histSub) {
	var cursor uint64
	for r.ctx.Err() == nil {
		g := r.gw(s.replica)
		if g == nil {
			select {
			case <-r.ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		s.add(histObs{start: true, cursor: cursor})
		err := r.subscribeOnce(s.transport, g, cursor, s.add)
		end := "EOF"
		if err != nil {
			end = firstWords(err.Error(), 4)
		}
		s.mu.Lock()
		s.ends[end]++
		cursor = s.last
		s.mu.Unlock()
		select {
		case <-r.ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (r *histRig) subscribeOnce(transport string, g *gatewayProc, cursor uint64, add func(histObs)) error {
	switch transport {
	case "ndjson":
		return r.followNDJSON(g, cursor, add)
	case "grpc":
		return r.followGRPC(g, cursor, add)
	}
	return r.followWS(g, cursor, add)
}

func (r *histRig) followNDJSON(g *gatewayProc, cursor uint64, add func(histObs)) error {
	req, err := http.NewRequestWithContext(r.ctx, "GET", g.baseURL()+"/v1/events:subscribe?cursor="+strconv.FormatUint(cursor, 10), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		r.checkLeak("NDJSON subscribe", b)
		return fmt.Errorf("subscribe: HTTP %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var line struct {
			Result *struct {
				Seq          uint64 `json:"seq,string"`
				Kind         string
				DocumentId   string
				ClaimId      string
				ClaimAction  string
				State        string
				EntityId     uint32
				ScopeId      uint32
				EntityStatus string
				Name         string
			}
			Error json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("event line %q: %v", sc.Bytes(), err)
		}
		if line.Error != nil {
			r.checkLeak("NDJSON stream error", line.Error)
			return fmt.Errorf("stream error %s", line.Error)
		}
		if e := line.Result; e != nil {
			add(histObs{ev: histEvent{Seq: e.Seq, Kind: e.Kind, Doc: e.DocumentId, ClaimID: e.ClaimId, Action: e.ClaimAction,
				State: e.State, EntityID: e.EntityId, ScopeID: e.ScopeId, EntityStatus: e.EntityStatus, Name: e.Name}})
		}
	}
	return sc.Err()
}

func (r *histRig) followGRPC(g *gatewayProc, cursor uint64, add func(histObs)) error {
	st, err := r.grpcOf(g).events.SubscribeEvents(r.ctx, &gatewayv1.SubscribeEventsRequest{Cursor: &cursor})
	if err != nil {
		return err
	}
	for {
		e, err := st.Recv()
		if err != nil {
			r.checkLeak("gRPC stream error", []byte(err.Error()))
			return err
		}
		ev := histEvent{Seq: e.GetSeq(), Kind: e.GetKind(), Doc: e.GetDocumentId(), ClaimID: e.GetClaimId(), Action: e.GetClaimAction(),
			EntityID: e.GetEntityId(), ScopeID: e.GetScopeId(), Name: e.GetName()}
		if e.GetState() != gatewayv1.State_STATE_UNSPECIFIED {
			ev.State = e.GetState().String()
		}
		if e.GetEntityStatus() != gatewayv1.EntityStatus_ENTITY_STATUS_UNSPECIFIED {
			ev.EntityStatus = e.GetEntityStatus().String()
		}
		add(histObs{ev: ev})
	}
}

func (r *histRig) followWS(g *gatewayProc, cursor uint64, add func(histObs)) error {
	c, resp, err := websocket.Dial(r.ctx, "ws://"+g.httpAddr+"/v1/events/ws?cursor="+strconv.FormatUint(cursor, 10), nil)
	if err != nil {
		if resp != nil && resp.Body != nil {
			b, _ := io.ReadAll(resp.Body)
			r.checkLeak("WebSocket upgrade", b)
		}
		return fmt.Errorf("dial: %w", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(8 << 20)
	for {
		_, msg, err := c.Read(r.ctx)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		dec := cbor.NewDecoder(bytes.NewReader(msg))
		var hdr struct {
			Op int    `cbor:"op"`
			T  string `cbor:"t"`
		}
		var p struct {
			Seq          uint64 `cbor:"seq"`
			DocumentID   string `cbor:"documentId"`
			EntityID     uint32 `cbor:"entityId"`
			ScopeID      uint32 `cbor:"scopeId"`
			EntityStatus string `cbor:"entityStatus"`
			State        string `cbor:"state"`
			ClaimID      string `cbor:"claimId"`
			ClaimAction  string `cbor:"claimAction"`
			Name         string `cbor:"name"`
			Error        string `cbor:"error"`
			Message      string `cbor:"message"`
		}
		if err := dec.Decode(&hdr); err != nil {
			return fmt.Errorf("frame header: %v", err)
		}
		if err := dec.Decode(&p); err != nil {
			return fmt.Errorf("frame payload: %v", err)
		}
		if hdr.Op != 1 {
			r.checkLeak("WebSocket error frame", []byte(p.Message))
			return fmt.Errorf("error frame %s: %s", p.Error, p.Message)
		}
		add(histObs{ev: histEvent{Seq: p.Seq, Kind: hdr.T, Doc: p.DocumentID, ClaimID: p.ClaimID, Action: p.ClaimAction, State: p.State,
			EntityID: p.EntityID, ScopeID: p.ScopeID, EntityStatus: p.EntityStatus, Name: p.Name}})
	}
}

// checkLeak records a violation when a client-facing error names the
// database (its URL, user or address), and counts the STORE_UNAVAILABLE
// answers (the database restart).
func (r *histRig) checkLeak(where string, b []byte) {
	if bytes.Contains(b, []byte("STORE_UNAVAILABLE")) {
		r.count("STORE_UNAVAILABLE answers")
	}
	for _, s := range r.secrets {
		if bytes.Contains(b, []byte(s)) {
			r.violation("%s names the database (%q): %.300s", where, s, b)
			return
		}
	}
}

// ---- workload ----

// work runs worker w's seeded operations until ctx ends.
func (r *histRig) work(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(w)))
	for n := 0; ctx.Err() == nil; n++ {
		switch op := rng.IntN(100); {
		case op < 40:
			r.submit(rng, fmt.Sprintf("history %d worker %d op %d: a small document\n", r.seed, w, n), false)
		case op < 65:
			r.submit(rng, fmt.Sprintf("history %d worker %d op %d: deferred until its claim is redeemed\n", r.seed, w, n), true)
		case op < 90:
			r.redeemOne(rng)
		default:
			r.cancelOne(rng)
		}
	}
}

// submit submits one document through a random replica and API, then
// reads it through another replica.
func (r *histRig) submit(rng *rand.Rand, content string, deferred bool) {
	i := rng.IntN(histReplicas)
	g := r.gw(i)
	if g == nil {
		return
	}
	rest := rng.IntN(2) == 0
	var id string
	ctx, cancel := context.WithTimeout(r.ctx, histReqT)
	defer cancel()
	if rest {
		req := map[string]any{"content": b64([]byte(content)), "contentType": "text/plain"}
		if deferred {
			req = deferredDoc([]byte(content), 5*time.Minute, nil, nil)
		}
		b, _ := json.Marshal(req)
		st, body, err := doJSON(ctx, "POST", g.baseURL()+"/v1/documents", b, "application/json")
		if err != nil || st != 200 {
			r.checkLeak("POST /v1/documents", body)
			r.count("submit refused")
			return
		}
		var d docJSON
		if json.Unmarshal(body, &d) != nil {
			return
		}
		id = d.Id
	} else {
		req := &gatewayv1.SubmitDocumentRequest{Content: []byte(content), ContentType: "text/plain"}
		if deferred {
			req.Split = &gatewayv1.SplitOptions{Processor: "fault"}
			req.Metadata = map[string]string{"pipestream.fault": "defer", "pipestream.claim-ttl-ms": "300000"}
		}
		d, err := r.grpcOf(g).docs.SubmitDocument(ctx, req)
		if err != nil {
			msg := err.Error()
			if errorReasonOf(err) == "STORE_UNAVAILABLE" {
				msg += " STORE_UNAVAILABLE"
			}
			r.checkLeak("SubmitDocument", []byte(msg))
			r.count("submit refused")
			return
		}
		id = d.GetId()
	}
	r.mu.Lock()
	r.docs = append(r.docs, &histDoc{id: id, deferred: deferred})
	r.mu.Unlock()
	r.count("submit")
	r.readAfterWrite(rng, i, id, "submit", func(d *gatewayv1.Document) bool { return d.GetId() == id })
}

// readAfterWrite reads document id through a replica other than the one
// written (any, when the others do not answer) and records a violation
// when an answer does not show the write (ok false). A replica that does
// not answer (paused, killed, database down) is no answer.
func (r *histRig) readAfterWrite(rng *rand.Rand, wrote int, id, what string, ok func(*gatewayv1.Document) bool) {
	start := rng.IntN(histReplicas - 1)
	for k := range histReplicas {
		i := (wrote + 1 + start + k) % histReplicas
		d, err := r.getDoc(rng, i, id)
		if err != nil {
			continue
		}
		if !ok(d) {
			r.violation("read after %s of document %s through replica %d: state %s, claims %v: the write is not visible", what, id, i, d.GetState(), d.GetClaimChecks())
		}
		r.count("read after " + what)
		return
	}
	r.count("read after " + what + ": no replica answered")
}

// getDoc reads a document through replica i over REST or gRPC.
func (r *histRig) getDoc(rng *rand.Rand, i int, id string) (*gatewayv1.Document, error) {
	g := r.gw(i)
	if g == nil {
		return nil, errors.New("down")
	}
	ctx, cancel := context.WithTimeout(r.ctx, histReqT)
	defer cancel()
	if rng.IntN(2) == 0 {
		return r.grpcOf(g).docs.GetDocument(ctx, &gatewayv1.GetDocumentRequest{Id: id})
	}
	st, body, err := doJSON(ctx, "GET", g.baseURL()+"/v1/documents/"+id, nil, "")
	if err != nil {
		return nil, err
	}
	if st != 200 {
		r.checkLeak("GET /v1/documents", body)
		return nil, fmt.Errorf("HTTP %d", st)
	}
	var d docJSON
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, err
	}
	out := &gatewayv1.Document{Id: d.Id, State: gatewayv1.State(gatewayv1.State_value[d.State])}
	for _, c := range d.ClaimChecks {
		out.ClaimChecks = append(out.ClaimChecks, &gatewayv1.ClaimCheck{ClaimId: c.ClaimId,
			State: gatewayv1.ClaimCheck_ClaimState(gatewayv1.ClaimCheck_ClaimState_value[c.State])})
	}
	return out, nil
}

// pickDeferred returns a random deferred document.
func (r *histRig) pickDeferred(rng *rand.Rand) *histDoc {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ds []*histDoc
	for _, d := range r.docs {
		if d.deferred {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return nil
	}
	return ds[rng.IntN(len(ds))]
}

// redeemOne redeems an ISSUED claim of a deferred document through a
// random replica (REST or gRPC) and reads the claim back through another.
func (r *histRig) redeemOne(rng *rand.Rand) {
	d := r.pickDeferred(rng)
	if d == nil {
		return
	}
	var claim string
	if doc, err := r.getDoc(rng, rng.IntN(histReplicas), d.id); err == nil {
		for _, c := range doc.GetClaimChecks() {
			if c.GetState() == gatewayv1.ClaimCheck_ISSUED {
				claim = c.GetClaimId()
			}
		}
	}
	if claim == "" {
		return
	}
	i := rng.IntN(histReplicas)
	if !r.redeem(rng, i, claim) {
		r.count("redeem refused")
		return
	}
	r.count("redeem")
	r.readAfterWrite(rng, i, d.id, "redeem", func(doc *gatewayv1.Document) bool {
		for _, c := range doc.GetClaimChecks() {
			if c.GetClaimId() == claim {
				return c.GetState() == gatewayv1.ClaimCheck_REDEEMED
			}
		}
		return false
	})
}

func (r *histRig) redeem(rng *rand.Rand, i int, claim string) bool {
	g := r.gw(i)
	if g == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(r.ctx, histReqT)
	defer cancel()
	if rng.IntN(2) == 0 {
		_, err := r.grpcOf(g).docs.RedeemClaimCheck(ctx, &gatewayv1.RedeemClaimCheckRequest{ClaimId: claim})
		if err != nil {
			r.checkLeak("RedeemClaimCheck", []byte(err.Error()))
		}
		return err == nil
	}
	st, body, err := doJSON(ctx, "POST", redeemURL(g, claim), []byte("{}"), "application/json")
	if err == nil && st != 200 {
		r.checkLeak("POST :redeem", body)
	}
	return err == nil && st == 200
}

// cancelOne cancels a deferred document through the replicas in a random
// order until one accepts (the one that drives it) and reads the state
// back through another replica.
func (r *histRig) cancelOne(rng *rand.Rand) {
	d := r.pickDeferred(rng)
	if d == nil {
		return
	}
	start := rng.IntN(histReplicas)
	for k := range histReplicas {
		i := (start + k) % histReplicas
		g := r.gw(i)
		if g == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, histReqT)
		var ok bool
		if rng.IntN(2) == 0 {
			_, err := r.grpcOf(g).docs.CancelDocument(ctx, &gatewayv1.CancelDocumentRequest{Id: d.id})
			ok = err == nil
		} else {
			st, body, err := doJSON(ctx, "POST", g.baseURL()+"/v1/documents/"+d.id+":cancel", []byte("{}"), "application/json")
			ok = err == nil && st == 200
			if err == nil && st != 200 {
				r.checkLeak("POST :cancel", body)
			}
		}
		cancel()
		if ok {
			r.count("cancel")
			r.readAfterWrite(rng, i, d.id, "cancel", func(doc *gatewayv1.Document) bool { return doc.GetState() == gatewayv1.State_CANCELLED })
			return
		}
	}
	r.count("cancel refused")
}

// ---- faults ----

// faults runs the seeded fault schedule within the workload: SIGSTOP of a
// replica for histPause, kill -9 and restart of another, kill -9 of a
// peer, a PostgreSQL restart.
func (r *histRig) faults(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.seed, 1<<32))
	d := *historyDuration
	paused := rng.IntN(histReplicas)
	killed := (paused + 1 + rng.IntN(histReplicas-1)) % histReplicas
	peer := rng.IntN(len(r.peers))
	at := func(frac float64) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(frac * float64(d))):
			return true
		}
	}
	if !at(0.1 + 0.1*rng.Float64()) {
		return
	}
	g := r.gw(paused)
	var before uint64
	if err := r.db.QueryRow(r.ctx, "SELECT last_seq FROM meta").Scan(&before); err != nil {
		r.t.Fatal(err)
	}
	signalProc(r.t, g.proc, syscall.SIGSTOP)
	r.t.Logf("fault: SIGSTOP replica %d at seq %d, for at least %v and until the others pruned past it", paused, before, histPause)
	r.pausePastPrune(paused, before)
	signalProc(r.t, g.proc, syscall.SIGCONT)
	r.t.Logf("fault: SIGCONT replica %d", paused)
	if !at(0.05) {
		return
	}
	r.t.Logf("fault: kill -9 replica %d", killed)
	old := r.gw(killed)
	old.proc.kill()
	time.Sleep(time.Second)
	ng := old.restart(r.t)
	r.mu.Lock()
	r.gws[killed] = ng
	r.mu.Unlock()
	r.t.Logf("fault: replica %d restarted", killed)
	if !at(0.05) {
		return
	}
	r.t.Logf("fault: kill -9 peer %d", peer)
	r.peers[peer].kill()
	if !at(0.05) {
		return
	}
	r.t.Logf("fault: PostgreSQL restart")
	restartPostgres(r.t, r.pgDir)
	r.t.Logf("fault: PostgreSQL back")
}

// pausePastPrune keeps replica paused (SIGSTOPped when the database was
// at seq before) for histPause, past its lease, and until the other
// replicas' retention pruned every event after before: its subscribers
// can only be told of those events by an announced gap. It submits
// through the live replicas meanwhile so that there are such events.
func (r *histRig) pausePastPrune(paused int, before uint64) {
	start := time.Now()
	for n := 0; ; n++ {
		var oldest uint64
		if err := r.db.QueryRow(r.ctx, oldestRetainedSQL).Scan(&oldest); err != nil {
			r.t.Fatal(err)
		}
		if time.Since(start) >= histPause && oldest > before+1 {
			r.t.Logf("fault: the log is pruned up to seq %d, past replica %d's position (at most %d)", oldest-1, paused, before)
			return
		}
		if time.Since(start) > 3*histPause {
			r.t.Fatalf("the live replicas did not prune past seq %d within %v (oldest retained %d)", before, 3*histPause, oldest)
		}
		if g := r.gw((paused + 1 + n%2) % histReplicas); g != nil {
			ctx, cancel := context.WithTimeout(r.ctx, histReqT)
			b, _ := json.Marshal(map[string]any{"content": b64(fmt.Appendf(nil, "written while replica %d is paused (%d)", paused, n)), "contentType": "text/plain"})
			_, _, _ = doJSON(ctx, "POST", g.baseURL()+"/v1/documents", b, "application/json")
			cancel()
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// oldestRetainedSQL is the oldest seq the shared log retains (pgstore
// keeps events as blocks; floor_seq hides a straddling block's pruned
// ones), 0 for an empty log.
const oldestRetainedSQL = `SELECT greatest(coalesce((SELECT min(first_seq) FROM event_blocks), 0), floor_seq) FROM meta WHERE id = 1`

// ---- after the run ----

// drain redeems the ISSUED claims of the open documents (through every
// replica in turn) until every acknowledged document is terminal.
func (r *histRig) drain(within time.Duration) {
	r.mu.Lock()
	ids := make([]string, len(r.docs))
	for i, d := range r.docs {
		ids[i] = d.id
	}
	r.mu.Unlock()
	deadline := time.Now().Add(within)
	rng := rand.New(rand.NewPCG(r.seed, 2<<32))
	for {
		var open []string
		if err := r.db.QueryRow(r.ctx, "SELECT coalesce(array_agg(id), '{}') FROM documents WHERE id = ANY($1) AND NOT terminal", ids).Scan(&open); err != nil {
			r.t.Fatal(err)
		}
		if len(open) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d acknowledged documents not terminal within %v after the workload: %v", len(open), len(ids), within, open[:min(len(open), 10)])
		}
		var claims []string
		if err := r.db.QueryRow(r.ctx, "SELECT coalesce(array_agg(claim_id), '{}') FROM claims WHERE doc_id = ANY($1) AND state = 1", open).Scan(&claims); err != nil {
			r.t.Fatal(err)
		}
		for _, c := range claims {
			for i := range histReplicas {
				if r.redeem(rng, i, c) {
					break
				}
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// awaitSubscribers waits until every subscriber reached the database's
// last seq and returns it.
func (r *histRig) awaitSubscribers(within time.Duration) uint64 {
	var last uint64
	if err := r.db.QueryRow(r.ctx, "SELECT last_seq FROM meta").Scan(&last); err != nil {
		r.t.Fatal(err)
	}
	for _, s := range r.subs {
		waitFor(r.t, fmt.Sprintf("replica %d's %s subscriber to reach seq %d", s.replica, s.transport, last), within,
			func() bool { return s.lastSeq() >= last })
	}
	return last
}

// checkSubscribers checks each subscriber's history (gapless, or every
// gap announced before the next event; a resumption replays its cursor's
// event or announces that it is gone) and that all agree on each seq. It
// returns the union of the events seen, by seq.
func (r *histRig) checkSubscribers() map[uint64]histEvent {
	union := map[uint64]histEvent{}
	gaps := 0
	for _, s := range r.subs {
		name := fmt.Sprintf("replica %d %s", s.replica, s.transport)
		s.mu.Lock()
		var last uint64
		resuming, announced := false, false
		for _, o := range s.log {
			if o.start {
				resuming, announced = o.cursor > 0, o.cursor == 0 // cursor 0 starts at the oldest retained
				continue
			}
			ev := o.ev
			if ev.gapNotice() {
				announced = true
				gaps++
				continue
			}
			if ev.Seq == 0 {
				continue
			}
			switch {
			case resuming && ev.Seq == last:
				resuming = false
				continue // the cursor's event, replayed
			case ev.Seq <= last:
				r.violation("%s: seq %d after %d (repeated or out of order)", name, ev.Seq, last)
			case ev.Seq != last+1 && !announced:
				r.violation("%s: silent gap: seq %d after %d without #info OutdatedCursor", name, ev.Seq, last)
			}
			resuming, announced = false, false
			last = max(last, ev.Seq)
			if prev, ok := union[ev.Seq]; ok && prev != ev {
				r.violation("seq %d differs between subscribers: %+v and (%s) %+v", ev.Seq, prev, name, ev)
			}
			union[ev.Seq] = ev
		}
		s.mu.Unlock()
	}
	r.t.Logf("%d gaps announced with #info OutdatedCursor across the subscribers", gaps)
	return union
}

// histFacts is what the delivered events say, keyed for the database
// checks.
type histFacts struct {
	docs   map[[2]string]bool // (document, state) of #document events
	ents   map[histEnt]bool   // #status events
	claims map[[2]string]bool // (claim, action) of #claim events
}

type histEnt struct {
	doc           string
	scope, entity uint32
	status        string
}

// checkDatabase checks the database's final states against the events:
// every document state, entity status (of the newest attempt) and claim
// state has its event; every terminal state and every redemption an event
// names is the database's.
func (r *histRig) checkDatabase(union map[uint64]histEvent, last uint64) {
	missing := 0
	for s := uint64(1); s <= last; s++ {
		if _, ok := union[s]; !ok {
			missing++
		}
	}
	if missing > 0 {
		r.violation("%d of the seqs 1..%d reached no subscriber on any replica (each is in the announced gaps of every one)", missing, last)
	}
	f := histFacts{docs: map[[2]string]bool{}, ents: map[histEnt]bool{}, claims: map[[2]string]bool{}}
	for _, e := range union {
		switch e.Kind {
		case "#document":
			f.docs[[2]string{e.Doc, e.State}] = true
		case "#status":
			f.ents[histEnt{e.Doc, e.ScopeID, e.EntityID, e.EntityStatus}] = true
		case "#claim":
			f.claims[[2]string{e.ClaimID, e.Action}] = true
		}
	}
	docs, ents, claims := r.checkDocuments(f), r.checkEntities(f), r.checkClaims(f)
	r.t.Logf("database: %d documents, %d entities (newest attempts), %d claims checked against the events", docs, ents, claims)
}

// scanRows runs q and calls row for every row's scanned values.
func (r *histRig) scanRows(q string, dest []any, row func()) {
	rows, err := r.db.Query(r.ctx, q)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			r.t.Fatal(err)
		}
		row()
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
}

func (r *histRig) checkDocuments(f histFacts) int {
	db := map[string]string{}
	var id string
	var st int32
	r.scanRows("SELECT id, state FROM documents", []any{&id, &st}, func() {
		state := gatewayv1.State(st).String()
		db[id] = state
		if state != "PENDING" && !f.docs[[2]string{id, state}] {
			r.violation("document %s is %s in the database, but no #document event says so", id, state)
		}
	})
	for ds := range f.docs {
		if terminalState(ds[1]) && db[ds[0]] != ds[1] {
			r.violation("an event says document %s became %s; the database has %q", ds[0], ds[1], db[ds[0]])
		}
	}
	return len(db)
}

func (r *histRig) checkEntities(f histFacts) int {
	var doc string
	var scope, ent int64
	var st int32
	n := 0
	r.scanRows(`SELECT e.doc_id, e.scope_id, e.entity_id, e.status FROM entities e
		JOIN (SELECT doc_id, max(attempt) AS a FROM entities GROUP BY doc_id) m ON e.doc_id = m.doc_id AND e.attempt = m.a`,
		[]any{&doc, &scope, &ent, &st}, func() {
			n++
			es := histEnt{doc, uint32(scope), uint32(ent), gatewayv1.EntityStatus(st).String()}
			if !f.ents[es] {
				r.violation("entity %d (scope %d) of document %s is %s in the database, but no #status event says so", ent, scope, doc, es.status)
			}
		})
	return n
}

func (r *histRig) checkClaims(f histFacts) int {
	db := map[string]string{}
	var id string
	var st int32
	r.scanRows("SELECT claim_id, state FROM claims", []any{&id, &st}, func() {
		state := gatewayv1.ClaimCheck_ClaimState(st).String()
		db[id] = state
		want := map[string]string{"ISSUED": "issued", "REDEEMED": "redeemed", "EXPIRED": "expired"}[state]
		if want != "" && !f.claims[[2]string{id, want}] {
			r.violation("claim %s is %s in the database, but no #claim %s event says so", id, state, want)
		}
	})
	for ca := range f.claims {
		if ca[1] == "redeemed" && db[ca[0]] != "REDEEMED" {
			r.violation("an event says claim %s was redeemed; the database has %q", ca[0], db[ca[0]])
		}
	}
	return len(db)
}

// errorReasonOf is the ErrorInfo reason of a gRPC error, or "".
func errorReasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
