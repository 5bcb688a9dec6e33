package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Server is a running processing peer: a quicpeer listener whose sessions
// are served by the processing engine (docs/profile.md).
type Server struct {
	opts    Options
	co      *core
	ln      *quicpeer.Listener
	certPEM []byte
	log     *slog.Logger

	acceptCtx    context.Context
	acceptCancel context.CancelFunc
	acceptDone   chan struct{}

	mu       sync.Mutex
	engines  map[*quicpeer.Session]*engine
	closing  bool
	shutOnce sync.Once
	shutErr  error
}

// Run starts a peer with opts and serves until ctx ends, then shuts down
// gracefully (GOAWAY, drain within opts.DrainTimeout, close 0x00). This is
// what `gateway peer` calls.
func Run(ctx context.Context, opts Options) error {
	s, err := Start(opts)
	if err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.DrainTimeout+5*time.Second)
	defer cancel()
	return s.Shutdown(sctx)
}

// Start validates opts, opens the claim store, loads or creates the
// certificate and starts listening. Addr and CertPEM tell a client (the
// gateway's embedded mode) where to dial and what to pin.
func Start(opts Options) (*Server, error) {
	o, lim, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	cert, certPEM, err := loadOrCreateCert(o)
	if err != nil {
		return nil, err
	}
	resetKey, err := loadOrCreateResetKey(o)
	if err != nil {
		return nil, err
	}
	work, err := prepareWorkDir(o.DataDir)
	if err != nil {
		return nil, err
	}
	claims, err := OpenClaimStore(o.DataDir, o.Logger, nil)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: o, certPEM: certPEM, log: o.Logger, engines: map[*quicpeer.Session]*engine{}, acceptDone: make(chan struct{})}
	s.co = &core{procs: o.Processors, claims: claims, yields: newYieldBook(nil), lim: lim,
		pool: make(chan struct{}, o.Workers), budget: semaphore.NewWeighted(lim.payloadBudget), work: work, log: o.Logger, now: time.Now}
	tlsConf := quicpeer.ServerTLS(cert)
	if o.ClientCAs != nil {
		tlsConf.ClientCAs = o.ClientCAs
		tlsConf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	ln, err := quicpeer.Listen(o.ListenAddr, quicpeer.Config{
		TLS: tlsConf, Offer: *o.Offer, Limits: o.Limits, Handler: handler{s}, Logger: o.Logger,
		StatelessResetKey: resetKey, Framing: o.Framing,
		Profile: true, // ALPNProfile: a gateway that offers it learns it may use the profile (docs/profile.md 1.1)
	})
	if err != nil {
		claims.Close()
		return nil, err
	}
	s.ln = ln
	s.acceptCtx, s.acceptCancel = context.WithCancel(context.Background())
	go s.acceptLoop()
	s.log.Info("peer listening", "addr", ln.Addr().String(), "data_dir", o.DataDir, "workers", o.Workers,
		"layer1", o.Offer.Layer1Recursive, "layer2", o.Offer.Layer2Resilience, "prefer_protobuf", o.Offer.SerializationFormat != nil && *o.Offer.SerializationFormat == wire.FormatProtobuf)
	return s, nil
}

// Addr is the bound UDP address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// CertPEM is the server certificate (PEM) for clients to pin.
func (s *Server) CertPEM() []byte { return append([]byte(nil), s.certPEM...) }

// acceptLoop keeps sessions flowing out of the listener; the engine of a
// session is created on its first callback (which may precede Accept).
func (s *Server) acceptLoop() {
	defer close(s.acceptDone)
	for {
		sess, err := s.ln.Accept(s.acceptCtx)
		if err != nil {
			return
		}
		s.engineFor(sess)
	}
}

// engineFor returns the engine of sess, creating it (and logging the
// session) on first use. It returns nil while the server shuts down and
// for a session that already ended.
func (s *Server) engineFor(sess *quicpeer.Session) *engine {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.engines[sess]; ok {
		return g
	}
	if s.closing {
		return nil
	}
	n := sess.Negotiated()
	neg := negotiation{layer1: n.Layer1, layer2: n.Layer2, format: n.Format, maxDepth: n.MaxDepth, maxPerScope: n.MaxPerScope, profile: n.Profile}
	log := s.log.With("session", sess.ID())
	g := newEngine(context.Background(), s.co, sess, neg, log)
	s.engines[sess] = g
	log.Info("session up", "layer1", n.Layer1, "layer2", n.Layer2, "format", n.Format.String(), "max_depth", n.MaxDepth,
		"max_per_scope", n.MaxPerScope, "max_window", n.MaxWindow, "keepalive", n.Keepalive)
	return g
}

// Shutdown stops accepting sessions, sends GOAWAY on every session, lets
// accepted work finish until ctx or the drain timeout ends, then closes
// every session with PIPESTREAM_NO_ERROR (docs/profile.md 7).
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() { s.shutErr = s.shutdown(ctx) })
	return s.shutErr
}

func (s *Server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	sessions := make([]*quicpeer.Session, 0, len(s.engines))
	for sess, g := range s.engines {
		if g.ctx.Err() == nil {
			sessions = append(sessions, sess)
		}
	}
	s.mu.Unlock()
	s.acceptCancel()
	<-s.acceptDone

	dctx, cancel := context.WithTimeout(ctx, s.opts.DrainTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var errs []error
	var emu sync.Mutex
	for _, sess := range sessions {
		wg.Go(func() {
			s.log.Info("goaway", "session", sess.ID(), "drain_timeout", s.opts.DrainTimeout)
			if err := sess.GoAway(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				emu.Lock()
				errs = append(errs, fmt.Errorf("session %s: %w", sess.ID(), err))
				emu.Unlock()
			}
		})
	}
	wg.Wait()
	err := s.ln.Close() // closes what is left with 0x00 and waits for HandleClose
	s.mu.Lock()
	engines := make([]*engine, 0, len(s.engines))
	for _, g := range s.engines {
		engines = append(engines, g)
	}
	s.mu.Unlock()
	for _, g := range engines {
		g.close(errSessionGone)
	}
	if cerr := s.co.claims.Close(); cerr != nil {
		errs = append(errs, cerr)
	}
	if err != nil {
		errs = append(errs, err)
	}
	s.log.Info("peer stopped", "sessions_drained", len(sessions))
	return errors.Join(errs...)
}

// handler adapts quicpeer.Handler callbacks to the session engines.
type handler struct{ s *Server }

func (h handler) HandleStatus(sess *quicpeer.Session, f wire.StatusFrame) {
	if g := h.s.engineFor(sess); g != nil {
		g.handleStatus(f)
	}
}

func (h handler) HandleScopeDigest(sess *quicpeer.Session, f wire.ScopeDigestFrame) {
	h.s.log.Debug("scope digest from the gateway ignored", "session", sess.ID(), "scope", f.ScopeID)
}

func (h handler) HandleBarrier(sess *quicpeer.Session, f wire.BarrierFrame) {
	h.s.log.Debug("barrier from the gateway", "session", sess.ID(), "scope", f.ScopeID, "parent", f.ParentEntityID, "released", f.Released)
}

func (h handler) HandleCheckpoint(sess *quicpeer.Session, f *wire.CheckpointFrame) {
	h.s.log.Debug("checkpoint from the gateway", "session", sess.ID(), "id", f.CheckpointID)
}

func (h handler) HandleGoAway(sess *quicpeer.Session, f wire.GoAwayFrame) {
	h.s.log.Info("goaway received", "session", sess.ID(), "last_entity", f.LastEntityID)
}

func (h handler) HandleEntity(sess *quicpeer.Session, e *quicpeer.IncomingEntity) {
	g := h.s.engineFor(sess)
	if g == nil {
		e.Abort(wire.CodeNoError)
		return
	}
	g.handleEntity(e.Header, e.Payload, e.Abort)
}

func (h handler) HandleClose(sess *quicpeer.Session, err error) {
	g := h.s.engineFor(sess)
	if g == nil {
		return
	}
	h.s.log.Info("session closed", "session", sess.ID(), "err", err)
	g.close(errSessionGone)
	// Keep the closed engine registered briefly so that late callbacks of
	// this session find it closed instead of creating a new one.
	time.AfterFunc(time.Minute, func() {
		h.s.mu.Lock()
		if h.s.engines[sess] == g {
			delete(h.s.engines, sess)
		}
		h.s.mu.Unlock()
	})
}
