package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	"github.com/pipestream/gateway/quicpeer"
)

// Bridge implements Service over one or several PipeStream peers. It owns
// the goroutines (connection managers, dispatcher, flusher, sweepers) and
// the public API; what document code may reach is its docEnv, which it
// embeds (docs/architecture.md, "Concurrency").
type Bridge struct {
	*docEnv
	*registry // the same as docEnv.reg

	cancel context.CancelFunc

	flushStop chan struct{} // closed to stop the flusher
	holdTimer *time.Timer   // wakes the flusher for held documents (guarded by mu)
	holdAt    time.Time
	flushWG   sync.WaitGroup
	// flushed is closed and replaced after every flush (guarded by mu):
	// callers that answer only once a change is durable wait on it
	// (waitDurable).
	flushed chan struct{}

	uploads sync.WaitGroup
}

// docEnv is everything the methods of a document (docRun) and of its
// attempts may reach: the options, the logger, the store, the event log,
// the metrics, the bridge's lifetime and goroutine accounting, the
// dispatcher's and the flusher's wake-ups, and the registry. It is not the
// Bridge: document code cannot call the bridge's own methods (its API, its
// loops), and internal/archtest-style TestDocumentCodeStaysDown fails if a
// docRun or attempt method names *Bridge.
type docEnv struct {
	reg *registry

	opts Options
	log  *slog.Logger
	st   Store
	ev   *eventlog.Log
	m    *metrics

	ctx context.Context // lives until Close
	wg  sync.WaitGroup  // every goroutine the bridge or its documents start

	kickCh  chan struct{} // dispatcher wake-up
	flushCh chan struct{} // flusher wake-up (never closed)
}

var _ Service = (*Bridge)(nil)

// New opens the store (Options.Store, or SQLite in DataDir), recovers
// non-terminal documents, and starts the peer connection manager (see
// Options).
func New(ctx context.Context, opts Options) (*Bridge, error) {
	m := newMetrics(opts.Registerer)
	peers, err := validate(&opts, m)
	if err != nil {
		if opts.Store != nil {
			opts.Store.Close()
		}
		return nil, err
	}
	st := opts.Store
	if st == nil {
		sq, err := sqlite.Open(ctx, opts.DataDir, sqlite.Options{Logger: opts.Logger, Registerer: opts.Registerer})
		if err != nil {
			return nil, fmt.Errorf("bridge: open store in %s: %w", opts.DataDir, err)
		}
		st = sq
	}
	eo := opts.EventLog
	if eo.Logger == nil {
		eo.Logger = opts.Logger
	}
	if eo.Registerer == nil {
		eo.Registerer = opts.Registerer
	}
	ev, err := eventlog.New(ctx, st, eo)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("bridge: open event log: %w", err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	reg := &registry{peers: peers, docs: map[string]*docRun{}, sessions: map[*sessState]struct{}{}}
	b := &Bridge{
		docEnv: &docEnv{
			reg: reg, opts: opts, log: opts.Logger, st: st, ev: ev, m: m, ctx: bctx,
			kickCh: make(chan struct{}, 1), flushCh: make(chan struct{}, 1),
		},
		registry:  reg,
		cancel:    cancel,
		flushStop: make(chan struct{}), flushed: make(chan struct{}),
	}
	b.flushWG.Add(1)
	go b.flushLoop()
	if err := b.recover(ctx); err != nil {
		b.shutdownStore()
		return nil, err
	}
	m.registerPeers(b, opts.Registerer)
	b.wg.Add(3 + len(peers))
	for _, pc := range peers {
		go b.connLoop(bctx, pc)
	}
	go b.dispatchLoop(bctx)
	go b.claimSweeper(bctx)
	go b.superviseLoop(bctx)
	if l, ok := st.(Leaser); ok {
		b.wg.Add(1)
		go b.takeoverLoop(bctx, l)
	}
	return b, nil
}

// validate fills opts and builds the peers (their TLS configuration).
func validate(opts *Options, m *metrics) ([]*peerConn, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	return newPeers(opts, m)
}

// fill validates Options and applies defaults.
func (o *Options) fill() error {
	if o.DataDir == "" {
		return invalidf("Options.DataDir is required (the SQLite file, spool and results live there)")
	}
	if err := o.fillPeers(); err != nil {
		return err
	}
	if o.InlineThreshold < 0 || o.MaxDocumentBytes < 0 || o.MaxDispatchAttempts < 0 {
		return invalidf("Options limits must not be negative")
	}
	if o.InlineThreshold == 0 {
		o.InlineThreshold = defaultInlineThreshold
	}
	if o.InlineThreshold > maxWholeBytes {
		return invalidf("Options.InlineThreshold %d exceeds %d", o.InlineThreshold, maxWholeBytes)
	}
	if o.MaxDocumentBytes == 0 {
		o.MaxDocumentBytes = defaultMaxDocumentBytes
	}
	if o.MaxDispatchAttempts == 0 {
		o.MaxDispatchAttempts = defaultMaxDispatchAttempts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.PeerWait < 0 {
		return invalidf("Options.PeerWait must not be negative")
	}
	if o.PeerWait == 0 {
		o.PeerWait = defaultPeerWait
	}
	if o.CreateHold > maxCreateHold {
		return invalidf("Options.CreateHold %v: a Submit waits this long at most; use up to %v (0: the default %v, negative: off)", o.CreateHold, maxCreateHold, defaultCreateHold)
	}
	if o.CreateHold == 0 {
		o.CreateHold = defaultCreateHold
	}
	if o.PeerIdleTimeout < 0 {
		return invalidf("Options.PeerIdleTimeout must not be negative")
	}
	if o.PeerIdleTimeout == 0 {
		o.PeerIdleTimeout = quicpeer.DefaultIdleTimeout
	}
	if o.PeerDraft04Conns < 0 || o.PeerDraft04Conns > maxDraft04Conns {
		return invalidf("Options.PeerDraft04Conns %d: use 1 to %d (0: the default %d)", o.PeerDraft04Conns, maxDraft04Conns, defaultDraft04Conns)
	}
	if o.PeerDraft04Conns == 0 {
		o.PeerDraft04Conns = defaultDraft04Conns
	}
	return nil
}

// Ready reports whether some peer takes work: a session is up, or a
// draft-04 peer answered (it gets a connection per document).
func (b *Bridge) Ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return fmt.Errorf("bridge is shutting down: %w", ErrUnavailable)
	}
	if b.anyPeerReadyLocked() {
		return nil
	}
	why := make([]string, 0, len(b.peers))
	for _, pc := range b.peers {
		if pc.lastErr != "" {
			why = append(why, fmt.Sprintf("no session to the PipeStream peer %s: %s", pc.addr, pc.lastErr))
		} else {
			why = append(why, fmt.Sprintf("no session to the PipeStream peer %s (dialing)", pc.addr))
		}
	}
	return fmt.Errorf("%s: %w", strings.Join(why, "; "), ErrUnavailable)
}

// Close stops intake, sends GOAWAY on every session, drains within ctx,
// flushes state and closes the event log and the store.
func (b *Bridge) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closing {
		b.mu.Unlock()
		return nil
	}
	b.closing = true
	b.mu.Unlock()
	b.uploads.Wait() // uploads in progress finish (or fail) first
	b.mu.Lock()
	var ss []*sessState
	for s := range b.sessions {
		if s.s != nil {
			ss = append(ss, s)
		}
	}
	b.mu.Unlock()
	// Stop dialing and dispatching; sending goroutines end with the context.
	var wgDrain sync.WaitGroup
	for _, s := range ss {
		wgDrain.Add(1)
		go func() {
			defer wgDrain.Done()
			// The drain ends early once the session has nothing but
			// documents waiting on durable claims (profile 6): the
			// session's own drain would wait for them, as the client's
			// cursor cannot pass a deferred root.
			dctx, stop := context.WithCancel(ctx)
			defer stop()
			go func() {
				t := time.NewTicker(drainPollInterval)
				defer t.Stop()
				for {
					select {
					case <-dctx.Done():
						return
					case <-t.C:
						if b.sessionWaitsOnlyOnClaims(s) {
							b.log.Info("bridge: GOAWAY drain done: the session's remaining documents wait only on claim checks")
							stop()
							return
						}
					}
				}
			}()
			if err := s.s.GoAway(dctx); err != nil && !errors.Is(err, context.Canceled) {
				b.log.Info("bridge: GOAWAY drain ended", "err", err)
			}
		}()
	}
	wgDrain.Wait()
	// Cancel under mu: hooks that start a goroutine (cancelRequested,
	// redeemedElsewhere) check the context and Add to wg under mu, so each
	// Add happens before the cancel and so before wg.Wait below (an Add
	// that races a Wait at zero is a WaitGroup misuse).
	b.mu.Lock()
	b.cancel()
	b.mu.Unlock()
	for _, s := range ss {
		_ = s.s.CloseWithError(0, "gateway shutting down")
		<-s.s.Done()
	}
	b.wg.Wait()
	b.mu.Lock()
	docs := make([]*docRun, 0, len(b.docs))
	for _, d := range b.docs {
		docs = append(docs, d)
	}
	if b.holdTimer != nil {
		b.holdTimer.Stop() // the last flush below commits held documents
	}
	b.mu.Unlock()
	eachDoc(b.reg, docs, nil, func(d *docRun) { d.att.stopFinishTimer() })
	return b.shutdownStore()
}

// shutdownStore flushes pending state and closes the event log and store.
func (b *Bridge) shutdownStore() error {
	close(b.flushStop)
	b.flushWG.Wait()
	err := b.ev.Close()
	if e := b.st.Close(); err == nil {
		err = e
	}
	return err
}

// kick wakes the dispatcher.
func (env *docEnv) kick() {
	select {
	case env.kickCh <- struct{}{}:
	default:
	}
	for _, pc := range env.reg.peers {
		select {
		case pc.connKick <- struct{}{}:
		default:
		}
	}
}

// kickFlush wakes the flusher.
func (env *docEnv) kickFlush() {
	select {
	case env.flushCh <- struct{}{}:
	default:
	}
}

// enqueueLocked queues d for dispatch.
func (d *docRun) enqueueLocked() {
	if d.queued || d.terminal() {
		return
	}
	d.queuedAt = time.Now()
	if d.waitSince.IsZero() {
		d.waitSince = d.queuedAt
	}
	d.env.regLock()
	d.queued = true
	d.env.reg.push(d)
	d.env.regUnlock()
	d.env.kick()
}

// dispatchLoop starts attempts for queued documents while a session is up,
// at most maxConcurrentDispatch at a time per peer (candidateRegLocked).
func (b *Bridge) dispatchLoop(ctx context.Context) {
	defer b.wg.Done()
	for {
		var job *attempt
		for job == nil {
			job = b.startAttempt()
			if job != nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-b.kickCh:
			}
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			job.runAttempt(nil)
		}()
	}
}

// claimSweeper marks ISSUED claims past their expiry EXPIRED.
func (b *Bridge) claimSweeper(ctx context.Context) {
	defer b.wg.Done()
	t := time.NewTicker(claimSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			b.sweepClaims(ctx)
		}
	}
}

// fillPeers checks the peer options and makes Options.Peers whole: the one
// peer of PeerAddr, PeerCAPEM and PeerServerName, or the list given.
func (o *Options) fillPeers() error {
	if len(o.Peers) > 0 {
		if o.PeerAddr != "" || len(o.PeerCAPEM) > 0 || o.PeerServerName != "" || o.PeerCAFile != "" {
			return invalidf("set Options.Peers or Options.PeerAddr/PeerCAPEM/PeerServerName, not both")
		}
		o.Peers = slices.Clone(o.Peers)
	} else {
		o.Peers = []PeerEndpoint{{Addr: o.PeerAddr, CAPEM: o.PeerCAPEM, ServerName: o.PeerServerName, CAFile: o.PeerCAFile}}
	}
	seen := map[string]bool{}
	for i, p := range o.Peers {
		what := "Options.PeerAddr"
		if len(o.Peers) > 1 {
			what = fmt.Sprintf("Options.Peers[%d]", i)
		}
		switch {
		case p.Addr == "":
			return invalidf("%s is required (UDP host:port of the PipeStream peer)", what)
		case len(p.CAPEM) == 0 && len(o.Peers) == 1:
			return invalidf("Options.PeerCAPEM is required (CA bundle or the peer's pinned certificate)")
		case len(p.CAPEM) == 0:
			return invalidf("%s.CAPEM is required (CA bundle or the peer's pinned certificate)", what)
		case seen[p.Addr]:
			return invalidf("%s: peer %s is listed twice", what, p.Addr)
		}
		seen[p.Addr] = true
	}
	return nil
}
