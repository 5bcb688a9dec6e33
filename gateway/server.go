package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway/h2guard"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Server runs the public API: a gRPC listener (DocumentService,
// EventService, grpc.health.v1, reflection) and an HTTP listener (the
// grpc-gateway REST mux dialing the gRPC listener, the streaming upload
// route, the WebSocket event stream, /healthz, /metrics, /openapi.json,
// /docs/). docs/architecture.md, "Public API" and "Security and limits".
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *grpcMetrics
	limits  *tenantLimits
	conns   *connLimiter // both listeners' connection caps
	// clientIDs bounds each tenant's tracked X-Client-Id values.
	clientIDs *clientIDs
	disk      *diskMonitor // nil without Config.DataDir

	grpc   *grpc.Server
	health *health.Server
	gwMux  *runtime.ServeMux
	http   *http.Server
	conn   *connPool // REST proxy streams -> gRPC listener, a lane per tenant (pool.go)
	// rest is the REST proxy's client: unary calls in-process through
	// the interceptor chain, streams over conn (inproc.go).
	rest *inprocConn
	// localChain is the stream interceptor chain the REST routes' event
	// subscriptions run through in-process (localstream.go); events
	// encodes their events once for all of them (eventcache.go).
	localChain []grpc.StreamServerInterceptor
	events     *eventCache
	// unaryMethods are the unary methods the gRPC listener serves as
	// client streams (wireErrorsDesc); unaryChain and streamChain are its
	// interceptor chains (listenerStream).
	unaryMethods map[string]struct{}
	unaryChain   grpc.UnaryServerInterceptor
	streamChain  []grpc.StreamServerInterceptor
	// admitNonce authenticates admittedHeader (preAdmitted): random per
	// server, never sent to a client.
	admitNonce string
	// proxyConns holds the local addresses of conn's TCP connections: the
	// gRPC listener sees them as peer addresses and leaves those streams'
	// stuck-consumer bound to the HTTP side (stuck.go).
	proxyConns sync.Map
	// h2Conns maps the remote address of a gRPC connection to its
	// h2guard.Conn; h2guard is both listeners' HTTP/2 abuse guard
	// (h2abuse.go).
	h2Conns sync.Map
	h2guard *h2guard.Guard

	grpcLis, httpLis net.Listener

	// streams is cancelled at shutdown so that watch, subscribe and
	// WebSocket streams end with Unavailable instead of holding
	// GracefulStop until its deadline.
	streams       context.Context
	cancelStreams context.CancelFunc
	// uploadsCut ends uploads still running near the shutdown deadline
	// (upload_shutdown.go).
	uploadsCut context.Context
	cutUploads context.CancelFunc

	draining  atomic.Bool
	started   atomic.Bool
	stopOnce  sync.Once
	bg        sync.WaitGroup // serve loops, health poller
	ws        sync.WaitGroup // WebSocket handlers (hijacked, not tracked by http.Server)
	serveErrs chan error
	stopPoll  chan struct{}
}

// New builds a Server from cfg (see Config for defaults). It registers the
// services but does not listen; call Start or Serve. The gRPC server's
// stream workers run from here on: call Shutdown to release a Server,
// started or not.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.CheckExposure(); err != nil {
		return nil, err
	}
	m, err := newGRPCMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("gateway: register metrics: %w", err)
	}
	if err := registerBuildInfo(cfg.Registry, ReadBuildInfo()); err != nil {
		return nil, fmt.Errorf("gateway: register metrics: %w", err)
	}
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger,
		metrics:    m,
		limits:     newTenantLimits(&cfg),
		serveErrs:  make(chan error, 2),
		stopPoll:   make(chan struct{}),
		admitNonce: newRequestID() + newRequestID(),
	}
	s.streams, s.cancelStreams = context.WithCancel(context.Background())
	s.uploadsCut, s.cutUploads = context.WithCancel(context.Background())
	s.clientIDs = newClientIDs(cfg.MaxClientIDsPerTenant, clientIDIdle)
	if cfg.DataDir != "" {
		s.disk = newDiskMonitor(cfg.DataDir, cfg.MinFreeDiskBytes)
	}
	s.conns = newConnLimiter(cfg.MaxConnsPerIP, cfg.MaxConns, func(why string) {
		m.rejected.WithLabelValues("connections_" + why).Inc()
	})
	if err := cfg.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pipestream_gateway_open_connections",
		Help: "Client connections open on the gRPC and HTTP listeners (counted against --max-conns).",
	}, func() float64 { return float64(s.conns.open()) })); err != nil {
		return nil, fmt.Errorf("gateway: register metrics: %w", err)
	}

	s.unaryMethods = map[string]struct{}{}
	s.unaryChain, s.streamChain = chainUnary(s.unaryInterceptors()), s.streamInterceptors()
	opts := []grpc.ServerOption{
		// recvCodec enforces --max-recv-msg-bytes and answers in the
		// house shape; grpc-go's own check is the hard stop (wireerrors.go).
		grpc.ForceServerCodecV2(newRecvCodec(cfg.MaxRecvMsgBytes)),
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgBytes + min(recvSlack, math.MaxInt-cfg.MaxRecvMsgBytes)),
		grpc.MaxSendMsgSize(cfg.MaxSendMsgBytes),
		// Unary methods are served as client streams that run the unary
		// chain themselves (wireErrorsDesc); a unary method registered
		// otherwise would still run it here.
		grpc.UnaryInterceptor(s.unaryChain),
		grpc.StreamInterceptor(s.listenerStream),
		// A :path that is not /service/method, or a call whose deadline
		// passed before it arrived, is answered in the house shape before
		// grpc-go refuses it (tapRequest).
		grpc.InTapHandle(s.tapRequest),
		grpc.NumStreamWorkers(streamWorkers),
	}
	opts = append(opts, grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		// Ping idle connections to find dead peers; let clients ping every
		// grpcKeepaliveMinTime even without streams (idle CLI watchers).
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.GRPCKeepaliveTime, Timeout: cfg.GRPCKeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcKeepaliveMinTime, PermitWithoutStream: true}))
	creds := insecure.NewCredentials()
	if cfg.GRPCTLS != nil {
		creds = credentials.NewTLS(cfg.GRPCTLS)
	}
	s.h2guard = s.newH2Guard()
	opts = append(opts, grpc.Creds(guardCreds{TransportCredentials: creds, s: s}), grpc.UnknownServiceHandler(unknownMethod))
	s.grpc = grpc.NewServer(opts...)
	s.rest = newInprocConn(s.unaryChain, cfg.MaxRecvMsgBytes, cfg.MaxSendMsgBytes)
	s.localChain, s.events = s.streamInterceptors(), &eventCache{}
	s.register(&gatewayv1.DocumentService_ServiceDesc, &documentService{s: s})
	s.register(&gatewayv1.EventService_ServiceDesc, &eventService{s: s})
	s.register(&longrunningpb.Operations_ServiceDesc, &operationsService{s: s})
	s.health = health.NewServer()
	s.grpc.RegisterService(s.wireErrorsDesc(&healthpb.Health_ServiceDesc), s.health)
	reflection.Register(s.grpc) // streams only: errorShapeStream receives through wireRecv
	m.known = knownMethods(s.grpc)
	s.setHealth()
	return s, nil
}

// Start listens (unless listeners were given), dials the gRPC listener for
// the REST proxy and serves both listeners in the background. It returns
// once both accept connections.
func (s *Server) Start() error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("gateway: Start called twice")
	}
	var err error
	if s.grpcLis = s.cfg.GRPCListener; s.grpcLis == nil {
		if s.grpcLis, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
			return fmt.Errorf("gateway: listen gRPC on %s: %w (pick a free port with --grpc-addr)", s.cfg.GRPCAddr, err)
		}
	}
	if s.httpLis = s.cfg.HTTPListener; s.httpLis == nil {
		if s.httpLis, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
			s.grpcLis.Close()
			return fmt.Errorf("gateway: listen HTTP on %s: %w (pick a free port with --http-addr)", s.cfg.HTTPAddr, err)
		}
	}
	creds := insecure.NewCredentials()
	if s.cfg.InternalDialTLS != nil {
		creds = credentials.NewTLS(s.cfg.InternalDialTLS)
	}
	s.conn, err = newConnPool(dialTarget(s.grpcLis.Addr()), s.streamTenant,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(s.dialProxyConn),
		grpc.WithInitialWindowSize(proxyStreamWindow),
		grpc.WithInitialConnWindowSize(proxyConnWindow),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(s.cfg.MaxSendMsgBytes),
			grpc.MaxCallSendMsgSize(s.cfg.MaxRecvMsgBytes)))
	if err != nil {
		s.grpcLis.Close()
		s.httpLis.Close()
		return fmt.Errorf("gateway: dial own gRPC listener: %w", err)
	}
	s.rest.streams = s.conn
	handler, err := s.httpHandler()
	if err != nil {
		s.conn.Close()
		s.grpcLis.Close()
		s.httpLis.Close()
		return err
	}
	s.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ConnContext:       guardContext,
		ConnState:         guardConnState,
		Protocols:         s.httpProtocols(),
	}

	s.bg.Add(3)
	go func() {
		defer s.bg.Done()
		if err := s.grpc.Serve(s.capped(s.grpcLis, false, nil)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.serveErrs <- fmt.Errorf("gateway: gRPC serve: %w", err)
		}
	}()
	go func() {
		defer s.bg.Done()
		err := s.serveHTTP()
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.serveErrs <- fmt.Errorf("gateway: HTTP serve: %w", err)
		}
	}()
	go func() {
		defer s.bg.Done()
		s.pollHealth()
	}()

	scheme := "http://"
	if s.cfg.HTTPTLS != nil {
		scheme = "https://"
	}
	s.log.Info("gateway listening", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(),
		"grpc_tls", s.cfg.GRPCTLS != nil, "http_tls", s.cfg.HTTPTLS != nil,
		"rest", scheme+s.HTTPAddr()+"/v1/documents", "docs", scheme+s.HTTPAddr()+"/docs/",
		"metrics", scheme+s.HTTPAddr()+"/metrics")
	if isNoAuth(s.cfg.Authenticator) {
		if isLoopback(s.GRPCAddr()) && isLoopback(s.HTTPAddr()) {
			s.log.Info("no authentication configured: listening on loopback only")
		} else {
			s.log.Warn("no authentication configured but listening beyond loopback (--insecure-no-auth): anyone who can reach these ports can use the API",
				"grpc", s.GRPCAddr(), "http", s.HTTPAddr())
		}
	}
	return nil
}

// serveHTTP serves the HTTP listener. Every connection, plaintext or
// TLS, is read through the request smuggling guard (smuggle.go), which
// sits above TLS; the TLS listener therefore offers HTTP/1.1 only (ALPN
// http/1.1: h2 would need its own framing checks and gains nothing for
// REST).
func (s *Server) serveHTTP() error {
	refusal := httpRefusals(s.conns.perIP, s.conns.total)
	if s.cfg.HTTPTLS != nil {
		refusal = nil // the client expects a TLS handshake
	}
	lis := s.capped(s.httpLis, true, refusal)
	if s.cfg.HTTPTLS == nil {
		lis = s.guardHTTP2(lis) // h2c: HTTP/2 control-frame budgets
	}
	if s.cfg.HTTPTLS != nil {
		tc := s.cfg.HTTPTLS.Clone()
		tc.NextProtos = []string{"http/1.1"}
		lis = tls.NewListener(lis, tc)
	}
	// The guard refuses a head over net/http's own limit (MaxHeaderBytes
	// plus its 4 KiB read slack) before net/http sees it, so every head
	// net/http would refuse is answered in the one shape (smuggle.go).
	return s.http.Serve(guardListener{Listener: lis, maxHead: http.DefaultMaxHeaderBytes + 4096})
}

// httpProtocols are the HTTP listener's protocols: plaintext speaks
// HTTP/1.1 and HTTP/2 with prior knowledge (h2c, RFC 9113 section 3.3;
// the deprecated Upgrade: h2c is answered in HTTP/1.1, which RFC 9113
// allows); TLS speaks HTTP/1.1 only (serveHTTP). An h2c connection starts
// with the preface "PRI * HTTP/2.0", which the smuggling guard parses as a
// request of HTTP major version 2 and stops inspecting (smuggle.go): the
// guard's ambiguities are HTTP/1 framing, HTTP/2 frames its own data.
func (s *Server) httpProtocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	if s.cfg.HTTPTLS == nil {
		p.SetUnencryptedHTTP2(true)
	}
	return &p
}

// Serve starts the server and blocks until ctx ends (then shuts down within
// shutdownTimeout) or a listener fails.
func (s *Server) Serve(ctx context.Context, shutdownTimeout time.Duration) error {
	if shutdownTimeout <= 0 {
		shutdownTimeout = DefaultShutdownTimeout
	}
	if err := s.Start(); err != nil {
		s.grpc.Stop() // its stream workers; nothing was served
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return errors.Join(err, s.cfg.Bridge.Close(sctx))
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-s.serveErrs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return errors.Join(serveErr, s.Shutdown(sctx))
}

// GRPCAddr is the gRPC listener's address ("" before Start).
func (s *Server) GRPCAddr() string {
	if s.grpcLis == nil {
		return ""
	}
	return s.grpcLis.Addr().String()
}

// HTTPAddr is the HTTP listener's address ("" before Start).
func (s *Server) HTTPAddr() string {
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// Shutdown stops the server within ctx: it stops intake (health
// NOT_SERVING, /healthz 503, new uploads refused), closes the bridge
// (uploads in progress finish, but those still running shortly before
// ctx's deadline are cut with a SHUTTING_DOWN status: upload_shutdown.go;
// then GOAWAY to the peer, drain),
// ends open event streams, then GracefulStop on gRPC (Stop when ctx ends)
// and Shutdown on HTTP (Close when ctx ends). Safe to call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	s.stopOnce.Do(func() {
		start := time.Now()
		s.draining.Store(true)
		s.health.Shutdown()
		close(s.stopPoll)
		s.log.Info("gateway shutting down: intake stopped")
		stopCut := s.scheduleUploadCut(ctx)
		defer stopCut()

		// The bridge drains within ctx; if it is still waiting (an upload
		// whose client stalls, say) when ctx ends, stopping gRPC below
		// cancels those calls and lets it finish.
		bridgeDone := make(chan error, 1)
		go func() { bridgeDone <- s.cfg.Bridge.Close(ctx) }()
		var bridgeErr error
		bridgeClosed := false
		select {
		case bridgeErr = <-bridgeDone:
			bridgeClosed = true
		case <-ctx.Done():
		}
		s.cancelStreams()
		s.cutUploads()

		if s.started.Load() {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				s.log.Warn("gRPC graceful stop timed out; closing remaining RPCs")
				s.grpc.Stop()
				<-done
			}
			if err := s.http.Shutdown(ctx); err != nil {
				s.http.Close()
				errs = append(errs, fmt.Errorf("gateway: HTTP shutdown: %w", err))
			}
			wsDone := make(chan struct{})
			go func() { s.ws.Wait(); close(wsDone) }()
			select {
			case <-wsDone:
			case <-ctx.Done():
			}
			s.conn.Close()
		} else {
			s.grpc.Stop()
		}
		if !bridgeClosed {
			select {
			case bridgeErr = <-bridgeDone:
			case <-time.After(time.Second):
				bridgeErr = errors.New("did not finish within the shutdown deadline")
			}
		}
		if bridgeErr != nil {
			errs = append(errs, fmt.Errorf("gateway: close bridge: %w", bridgeErr))
		}
		s.bg.Wait()
		s.log.Info("gateway stopped", "took", time.Since(start).Round(time.Millisecond))
	})
	return errors.Join(errs...)
}

// register registers a service on the gRPC server (its unary methods
// served as streams by wireErrorsDesc, so that a request grpc-go cannot
// read is answered in the one error shape) and for the REST proxy's in-process
// calls (which receive decoded messages).
func (s *Server) register(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(s.wireErrorsDesc(desc), impl)
	s.rest.register(desc, impl)
}

// streamTenant is the tenant whose proxy lane carries a stream: the one
// the HTTP side authenticated (admit), else the one the call's bearer
// token maps to (the WebSocket route authenticates in the gRPC call);
// false when neither is known, and the call will fail authentication.
func (s *Server) streamTenant(ctx context.Context) (bridge.Tenant, bool) {
	if t, ok := tenantFrom(ctx); ok {
		return t, true
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	in := metadata.NewIncomingContext(ctx, md)
	t, err := s.cfg.Authenticator.Authenticate(in, bearerToken(in))
	return t, err == nil
}

// setHealth mirrors bridge.Ready() into grpc.health.v1 for the server ("")
// and each service.
func (s *Server) setHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.cfg.Bridge.Ready() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	for _, svc := range []string{"", gatewayv1.DocumentService_ServiceDesc.ServiceName, gatewayv1.EventService_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(svc, st)
	}
}

func (s *Server) pollHealth() {
	t := time.NewTicker(healthPollInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopPoll:
			return
		case <-t.C:
			s.disk.poll()
			s.setHealth()
		}
	}
}

// ready reports why the server cannot take work (nil: it can).
func (s *Server) ready() error {
	if s.draining.Load() {
		return errors.New("shutting down")
	}
	return s.cfg.Bridge.Ready()
}

// streamContext derives a stream handler's context that also ends at
// shutdown; shuttingDown tells the two causes apart.
func (s *Server) streamContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.streams, cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *Server) shuttingDown() bool { return s.streams.Err() != nil }

// dialTarget turns a listener address into a grpc.NewClient target.
func dialTarget(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return fmt.Sprintf("passthrough:///127.0.0.1:%d", tcp.Port)
	}
	return "passthrough:///" + a.String()
}
