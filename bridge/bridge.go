package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/quicpeer"
)

// Bridge implements Service over one PipeStream peer.
type Bridge struct {
	opts Options
	log  *slog.Logger
	st   Store
	ev   *eventlog.Log
	m    *metrics
	tls  *tls.Config

	ctx    context.Context // lives until Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	kickCh    chan struct{} // dispatcher wake-up
	flushCh   chan struct{} // flusher wake-up (never closed)
	flushStop chan struct{} // closed to stop the flusher
	holdTimer *time.Timer   // wakes the flusher for held documents (guarded by mu)
	holdAt    time.Time
	flushWG   sync.WaitGroup

	mu       sync.Mutex
	closing  bool
	docs     map[string]*docRun // non-terminal documents (and finished ones until flushed)
	queue    []*docRun          // documents waiting for dispatch
	active   *sessState
	sessions map[*sessState]struct{}
	sessWake chan struct{} // closed when the active session should be replaced
	peer     peerState
	connKick chan struct{} // wakes a connection loop waiting for work (draft-04)
	uploads  sync.WaitGroup
}

var _ Service = (*Bridge)(nil)

// New opens the store (Options.Store, or SQLite in DataDir), recovers
// non-terminal documents, and starts the peer connection manager (see
// Options).
func New(ctx context.Context, opts Options) (*Bridge, error) {
	tc, err := validate(&opts)
	if err != nil {
		if opts.Store != nil {
			opts.Store.Close()
		}
		return nil, err
	}
	st := opts.Store
	if st == nil {
		sq, err := store.Open(ctx, opts.DataDir, store.Options{Logger: opts.Logger, Registerer: opts.Registerer})
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
	b := &Bridge{
		opts: opts, log: opts.Logger, st: st, ev: ev, m: newMetrics(opts.Registerer), tls: tc,
		ctx: bctx, cancel: cancel,
		kickCh: make(chan struct{}, 1), flushCh: make(chan struct{}, 1), flushStop: make(chan struct{}),
		docs: map[string]*docRun{}, sessions: map[*sessState]struct{}{},
		peer: peerState{framing: opts.PeerFraming}, connKick: make(chan struct{}, 1),
	}
	b.flushWG.Add(1)
	go b.flushLoop()
	if err := b.recover(ctx); err != nil {
		b.shutdownStore()
		return nil, err
	}
	b.wg.Add(4)
	go b.connLoop(bctx)
	go b.dispatchLoop(bctx)
	go b.claimSweeper(bctx)
	go b.superviseLoop(bctx)
	if l, ok := st.(Leaser); ok {
		b.wg.Add(1)
		go b.takeoverLoop(bctx, l)
	}
	return b, nil
}

// validate fills opts and builds the peer TLS configuration.
func validate(opts *Options) (*tls.Config, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	return tlsConfig(opts)
}

// fill validates Options and applies defaults.
func (o *Options) fill() error {
	if o.DataDir == "" {
		return invalidf("Options.DataDir is required (the SQLite file, spool and results live there)")
	}
	if o.PeerAddr == "" {
		return invalidf("Options.PeerAddr is required (UDP host:port of the PipeStream peer)")
	}
	if len(o.PeerCAPEM) == 0 {
		return invalidf("Options.PeerCAPEM is required (CA bundle or the peer's pinned certificate)")
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
	return nil
}

// Ready reports whether a peer session is up.
func (b *Bridge) Ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return fmt.Errorf("bridge is shutting down: %w", ErrUnavailable)
	}
	if b.activeSessionLocked() != nil || (b.peer.ok && b.peer.framing == quicpeer.FramingDraft04) {
		return nil // a draft-04 peer gets a connection per document
	}
	if b.peer.lastErr != "" {
		return fmt.Errorf("no session to the PipeStream peer %s: %s: %w", b.opts.PeerAddr, b.peer.lastErr, ErrUnavailable)
	}
	return fmt.Errorf("no session to the PipeStream peer %s (dialing): %w", b.opts.PeerAddr, ErrUnavailable)
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
	b.cancel()
	for _, s := range ss {
		_ = s.s.CloseWithError(0, "gateway shutting down")
		<-s.s.Done()
	}
	b.wg.Wait()
	b.mu.Lock()
	for _, d := range b.docs {
		d.att.stopFinishTimer()
	}
	if b.holdTimer != nil {
		b.holdTimer.Stop() // the last flush below commits held documents
	}
	b.mu.Unlock()
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
func (b *Bridge) kick() {
	select {
	case b.kickCh <- struct{}{}:
	default:
	}
	select {
	case b.connKick <- struct{}{}:
	default:
	}
}

// kickFlush wakes the flusher.
func (b *Bridge) kickFlush() {
	select {
	case b.flushCh <- struct{}{}:
	default:
	}
}

// enqueueLocked queues d for dispatch.
func (b *Bridge) enqueueLocked(d *docRun) {
	if d.queued || d.terminal() {
		return
	}
	d.queued = true
	d.queuedAt = time.Now()
	b.queue = append(b.queue, d)
	b.kick()
}

// dispatchLoop starts attempts for queued documents while a session is up,
// at most maxConcurrentDispatch at a time.
func (b *Bridge) dispatchLoop(ctx context.Context) {
	defer b.wg.Done()
	sem := make(chan struct{}, maxConcurrentDispatch)
	for {
		select {
		case <-ctx.Done():
			return
		case sem <- struct{}{}:
		}
		var job *attempt
		for job == nil {
			b.mu.Lock()
			job = b.startAttemptLocked()
			b.mu.Unlock()
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
			defer func() { <-sem }()
			b.runAttempt(job, nil)
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

// fileExists reports whether path exists.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
