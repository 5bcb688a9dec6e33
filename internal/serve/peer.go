package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/pipestream/gateway/quicpeer/peer"
)

// connectPeer fills the peer fields of cfg.Bridge: with PeerAddr set, the
// CA read from PeerCAFile; otherwise it locks <data-dir>/peer and starts
// the embedded peer there, pinned. stop shuts the embedded peer down and
// releases its lock (a no-op for an external peer).
func (cfg *Config) connectPeer() (stop func(), err error) {
	b, log := &cfg.Bridge, cfg.Logger
	if b.PeerAddr != "" {
		if cfg.PeerCAFile == "" {
			return nil, errors.New("--peer needs --peer-ca FILE: the PEM CA or certificate that verifies the peer")
		}
		if b.PeerCAPEM, err = os.ReadFile(cfg.PeerCAFile); err != nil {
			return nil, fmt.Errorf("read --peer-ca: %w", err)
		}
		return func() {}, nil
	}
	if cfg.PeerCAFile != "" || b.PeerServerName != "" || cfg.PeerCertFile != "" {
		return nil, errors.New("--peer-ca, --peer-server-name and --peer-cert need --peer (the embedded peer is pinned and loopback-only)")
	}
	dir := filepath.Join(b.DataDir, "peer")
	lock, err := LockDataDir(dir, "embedded peer --data-dir")
	if err != nil {
		return nil, err
	}
	offer := peer.DefaultOffer(b.PreferProtobuf)
	embedded, err := peer.Start(peer.Options{
		ListenAddr: "127.0.0.1:0",
		DataDir:    dir,
		Logger:     log.With("component", "peer"),
		Offer:      &offer,
	})
	if err != nil {
		lock.Release()
		return nil, fmt.Errorf("start embedded peer: %w", err)
	}
	b.PeerAddr = embedded.Addr().String()
	b.PeerCAPEM = embedded.CertPEM()
	log.Info("embedded peer listening (QUIC, certificate pinned)", "addr", b.PeerAddr)
	return func() {
		defer lock.Release()
		pctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if err := embedded.Shutdown(pctx); err != nil {
			log.Warn("embedded peer shutdown", "error", err)
		}
	}, nil
}

// RunPeer runs a standalone PipeStream peer ('gateway peer') until ctx
// ends or the process gets SIGINT/SIGTERM: it locks opts.DataDir, starts
// the peer, and on the signal sends GOAWAY and drains accepted work within
// opts.DrainTimeout (plus 5 s to close). A second signal exits at once.
func RunPeer(ctx context.Context, opts peer.Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	lock, err := LockDataDir(opts.DataDir, "--data-dir")
	if err != nil {
		return err
	}
	defer lock.Release()
	ctx, stop := notifyContext(ctx, log)
	defer stop()
	srv, err := peer.Start(opts)
	if err != nil {
		return err
	}
	pin := opts.CertFile
	if pin == "" {
		pin = filepath.Join(opts.DataDir, peer.CertFileName)
	}
	log.Info("peer listening (QUIC)", "addr", srv.Addr().String(), "certificate", pin, "mutual_tls", opts.ClientCAs != nil)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), opts.DrainTimeout+5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
