package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestTorture is the randomized torture test of issue 20 (docs/torture.md),
// in the spirit of FoundationDB's simulation and Jepsen: rounds, each from
// a seed, of a generated workload (tenants with their own tokens, document
// sizes, split strategies, processors, completion policies, cancels)
// against the real gateway binary and a pool of independent partner peers
// (torture_peer_test.go) whose behaviours and faults the seed draws; after
// every round a checker goes over the whole history (torture_check_test.go).
//
//	go test ./e2e -run TestTorture                          # CI: -torture.duration (75s)
//	go test ./e2e -run TestTorture -torture.duration=10m    # longer
//	go test ./e2e -run TestTorture -torture.seed=12345      # replay one round
//
// A failing round prints its seed and the command that replays it.
var (
	tortureSeed     = flag.Uint64("torture.seed", 0, "TestTorture: run the one round of this seed (0: new seeds until -torture.duration)")
	tortureDuration = flag.Duration("torture.duration", 75*time.Second, "TestTorture: start new rounds until this much time has passed")
	tortureLog      = flag.String("torture.log", "", "TestTorture: append one line per round (seed, duration, outcome) to this file")
	tortureKeepOn   = flag.Bool("torture.keepgoing", false, "TestTorture: start new rounds after a failed one (long runs)")
)

// tortureDeadlineMargin is what a round may still take after the last one
// started (the longest bound of a document, tDocPlan.bound, is under 3
// minutes), kept free before go test's -timeout.
const tortureDeadlineMargin = 3 * time.Minute

// tortureBehaviourPool is what the peers' behaviours are drawn from.
var tortureBehaviourPool = []tBehaviour{bOwnIDs, bSameID, bOutOfOrder, bStall, bCloseAtOnce, bD04Heartbeat, bD04NoHeartbeat}

func TestTorture(t *testing.T) {
	start := time.Now()
	budget := *tortureDuration
	if dl, ok := t.Deadline(); ok && time.Until(dl)-tortureDeadlineMargin < budget {
		// go test's -timeout (10m by default) would kill the binary
		// mid-round: stop starting rounds in time.
		budget = max(time.Until(dl)-tortureDeadlineMargin, time.Second)
		t.Logf("torture: -torture.duration %v capped to %v by go test's -timeout (give -timeout 0 or more for the whole duration)", *tortureDuration, budget.Round(time.Second))
	}
	seeds := 0
	for {
		seed := *tortureSeed
		if seed == 0 {
			seed = uint64(time.Now().UnixNano())
		}
		seeds++
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runTortureRound(t, seed) })
		// A round takes 15-60 s: none starts in the last 20 s of the budget.
		if (!ok && !*tortureKeepOn) || *tortureSeed != 0 || time.Since(start) >= budget-20*time.Second {
			break
		}
	}
	t.Logf("torture: %d round(s) in %v", seeds, time.Since(start).Round(time.Second))
}

// runTortureRound runs the round of seed and checks its history.
func runTortureRound(t *testing.T, seed uint64) {
	plan := genPlan(seed, tortureBehaviourPool)
	began := time.Now()
	t.Logf("torture round: %s", plan)
	t.Cleanup(func() {
		outcome := "ok"
		if t.Failed() {
			outcome = "FAILED"
			t.Logf("torture: round FAILED; replay it with: go test ./e2e -run 'TestTorture$' -torture.seed=%d -v", seed)
		}
		if *tortureLog != "" {
			line := fmt.Sprintf("%s seed=%d took=%v docs=%d peers=%v %s\n", began.UTC().Format(time.RFC3339), seed,
				time.Since(began).Round(time.Second), len(plan.docs), plan.peers, outcome)
			if f, err := os.OpenFile(*tortureLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				_, _ = f.WriteString(line)
				f.Close()
			}
		}
	})
	r := newTortureRig(t, plan)
	r.run()
	v := r.check()
	if *tortureLiveness {
		r.checkLiveness(began, func(format string, a ...any) { v = append(v, fmt.Sprintf(format, a...)) })
	}
	if len(v) > 0 {
		for i, s := range v {
			if i == 40 {
				t.Errorf("... and %d more violations", len(v)-i)
				break
			}
			t.Error(s)
		}
		if *tortureLog != "" { // keep the whole gateway log of a failed round beside the round log
			keep := filepath.Join(filepath.Dir(*tortureLog), fmt.Sprintf("gateway-%d.log", seed))
			if b, err := os.ReadFile(r.g.proc.logPath); err == nil && os.WriteFile(keep, b, 0o644) == nil {
				t.Logf("the gateway's whole log: %s", keep)
			}
		}
		r.ledger.mu.Lock()
		if len(r.ledger.errs) > 0 {
			t.Logf("the partners' own complaints: %s", strings.Join(r.ledger.errs, "; "))
		}
		r.ledger.mu.Unlock()
	}
	t.Logf("torture round %d: %s in %v", seed, r.summary(), time.Since(began).Round(100*time.Millisecond))
}

// tortureRig is one round's processes, peers, clients and history.
type tortureRig struct {
	t       *testing.T
	plan    tPlan
	ledger  *tLedger
	peers   []*tPeer
	g       *gatewayProc
	clients map[string]*tClient
	docs    []*tDoc
	events  *tEvents
}

func newTortureRig(t *testing.T, plan tPlan) *tortureRig {
	r := &tortureRig{t: t, plan: plan, ledger: &tLedger{}, clients: map[string]*tClient{}}
	var args []string
	for i, beh := range plan.peers {
		p := startTPeer(t, i, beh, plan.seed, r.ledger)
		r.peers = append(r.peers, p)
		args = append(args, "--peer", p.addr)
	}
	for _, p := range r.peers {
		args = append(args, "--peer-ca", p.caPath)
	}
	tokens := tortureTokens(t)
	args = append(args, "--auth-tokens", tokens.file, "--peer-wait", tortureTimes.peerWait.String(),
		"--rate-limit", "0", "--max-uploads-per-tenant", "0", "--max-downloads-per-tenant", "0",
		"--create-hold", plan.createHold.String())
	r.g = startGateway(t, gwOpts{args: args})
	conn, err := grpc.NewClient(r.g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for _, tenant := range tortureTenants {
		r.clients[tenant] = &tClient{tenant: tenant, token: tokens.byTenant[tenant],
			docs: gatewayv1.NewDocumentServiceClient(conn), events: gatewayv1.NewEventServiceClient(conn)}
	}
	return r
}

// tortureTimes are the gateway's and the checker's time bounds.
var tortureTimes = struct {
	peerWait time.Duration // --peer-wait
	idle     time.Duration // the gateway notices a silent peer within this (QUIC idle, docs/profile.md 8)
	slack    time.Duration // scheduling on a busy machine
}{peerWait: 20 * time.Second, idle: 15 * time.Second, slack: 30 * time.Second}

// maxDispatchAttempts is the gateway's default --max-dispatch-attempts.
const maxDispatchAttempts = 5

// bound is how long document d may take to reach a terminal state under
// its policy: waiting for a peer (--peer-wait), then at most
// maxDispatchAttempts attempts, each ended by timeout-ms per try (or by
// QUIC's idle timeout for a peer that vanished), the plain settle wait and
// the slack of a busy machine.
func (d tDocPlan) bound() time.Duration {
	per := time.Duration(d.timeoutMs) * time.Millisecond * time.Duration(d.maxRetries+1)
	per = max(per, tortureTimes.idle) + 2*time.Second
	return tortureTimes.peerWait + maxDispatchAttempts*per + tortureTimes.slack
}

// run subscribes to the event log, submits the workload, injects the
// faults, and waits until every document is terminal (or past its bound).
func (r *tortureRig) run() {
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(cancel)
	r.events = subscribeTortureEvents(ctx, r.t, r.clients)
	var wg sync.WaitGroup
	start := time.Now()
	for _, f := range r.plan.faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleepUntil(ctx, start.Add(f.at))
			r.inject(f)
		}()
	}
	for _, dp := range r.plan.docs {
		d := newTDoc(dp)
		r.docs = append(r.docs, d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleepUntil(ctx, start.Add(dp.at))
			r.clients[dp.tenant].submit(ctx, d, &wg)
		}()
	}
	wg.Wait()
	r.awaitTerminal(ctx)
	for _, d := range r.docs {
		if d.id == "" {
			continue
		}
		fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
		if err := r.clients[d.plan.tenant].fetch(fctx, d); err != nil {
			d.resultErr = fmt.Errorf("GetDocument: %w", err)
		}
		fcancel()
	}
	r.events.settle(r.docs)
}

func sleepUntil(ctx context.Context, at time.Time) {
	select {
	case <-time.After(time.Until(at)):
	case <-ctx.Done():
	}
}

// inject applies fault f to its peer.
func (r *tortureRig) inject(f tFaultPlan) {
	p := r.peers[f.peer]
	p.faultMu.Lock() // a kill that overlaps another on the same peer waits for its restart
	defer p.faultMu.Unlock()
	r.ledger.fault(f.peer, f.kind)
	switch f.kind {
	case fGraceful:
		p.closeAll()
	case fPause:
		p.pause(f.down)
	case fKill, fKillNewCert:
		p.kill()
		time.Sleep(f.down)
		if err := p.restart(f.kind == fKillNewCert); err != nil {
			r.ledger.complain("peer %d: restart after %s: %v", f.peer, f.kind, err)
		}
		r.ledger.fault(f.peer, "restarted")
	}
}

// awaitTerminal polls the documents until all are terminal or the latest
// bound has passed.
func (r *tortureRig) awaitTerminal(ctx context.Context) {
	deadline := time.Now()
	for _, d := range r.docs {
		if end := d.submitted.Add(d.plan.bound()); end.After(deadline) {
			deadline = end
		}
	}
	for time.Now().Before(deadline) {
		open := 0
		for _, d := range r.docs {
			if d.id == "" || (d.final != nil && isTerminal(d.final.GetState())) {
				continue
			}
			c := r.clients[d.plan.tenant]
			gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			doc, err := c.docs.GetDocument(c.ctx(gctx), &gatewayv1.GetDocumentRequest{Id: d.id})
			cancel()
			if err == nil {
				d.final = doc
			}
			if err != nil || !isTerminal(doc.GetState()) {
				open++
			}
		}
		if open == 0 {
			return
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

func isTerminal(s gatewayv1.State) bool {
	return s == gatewayv1.State_SUCCEEDED || s == gatewayv1.State_PARTIALLY_SUCCEEDED || s == gatewayv1.State_FAILED || s == gatewayv1.State_CANCELLED
}

// summary counts the final states.
func (r *tortureRig) summary() string {
	n := map[string]int{}
	for _, d := range r.docs {
		switch {
		case d.id == "":
			n["not accepted"]++
		case d.final == nil:
			n["unknown"]++
		case d.plan.deferred && d.redeemed:
			n["redeemed "+d.final.GetState().String()]++
		case d.final.GetResultAbsent():
			n[d.final.GetState().String()+" (no result)"]++
		default:
			n[d.final.GetState().String()]++
		}
	}
	got := map[int]int{}
	r.ledger.mu.Lock()
	for _, rc := range r.ledger.received {
		got[rc.peer]++
	}
	r.ledger.mu.Unlock()
	var peers []string
	for i, p := range r.peers {
		peers = append(peers, fmt.Sprintf("%d:%s %d conns %d entities", i, p.beh, p.connsSince(time.Time{}), got[i]))
	}
	why := map[string]int{}
	for _, d := range r.docs {
		if d.final != nil && d.final.GetState() == gatewayv1.State_FAILED {
			why[failureClass(d)]++
		}
	}
	return fmt.Sprintf("%v; failed: %v; peers [%s]", n, why, strings.Join(peers, ", "))
}

// failureClass is a short name for why d FAILED, for the round summary.
func failureClass(d *tDoc) string {
	e := d.final.GetError()
	for _, c := range []struct{ sub, name string }{
		{"timed out", "timeout"}, {"abandoned", "claim expired or abandoned"}, {"gave up after", "dispatch attempts"},
		{"peer-wait", "peer wait"}, {"completion policy", "policy"},
	} {
		if strings.Contains(e, c.sub) {
			return c.name
		}
	}
	return truncate(e, 60)
}

// tTokens are the tenants' bearer tokens and the --auth-tokens file.
type tTokens struct {
	file     string
	byTenant map[string]string
}

var (
	tortureTokensOnce sync.Once
	tortureTokensVal  tTokens
)

// tortureTokens makes a token per tenant with `gateway hash-token` (once
// per test binary: the hashing is deliberately slow).
func tortureTokens(t *testing.T) tTokens {
	tortureTokensOnce.Do(func() {
		var file strings.Builder
		byTenant := map[string]string{}
		for _, tenant := range tortureTenants {
			tok := tenant + "-" + uniq("torture")
			out, errb, code := run(t, clientTimeout, []byte(tok+"\n"), gatewayBinary(t), "hash-token", tenant)
			if code != 0 {
				t.Fatalf("gateway hash-token %s: exit %d: %s", tenant, code, errb)
			}
			file.Write(out)
			byTenant[tenant] = tok
		}
		path := filepath.Join(binDir, "torture-tokens.txt")
		if err := os.WriteFile(path, []byte(file.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		tortureTokensVal = tTokens{file: path, byTenant: byTenant}
	})
	if tortureTokensVal.file == "" {
		t.Fatal("the torture tokens could not be made (see the first round)")
	}
	return tortureTokensVal
}
