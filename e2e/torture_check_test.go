package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The torture test's checker: invariants over a round's whole history,
// the documents' final states and results, the event log as each tenant
// saw it, and what the peers received.
//
//  1. Each result is the function of its own document's content
//     (tortureProcess of the document's processor over its content).
//  2. No document sees another tenant's bytes: not in its result, and no
//     entity a peer received mixes documents.
//  3. Every document reaches a terminal state within its policy
//     (tDocPlan.bound); CANCELLED only when its client cancelled it;
//     PARTIALLY_SUCCEEDED never (every policy is STRICT); a result is
//     absent only where a peer that returns none took the document.
//     A document that names a processor other than passthrough or carries
//     request metadata never reaches a draft-04 peer, whose entity header
//     has no metadata (docs/profile.md 9.3): it would run as passthrough.
//  4. Every state change has its event: each tenant's event log holds, for
//     each of its documents, an unbroken revision chain whose #document
//     events end in the final state, one terminal state, at the end; and
//     no event of a document of another tenant.
//  8. The gateway refuses no partner result as duplicate, ambiguous or of
//     the wrong form (checkRefusals). (5-7 are the liveness invariants,
//     checkLiveness.)

// tEvents collects each tenant's event log from its start.
type tEvents struct {
	mu     sync.Mutex
	byDoc  map[string][]*gatewayv1.Event
	tenant map[string]string // document -> the tenant whose stream carried it
	errs   []string
	n      *notifier
}

func subscribeTortureEvents(ctx context.Context, t *testing.T, clients map[string]*tClient) *tEvents {
	e := &tEvents{byDoc: map[string][]*gatewayv1.Event{}, tenant: map[string]string{}, n: newNotifier()}
	var ready sync.WaitGroup
	for _, c := range clients {
		ready.Add(1)
		go e.follow(ctx, c, &ready)
	}
	ready.Wait()
	return e
}

// follow reads c's tenant's event stream from cursor 0 until ctx ends.
func (e *tEvents) follow(ctx context.Context, c *tClient, ready *sync.WaitGroup) {
	st, err := c.events.SubscribeEvents(c.ctx(ctx), &gatewayv1.SubscribeEventsRequest{Cursor: proto.Uint64(0)})
	ready.Done()
	if err != nil {
		e.fail("%s: SubscribeEvents: %v", c.tenant, err)
		return
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			if ctx.Err() == nil {
				e.fail("%s: event stream ended: %v", c.tenant, err)
			}
			return
		}
		if ev.GetName() == "OutdatedCursor" {
			e.fail("%s: the event log lost events of this round (OutdatedCursor)", c.tenant)
		}
		id := ev.GetDocumentId()
		if id == "" {
			continue
		}
		e.mu.Lock()
		e.byDoc[id] = append(e.byDoc[id], ev)
		if prev, ok := e.tenant[id]; ok && prev != c.tenant {
			e.errs = append(e.errs, fmt.Sprintf("document %s's events reached tenants %s and %s", id, prev, c.tenant))
		}
		e.tenant[id] = c.tenant
		e.n.wake()
		e.mu.Unlock()
	}
}

func (e *tEvents) fail(format string, a ...any) {
	e.mu.Lock()
	e.errs = append(e.errs, fmt.Sprintf(format, a...))
	e.n.wake()
	e.mu.Unlock()
}

// settle waits (at most 10 s) until every document's final state has
// reached its tenant's stream.
func (e *tEvents) settle(docs []*tDoc) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.n.waitFor(ctx, &e.mu, "the final events", func() bool {
		for _, d := range docs {
			if d.final == nil || !isTerminal(d.final.GetState()) {
				continue
			}
			if last := lastState(e.byDoc[d.id]); last != d.final.GetState() {
				return false
			}
		}
		return true
	})
}

func lastState(evs []*gatewayv1.Event) gatewayv1.State {
	s := gatewayv1.State_STATE_UNSPECIFIED
	for _, ev := range evs {
		if ev.GetKind() == "#document" {
			s = ev.GetState()
		}
	}
	return s
}

// check runs every invariant over the round; it returns the violations.
func (r *tortureRig) check() []string {
	var v []string
	bad := func(format string, a ...any) { v = append(v, fmt.Sprintf(format, a...)) }
	bySum := map[[32]byte]*tDoc{}
	for _, d := range r.docs {
		bySum[d.sum] = d
	}
	noResult := r.noResultSums()
	for _, d := range r.docs {
		r.checkDoc(d, noResult, bad)
	}
	r.checkEvents(bad)
	r.checkReceived(bySum, bad)
	r.checkRefusals(bad)
	return v
}

// checkRefusals: invariant 8. The partners send one result per entity,
// always in their own form (own-ids always with parent-id, same-id never),
// so the gateway refuses none of them as duplicate, ambiguous or of the
// wrong form; unmatched is allowed (a result that arrives after its
// document was cancelled, timed out or moved on). Read from /metrics.
func (r *tortureRig) checkRefusals(bad func(string, ...any)) {
	resp, err := http.Get(r.g.baseURL() + "/metrics")
	if err != nil {
		bad("/metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "pipestream_bridge_results_refused_total{reason=\"")
		if !ok {
			continue
		}
		reason, val, _ := strings.Cut(rest, "\"} ")
		if n, _ := strconv.ParseFloat(val, 64); n > 0 && reason != "unmatched" {
			bad("the gateway refused %v results of the partners as %s (pipestream_bridge_results_refused_total; see its log)", n, reason)
		}
	}
}

// noResultSums are the content sums of whole entities that a peer which
// returns no result (the draft-04 reference conversation) received.
func (r *tortureRig) noResultSums() map[[32]byte]bool {
	out := map[[32]byte]bool{}
	r.ledger.mu.Lock()
	defer r.ledger.mu.Unlock()
	for _, rc := range r.ledger.received {
		if r.plan.peers[rc.peer].draft04() {
			out[rc.sum] = true
		}
	}
	return out
}

// checkDoc: invariants 1-3 for one document.
func (r *tortureRig) checkDoc(d *tDoc, noResult map[[32]byte]bool, bad func(string, ...any)) {
	p := d.plan
	name := fmt.Sprintf("document %d (%s, %s, %d octets, %s/%d, %s)", p.n, d.id, p.tenant, p.size, p.strategy, p.chunkBytes, p.processor)
	if d.id == "" {
		bad("%s: not accepted: %v", name, d.submitErr)
		return
	}
	if (p.processor != "passthrough" || p.deferred) && noResult[d.sum] {
		bad("%s: a draft-04 peer received it whole, without the metadata that names its processor or asks a deferral", name)
	}
	f := d.final
	if f == nil {
		bad("%s: its final state could not be read: %v", name, d.resultErr)
		return
	}
	s := f.GetState()
	if !isTerminal(s) {
		bad("%s: still %s (wait reason %q) %v after its submission, past its bound %v", name, s, f.GetWaitReason(),
			time.Since(d.submitted).Round(time.Second), p.bound())
		return
	}
	if took := f.GetFinishTime().AsTime().Sub(f.GetCreateTime().AsTime()); took > p.bound() {
		bad("%s: %s after %v, past its bound %v", name, s, took.Round(time.Second), p.bound())
	}
	switch s {
	case gatewayv1.State_CANCELLED:
		if !d.cancelled && p.cancelAfter == 0 {
			bad("%s: CANCELLED, but its client never cancelled it", name)
		}
	case gatewayv1.State_FAILED:
		if f.GetError() == "" {
			bad("%s: FAILED without an error", name)
		}
	case gatewayv1.State_PARTIALLY_SUCCEEDED:
		bad("%s: PARTIALLY_SUCCEEDED under a STRICT policy (%q)", name, f.GetError())
	case gatewayv1.State_SUCCEEDED:
		r.checkResult(name, d, noResult, bad)
	}
}

// checkResult: invariants 1 and 2 for a SUCCEEDED document.
func (r *tortureRig) checkResult(name string, d *tDoc, noResult map[[32]byte]bool, bad func(string, ...any)) {
	if d.final.GetResultAbsent() {
		if !noResult[d.sum] {
			bad("%s: SUCCEEDED with no result, but no peer that returns none took it whole", name)
		}
		return
	}
	if d.resultErr != nil {
		bad("%s: SUCCEEDED, but its result could not be read: %v", name, d.resultErr)
		return
	}
	want := tortureProcess(d.plan.processor, d.content)
	if bytes.Equal(d.result, want) {
		return
	}
	for _, other := range tortureTenants {
		if other != d.plan.tenant && bytes.Contains(bytes.ToLower(d.result), []byte("tenant="+other+" ")) {
			bad("%s: its result holds tenant %s's bytes", name, other)
			return
		}
	}
	bad("%s: wrong result: %d octets, want %d (%s)", name, len(d.result), len(want), firstDiff(d.result, want))
}

// firstDiff describes where got and want part.
func firstDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	end := func(b []byte) string {
		return strconv.Quote(string(b[i:min(len(b), i+60)]))
	}
	return fmt.Sprintf("first difference at octet %d: got %s, want %s", i, end(got), end(want))
}

// checkEvents: invariant 4.
func (r *tortureRig) checkEvents(bad func(string, ...any)) {
	e := r.events
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.errs {
		bad("event log: %s", s)
	}
	mine := map[string]*tDoc{}
	for _, d := range r.docs {
		if d.id != "" {
			mine[d.id] = d
		}
	}
	for id, tenant := range e.tenant {
		if d, ok := mine[id]; !ok {
			bad("event log: tenant %s got events of document %s, which no client of this round submitted", tenant, id)
		} else if d.plan.tenant != tenant {
			bad("event log: tenant %s got events of %s's document %s", tenant, d.plan.tenant, id)
		}
	}
	for _, d := range r.docs {
		if d.id == "" || d.final == nil {
			continue
		}
		checkDocEvents(fmt.Sprintf("document %d (%s)", d.plan.n, d.id), e.byDoc[d.id], d.final, bad)
	}
}

// checkDocEvents checks one document's events against its final state.
func checkDocEvents(name string, evs []*gatewayv1.Event, final *gatewayv1.Document, bad func(string, ...any)) {
	if len(evs) == 0 {
		bad("%s: no events at all (final state %s)", name, final.GetState())
		return
	}
	// The subscription began before the first submission on a new
	// gateway: a document's first event is its creation (since 0).
	rev := uint64(0)
	var states []gatewayv1.State
	for _, ev := range evs {
		if ev.GetKind() == "#claim" && ev.GetRev() == 0 && ev.GetSince() == 0 {
			continue // a redemption's event, outside the revision chain (docs/architecture.md, Event log)
		}
		if ev.GetSince() != rev {
			bad("%s: event seq %d (%s %s%s) has since %d after rev %d: an event is missing", name, ev.GetSeq(), ev.GetKind(), ev.GetClaimAction(), ev.GetName(), ev.GetSince(), rev)
		}
		rev = ev.GetRev()
		if ev.GetKind() == "#document" {
			states = append(states, ev.GetState())
		}
	}
	if len(states) == 0 {
		bad("%s: no #document event (final state %s)", name, final.GetState())
		return
	}
	for i, s := range states {
		if isTerminal(s) && i != len(states)-1 {
			bad("%s: state events %v: terminal %s is not the last", name, states, s)
			return
		}
	}
	if last := states[len(states)-1]; last != final.GetState() {
		bad("%s: the last state event is %s, the document is %s (state events %v)", name, last, final.GetState(), states)
	}
	if rev != final.GetRev() {
		bad("%s: the events end at rev %d, the document is at rev %d", name, rev, final.GetRev())
	}
}

var markerRE = regexp.MustCompile(`tenant=([a-z]+) doc=([0-9]+) `)

// checkReceived: invariant 2 at the peers: every whole entity a peer read
// is one document's content, and every chunk lies inside the one document
// its lines name.
func (r *tortureRig) checkReceived(bySum map[[32]byte]*tDoc, bad func(string, ...any)) {
	byKey := map[string]*tDoc{}
	for _, d := range r.docs {
		byKey[d.plan.tenant+"/"+strconv.Itoa(d.plan.n)] = d
	}
	r.ledger.mu.Lock()
	defer r.ledger.mu.Unlock()
	for _, rc := range r.ledger.received {
		where := fmt.Sprintf("peer %d (%s) entity %d", rc.peer, r.plan.peers[rc.peer], rc.id)
		if rc.chunk == nil {
			if bySum[rc.sum] == nil {
				bad("%s: a whole entity that is no document's content", where)
			}
			continue
		}
		ms := markerRE.FindAllSubmatch(rc.payload, -1)
		if len(ms) == 0 {
			continue // a chunk too small to name its document
		}
		key := string(ms[0][1]) + "/" + string(ms[0][2])
		for _, m := range ms[1:] {
			if k := string(m[1]) + "/" + string(m[2]); k != key {
				bad("%s: chunk %d mixes documents %s and %s", where, rc.chunk.Index, key, k)
				break
			}
		}
		if d := byKey[key]; d == nil || !bytes.Contains(d.content, rc.payload) {
			bad("%s: chunk %d is not a part of document %s", where, rc.chunk.Index, key)
		}
	}
}

// tortureLiveness turns on the liveness invariants whose fixes are issue
// 20's items 3, 4 and 6 (framing learning, session backoff, many peers of
// different kinds, --peer-ca re-read):
//
//  5. A peer that closes every session at once sees at most 3 connections
//     a second over the round (backoff on sessions, not only dials).
//  6. Every peer whose behaviour takes documents (all but close-at-once)
//     and that was not killed receives at least one entity in a round of
//     20 documents or more:
//     placement spreads work over every healthy peer, a draft-04 peer
//     with or without heartbeat and a peer back with a new certificate
//     included.
//  7. After the round, /healthz shows every such peer connected or idle.
var tortureLiveness = flag.Bool("torture.liveness", true, "TestTorture: also check the liveness invariants 5-7 (docs/torture.md; -torture.liveness=false: safety only)")

// maxReconnectsPerSecond is invariant 5's bound.
const maxReconnectsPerSecond = 3

// checkLiveness: invariants 5-7.
func (r *tortureRig) checkLiveness(began time.Time, bad func(string, ...any)) {
	secs := time.Since(began).Seconds()
	got := map[int]int{}
	r.ledger.mu.Lock()
	for _, rc := range r.ledger.received {
		got[rc.peer]++
	}
	r.ledger.mu.Unlock()
	for i, p := range r.peers {
		if p.beh == bCloseAtOnce {
			if n := p.connsSince(began); float64(n) > maxReconnectsPerSecond*secs {
				bad("peer %d (%s): %d connections in %.0f s, more than %d a second", i, p.beh, n, secs, maxReconnectsPerSecond)
			}
			continue
		}
		if len(r.plan.docs) >= 20 && got[i] == 0 && !r.killed(i) {
			bad("peer %d (%s): received no entity of the round's %d documents", i, p.beh, len(r.plan.docs))
		}
	}
	r.checkHealth(bad)
}

// killed reports whether peer i was killed in the round: then the gateway
// may rightly have given its share to the others while it waited out
// QUIC's idle timeout toward the dead session (invariant 7 still wants it
// back).
func (r *tortureRig) killed(i int) bool {
	for _, f := range r.plan.faults {
		if f.peer == i && (f.kind == fKill || f.kind == fKillNewCert) {
			return true
		}
	}
	return false
}

// checkHealth waits up to 20 s for /healthz to show every peer that takes
// documents connected or idle.
func (r *tortureRig) checkHealth(bad func(string, ...any)) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, b, err := doJSON(context.Background(), "GET", r.g.baseURL()+"/healthz", nil, "")
		var h struct{ Peers []healthPeer }
		if err == nil {
			err = json.Unmarshal(b, &h)
		}
		state := map[string]healthPeer{}
		for _, p := range h.Peers {
			state[p.Addr] = p
		}
		var wrong []string
		for i, p := range r.peers {
			if s := state[p.addr].State; p.beh != bCloseAtOnce && s != "connected" && s != "idle" {
				wrong = append(wrong, fmt.Sprintf("peer %d (%s) is %q (last error %q)", i, p.beh, s, state[p.addr].LastError))
			}
		}
		if err == nil && len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			bad("/healthz 20 s after the round: %v %s", err, strings.Join(wrong, "; "))
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}
