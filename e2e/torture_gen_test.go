package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// The torture test's generator: one seed decides the peer pool (a
// behaviour per peer), the workload (tenants, document sizes, split
// strategies, processors, completion policies, cancels) and the faults
// with their times. Goroutine interleavings and the network are not under
// the seed (they are real), so a replay repeats the same schedule, not the
// same interleaving.

var tortureTenants = []string{"acme", "globex", "initech"}

// tPlan is one round of the torture test.
type tPlan struct {
	seed   uint64
	peers  []tBehaviour
	docs   []tDocPlan
	faults []tFaultPlan
	active time.Duration // how long submissions and faults go on
	// createHold is the gateway's --create-hold: how long a small
	// document's creation may wait to commit with its result (0: off).
	createHold time.Duration
}

type tDocPlan struct {
	n           int
	at          time.Duration // submit time after the round starts
	tenant      string
	size        int
	contentSeed uint64
	strategy    gatewayv1.SplitStrategy
	chunkBytes  uint32
	processor   string
	timeoutMs   uint32
	onTimeout   gatewayv1.CompletionPolicy_Action
	maxRetries  uint32
	cancelAfter time.Duration // 0: never cancelled
	// deferred: the peer is asked to defer the document (a claim check);
	// redeemAfter: when the client redeems the claim after it appears
	// (0: never, the claim expires).
	deferred    bool
	redeemAfter time.Duration
}

// Fault kinds.
const (
	fKill        = "kill"          // the socket drops (no CONNECTION_CLOSE), back after down
	fKillNewCert = "kill-new-cert" // as kill, back with a new certificate over --peer-ca
	fGraceful    = "graceful"      // every connection closed with 0x00, the listener stays
	fPause       = "pause"         // answers held for down (past timeoutMs at times), then sent late
)

type tFaultPlan struct {
	at   time.Duration
	peer int
	kind string
	down time.Duration
}

func (p tPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: peers [", p.seed)
	for i, beh := range p.peers {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%d:%s", i, beh)
	}
	fmt.Fprintf(&b, "], %d documents, faults [", len(p.docs))
	for i, f := range p.faults {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s(peer %d)@%v", f.kind, f.peer, f.at.Round(100*time.Millisecond))
	}
	fmt.Fprintf(&b, "], create-hold %v", p.createHold)
	return b.String()
}

// goodBehaviours answer every entity with a result; the pool has one at
// least, so work can always finish somewhere.
var goodBehaviours = []tBehaviour{bOwnIDs, bSameID, bOutOfOrder}

// genPlan draws a round from seed, with peer behaviours from pool.
func genPlan(seed uint64, pool []tBehaviour) tPlan {
	r := rand.New(rand.NewPCG(seed, 0x746f7274757265))
	p := tPlan{seed: seed, active: time.Duration(8+r.IntN(8)) * time.Second}
	npeers := 2 + r.IntN(3)
	p.peers = append(p.peers, goodBehaviours[r.IntN(len(goodBehaviours))])
	for len(p.peers) < npeers {
		p.peers = append(p.peers, pool[r.IntN(len(pool))])
	}
	r.Shuffle(len(p.peers), func(i, j int) { p.peers[i], p.peers[j] = p.peers[j], p.peers[i] })
	ndocs := 20 + r.IntN(40)
	for i := range ndocs {
		p.docs = append(p.docs, genDoc(r, i, p.active))
	}
	nfaults := r.IntN(4)
	for range nfaults {
		f := tFaultPlan{at: time.Duration(r.Int64N(int64(p.active))), peer: r.IntN(npeers),
			down: time.Duration(200+r.IntN(2500)) * time.Millisecond}
		f.kind = []string{fKill, fKillNewCert, fGraceful, fPause}[r.IntN(4)]
		if f.kind == fPause {
			f.down = time.Duration(1000+r.IntN(6000)) * time.Millisecond
		}
		p.faults = append(p.faults, f)
	}
	// Drawn from a generator of its own, so that the rest of a seed's
	// plan is what it was before the hold was drawn.
	hr := rand.New(rand.NewPCG(seed, 0x686f6c64))
	p.createHold = []time.Duration{0, 2 * time.Millisecond, 20 * time.Millisecond, 500 * time.Millisecond}[hr.IntN(4)]
	return p
}

func genDoc(r *rand.Rand, n int, active time.Duration) tDocPlan {
	d := tDocPlan{n: n, at: time.Duration(r.Int64N(int64(active))), tenant: tortureTenants[r.IntN(len(tortureTenants))],
		contentSeed: r.Uint64(), processor: []string{"passthrough", "textstats"}[r.IntN(2)],
		timeoutMs: uint32(3000 + r.IntN(4)*1000), maxRetries: uint32(r.IntN(3))}
	d.onTimeout = []gatewayv1.CompletionPolicy_Action{gatewayv1.CompletionPolicy_FAIL, gatewayv1.CompletionPolicy_RETRY}[r.IntN(2)]
	switch x := r.IntN(100); {
	case x < 65: // small, whole
		d.size = 16 + r.IntN(8<<10)
		d.strategy = []gatewayv1.SplitStrategy{gatewayv1.SplitStrategy_SPLIT_NONE, gatewayv1.SplitStrategy_SPLIT_STRATEGY_UNSPECIFIED}[r.IntN(2)]
	case x < 93: // medium, mostly split
		d.size = 8<<10 + r.IntN(248<<10)
		d.strategy = []gatewayv1.SplitStrategy{gatewayv1.SplitStrategy_SPLIT_STRATEGY_UNSPECIFIED, // whole below 1 MiB
			gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, gatewayv1.SplitStrategy_SPLIT_LINES, gatewayv1.SplitStrategy_SPLIT_PARAGRAPHS}[r.IntN(4)]
		d.chunkBytes = uint32(16<<10 + r.IntN(48<<10))
	default: // large: 1-3 MiB, 256 KiB - 1 MiB chunks (the issue's 3 MiB in 1 MiB)
		d.size = 1<<20 + r.IntN(2<<20)
		d.strategy = []gatewayv1.SplitStrategy{gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, gatewayv1.SplitStrategy_SPLIT_LINES,
			gatewayv1.SplitStrategy_SPLIT_PARAGRAPHS}[r.IntN(3)]
		d.chunkBytes = uint32([]int{256 << 10, 512 << 10, 1 << 20}[r.IntN(3)])
	}
	whole := d.strategy == gatewayv1.SplitStrategy_SPLIT_NONE || (d.strategy == gatewayv1.SplitStrategy_SPLIT_STRATEGY_UNSPECIFIED && d.size <= 1<<20)
	switch x := r.IntN(100); {
	case x < 10:
		d.cancelAfter = time.Duration(50+r.IntN(3000)) * time.Millisecond
	case x < 25 && whole:
		d.deferred = true
		if r.IntN(4) != 0 {
			d.redeemAfter = time.Duration(1+r.IntN(3000)) * time.Millisecond
		}
	}
	return d
}

// tortureContent is document d's content: lower-case ASCII lines (with
// paragraph breaks) that name the tenant and the document on every line,
// so a leaked byte range shows whose it is.
func tortureContent(d tDocPlan) []byte {
	r := rand.New(rand.NewPCG(d.contentSeed, uint64(d.n)))
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"}
	var b strings.Builder
	b.Grow(d.size + 128)
	for line := 0; b.Len() < d.size; line++ {
		fmt.Fprintf(&b, "tenant=%s doc=%d line=%d", d.tenant, d.n, line)
		for range 3 + r.IntN(12) {
			b.WriteString(" ")
			b.WriteString(words[r.IntN(len(words))])
		}
		b.WriteString(".\n")
		if r.IntN(8) == 0 {
			b.WriteString("\n")
		}
	}
	return []byte(b.String()[:d.size])
}

// tDoc is a document the workload submitted, and what happened to it.
type tDoc struct {
	plan      tDocPlan
	content   []byte
	sum       [32]byte
	id        string
	submitErr error
	submitted time.Time
	cancelled bool // the client asked to cancel
	claimID   string
	redeemed  bool  // the client's redemption was accepted
	redeemErr error // why it was not
	final     *gatewayv1.Document
	result    []byte
	resultErr error
}

// tClient is a tenant's gRPC client.
type tClient struct {
	tenant string
	token  string
	docs   gatewayv1.DocumentServiceClient
	events gatewayv1.EventServiceClient
}

func (c *tClient) ctx(parent context.Context) context.Context {
	return metadata.AppendToOutgoingContext(parent, "authorization", "Bearer "+c.token)
}

// submit sends d and, when planned, cancels it later.
func (c *tClient) submit(ctx context.Context, d *tDoc, wg *sync.WaitGroup) {
	p := d.plan
	req := &gatewayv1.SubmitDocumentRequest{Content: d.content, ContentType: "text/plain",
		RequestId:        fmt.Sprintf("torture-%d", p.n),
		Split:            &gatewayv1.SplitOptions{Strategy: p.strategy, ChunkBytes: p.chunkBytes, Processor: p.processor},
		CompletionPolicy: &gatewayv1.CompletionPolicy{TimeoutMs: p.timeoutMs, OnTimeout: p.onTimeout, MaxRetries: p.maxRetries}}
	if p.deferred {
		req.Metadata = map[string]string{tortureDeferKey: "1"}
	}
	d.submitted = time.Now()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	doc, err := c.docs.SubmitDocument(c.ctx(sctx), req)
	cancel()
	if err != nil {
		d.submitErr = err
		return
	}
	d.id = doc.GetId()
	if p.redeemAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.redeemLater(ctx, d)
		}()
	}
	if p.cancelAfter == 0 {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-time.After(p.cancelAfter):
		case <-ctx.Done():
			return
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := c.docs.CancelDocument(c.ctx(cctx), &gatewayv1.CancelDocumentRequest{Id: d.id}); err == nil {
			d.cancelled = true
		}
	}()
}

// fetch reads d's final state and, when it has one, its result.
func (c *tClient) fetch(ctx context.Context, d *tDoc) error {
	doc, err := c.docs.GetDocument(c.ctx(ctx), &gatewayv1.GetDocumentRequest{Id: d.id})
	if err != nil {
		return err
	}
	d.final = doc
	if s := doc.GetState(); (s != gatewayv1.State_SUCCEEDED && s != gatewayv1.State_PARTIALLY_SUCCEEDED) || doc.GetResultAbsent() {
		return nil
	}
	st, err := c.docs.GetDocumentResult(c.ctx(ctx), &gatewayv1.GetDocumentResultRequest{Id: d.id})
	if err != nil {
		d.resultErr = err
		return nil
	}
	var out []byte
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			d.resultErr = err
			return nil
		}
		out = append(out, m.GetData()...)
	}
	d.result = out
	return nil
}

func newTDoc(p tDocPlan) *tDoc {
	c := tortureContent(p)
	return &tDoc{plan: p, content: c, sum: sha256.Sum256(c)}
}

// redeemLater waits for d's claim check, then redeems it after
// plan.redeemAfter.
func (c *tClient) redeemLater(ctx context.Context, d *tDoc) {
	deadline := time.Now().Add(20 * time.Second)
	for d.claimID == "" && time.Now().Before(deadline) {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		doc, err := c.docs.GetDocument(c.ctx(gctx), &gatewayv1.GetDocumentRequest{Id: d.id})
		cancel()
		if err == nil {
			for _, cl := range doc.GetClaimChecks() {
				if cl.GetState() == gatewayv1.ClaimCheck_ISSUED {
					d.claimID = cl.GetClaimId()
				}
			}
			if isTerminal(doc.GetState()) {
				break
			}
		}
		if d.claimID == "" {
			sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
		}
	}
	if d.claimID == "" {
		return
	}
	sleepUntil(ctx, time.Now().Add(d.plan.redeemAfter))
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, d.redeemErr = c.docs.RedeemClaimCheck(c.ctx(rctx), &gatewayv1.RedeemClaimCheckRequest{ClaimId: d.claimID})
	d.redeemed = d.redeemErr == nil
}
