// Package serve owns the lifecycle of the gateway process: it takes the
// data directory's lock, starts the embedded PipeStream peer (or checks the
// external one), the bridge and the gateway's listeners, and on
// SIGINT/SIGTERM drains and stops them in order. cmd/gateway only turns
// flags into a Config and calls Run (or RunPeer for 'gateway peer').
//
// Start order: data-dir lock, signal handling, pprof, authentication and
// TLS, peer (embedded or external), bridge, listeners. Stop order is the
// reverse: the listeners drain (gateway.Server.Serve, which closes the
// bridge on the way out), then the embedded peer shuts down, then the lock
// is released. See docs/architecture.md, "Process lifecycle".
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	"github.com/pipestream/gateway/internal/bench"
)

// Config is everything Run needs. The file fields name the command-line
// flags they come from, because their errors name those flags.
type Config struct {
	// Gateway configures the listeners and their limits. Run fills
	// Bridge, Registry, Authenticator (from AuthTokensFile) and the TLS
	// fields (from TLSCertFile/TLSKeyFile).
	Gateway gateway.Config
	// Bridge configures the bridge; Bridge.DataDir is the locked data
	// directory. Run fills Logger, Registerer, the peer client certificate
	// (from PeerCertFile/PeerKeyFile) and the peers' addresses and CAs:
	// from PeerAddrs (and PeerAddr) with PeerCAFiles (and PeerCAFile) when
	// a peer is given, else from the embedded peer it starts in
	// <DataDir>/peer. One peer fills PeerAddr/PeerCAPEM/PeerServerName,
	// several fill Bridge.Peers.
	Bridge bridge.Options
	// Logger is the process logger (default slog.Default()).
	Logger *slog.Logger

	PeerCAFile string // --peer-ca: PEM CA or certificate that verifies Bridge.PeerAddr (required with it)
	// PeerAddrs, PeerCAFiles and PeerServerNames are the repeated --peer,
	// --peer-ca and --peer-server-name, in command-line order (with
	// Bridge.PeerAddr, PeerCAFile and Bridge.PeerServerName appended when
	// set); MatchPeers says how they pair up.
	PeerAddrs, PeerCAFiles, PeerServerNames []string
	// PeerFramings is --peer-framing once per --peer, in the same order
	// (auto, draft-02 or draft-04); empty or one value: Bridge.PeerFraming
	// applies to every peer.
	PeerFramings   []string
	PeerCertFile   string // --peer-cert: PEM client certificate for mutual TLS toward the peer
	PeerKeyFile    string // --peer-key: its private key
	AuthTokensFile string // --auth-tokens: token file, reloaded on change and on SIGHUP (empty: no authentication)
	TLSCertFile    string // --tls-cert: PEM certificate chain for both listeners
	TLSKeyFile     string // --tls-key: its private key
	PprofAddr      string // --pprof-addr: loopback address for net/http/pprof (empty: off)
	// EmbeddedPeer is --embedded-peer-transport: how the bridge reaches
	// the embedded peer, "inproc" (the default when empty: quicpeer's
	// in-process transport) or "quic" (loopback UDP, pinned certificate);
	// set with external peers (--peer), Run refuses the configuration.
	EmbeddedPeer string

	// ShutdownTimeout bounds the graceful drain of the listeners and the
	// bridge, and then of the embedded peer.
	ShutdownTimeout time.Duration
}

// Run runs the gateway until ctx ends or the process gets SIGINT/SIGTERM,
// then drains gracefully within cfg.ShutdownTimeout; a second signal
// during the drain exits the process at once with status 1 (accepted work
// is durable in the store; a restart resumes it). Run returns nil after a
// clean stop and the first error that kept it from starting or stopping
// cleanly otherwise.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Gateway.Logger == nil {
		cfg.Gateway.Logger = cfg.Logger
	}
	log := cfg.Logger
	// The data dir's lock comes before anything in it is touched (the
	// bridge cleans the upload spool at start): a second gateway on the
	// same dir stops here, naming the holder.
	lock, err := LockDataDir(cfg.Bridge.DataDir, "--data-dir")
	if err != nil {
		return err
	}
	defer lock.Release()

	ctx, stop := notifyContext(ctx, log)
	defer stop()
	if cfg.PprofAddr != "" {
		addr, stopPprof, err := bench.ServePprof(cfg.PprofAddr)
		if err != nil {
			return err
		}
		defer stopPprof()
		log.Info("pprof listening", "addr", addr.String())
	}
	if err := cfg.security(ctx); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Bridge.Logger, cfg.Bridge.Registerer = log.With("component", "bridge"), reg
	if err := cfg.peerClientCert(); err != nil {
		return err
	}
	stopPeer, err := cfg.connectPeer()
	if err != nil {
		return err
	}
	defer stopPeer() // after the listeners and the bridge drained
	b, err := bridge.New(ctx, cfg.Bridge)
	if err != nil {
		return err
	}
	if cfg.Bridge.PeerCAFile != "" || len(cfg.Bridge.Peers) > 0 {
		reloadPeerCAsOnHUP(ctx, b, log)
	}
	cfg.Gateway.Bridge, cfg.Gateway.Registry = b, reg
	srv, err := gateway.New(cfg.Gateway)
	if err != nil {
		closeBridge(b, cfg.ShutdownTimeout)
		return err
	}
	return srv.Serve(ctx, cfg.ShutdownTimeout) // closes the bridge on the way out
}

// security loads the token file (watched until ctx ends) and the
// listeners' TLS files, then refuses an exposed listener without
// authentication.
func (cfg *Config) security(ctx context.Context) error {
	if cfg.AuthTokensFile != "" {
		tf, err := loadTokens(ctx, cfg.AuthTokensFile, cfg.Logger)
		if err != nil {
			return err
		}
		cfg.Gateway.Authenticator = tf
	}
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		tc, err := gateway.ServerTLSFiles(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return err
		}
		cfg.Gateway.GRPCTLS, cfg.Gateway.HTTPTLS, cfg.Gateway.InternalDialTLS = tc.GRPC, tc.HTTP, tc.InternalDial
	}
	return cfg.Gateway.CheckExposure()
}

func closeBridge(b *bridge.Bridge, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_ = b.Close(ctx)
}

// peerClientCert loads the client certificate presented to the peer
// (mutual TLS), if any.
func (cfg *Config) peerClientCert() (err error) {
	certFile, keyFile := cfg.PeerCertFile, cfg.PeerKeyFile
	if (certFile == "") != (keyFile == "") {
		return errors.New("set both --peer-cert and --peer-key, or neither")
	}
	if certFile == "" {
		return nil
	}
	if cfg.Bridge.PeerClientCertPEM, err = os.ReadFile(certFile); err != nil {
		return fmt.Errorf("read --peer-cert: %w", err)
	}
	if cfg.Bridge.PeerClientKeyPEM, err = os.ReadFile(keyFile); err != nil {
		return fmt.Errorf("read --peer-key: %w", err)
	}
	return nil
}
