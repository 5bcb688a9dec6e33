package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
)

// PeerSpec is one external peer of the command line: its address, the CA
// file that verifies it and its TLS server name ("" for the host of Addr).
type PeerSpec struct {
	Addr, CAFile, ServerName string
	// Framing is its --peer-framing when given once per --peer ("": the
	// one of every peer, Bridge.PeerFraming).
	Framing string
}

// MatchFramings gives each peer of specs its --peer-framing when the flag
// is given once per --peer; given once (or not at all) it applies to every
// peer through Bridge.PeerFraming instead.
func MatchFramings(specs []PeerSpec, framings []string) error {
	if len(framings) <= 1 {
		return nil
	}
	if len(framings) != len(specs) {
		return fmt.Errorf("--peer-framing is given %d times for %d --peer: give it once (for every peer) or once per --peer, in the same order", len(framings), len(specs))
	}
	for i, f := range framings {
		if _, err := bridge.ParseFraming(f); err != nil {
			return fmt.Errorf("--peer-framing of --peer %s: %w", specs[i].Addr, err)
		}
		specs[i].Framing = f
	}
	return nil
}

// MatchPeers pairs the repeated --peer, --peer-ca and --peer-server-name:
// --peer-ca is given once (it verifies every peer) or once per --peer in
// the same order, and so is --peer-server-name (or not at all). Anything
// else is an error that says what to fix.
func MatchPeers(addrs, cas, names []string) ([]PeerSpec, error) {
	n := len(addrs)
	if n == 0 {
		return nil, nil
	}
	if len(cas) == 0 {
		return nil, errors.New("--peer needs --peer-ca FILE: the PEM CA or certificate that verifies the peer")
	}
	if len(cas) != 1 && len(cas) != n {
		return nil, fmt.Errorf("--peer-ca is given %d times for %d --peer: give it once (a CA bundle or pinned certificates that verify every peer) or once per --peer, in the same order", len(cas), n)
	}
	if len(names) > 1 && len(names) != n {
		return nil, fmt.Errorf("--peer-server-name is given %d times for %d --peer: give it once (for every peer) or once per --peer, in the same order", len(names), n)
	}
	out := make([]PeerSpec, n)
	seen := map[string]bool{}
	for i, a := range addrs {
		if a == "" || seen[a] {
			return nil, fmt.Errorf("--peer %q: each --peer is a distinct UDP host:port", a)
		}
		seen[a] = true
		out[i] = PeerSpec{Addr: a, CAFile: cas[min(i, len(cas)-1)]}
		if len(names) > 0 {
			out[i].ServerName = names[min(i, len(names)-1)]
		}
	}
	return out, nil
}

// peerLists are the peer flags of cfg as lists (the single-peer fields
// appended).
func (cfg *Config) peerLists() (addrs, cas, names []string) {
	add := func(l []string, v string) []string {
		if v != "" {
			l = append(slices.Clip(l), v)
		}
		return l
	}
	return add(cfg.PeerAddrs, cfg.Bridge.PeerAddr), add(cfg.PeerCAFiles, cfg.PeerCAFile), add(cfg.PeerServerNames, cfg.Bridge.PeerServerName)
}

// external fills the peer fields of cfg.Bridge from the external peers:
// PeerAddr, PeerCAPEM, PeerServerName and PeerCAFile for one, Peers for
// several. The bridge reads each --peer-ca file again before every dial
// and on SIGHUP (reloadPeerCAsOnHUP).
func (cfg *Config) external(specs []PeerSpec) error {
	b := &cfg.Bridge
	eps := make([]bridge.PeerEndpoint, 0, len(specs))
	for _, s := range specs {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return fmt.Errorf("read --peer-ca: %w", err)
		}
		ep := bridge.PeerEndpoint{Addr: s.Addr, CAPEM: pem, ServerName: s.ServerName, CAFile: s.CAFile}
		if s.Framing != "" {
			if ep.Framing, err = bridge.ParseFraming(s.Framing); err != nil {
				return fmt.Errorf("--peer-framing of --peer %s: %w", s.Addr, err)
			}
		}
		eps = append(eps, ep)
	}
	if len(eps) == 1 { // never a framing of its own (MatchFramings)
		b.PeerAddr, b.PeerCAPEM, b.PeerServerName, b.PeerCAFile = eps[0].Addr, eps[0].CAPEM, eps[0].ServerName, eps[0].CAFile
		return nil
	}
	b.PeerAddr, b.PeerCAPEM, b.PeerServerName, b.PeerCAFile, b.Peers = "", nil, "", "", eps
	return nil
}

// connectPeer fills the peer fields of cfg.Bridge: with external peers
// given, their addresses and the CAs read from the --peer-ca files;
// otherwise it locks <data-dir>/peer and starts the embedded peer there,
// pinned. stop shuts the embedded peer down and releases its lock (a
// no-op for external peers).
func (cfg *Config) connectPeer() (stop func(), err error) {
	b, log := &cfg.Bridge, cfg.Logger
	addrs, cas, names := cfg.peerLists()
	if len(addrs) > 0 {
		if cfg.EmbeddedPeer != "" {
			return nil, fmt.Errorf("--embedded-peer-transport %s applies to the embedded peer, which --peer replaces: drop one of the two", cfg.EmbeddedPeer)
		}
		specs, err := MatchPeers(addrs, cas, names)
		if err == nil {
			err = MatchFramings(specs, cfg.PeerFramings)
		}
		if err != nil {
			return nil, err
		}
		if err := cfg.external(specs); err != nil {
			return nil, err
		}
		return func() {}, nil
	}
	if len(cas) > 0 || len(names) > 0 || cfg.PeerCertFile != "" {
		return nil, errors.New("--peer-ca, --peer-server-name and --peer-cert need --peer (the embedded peer is pinned and loopback-only)")
	}
	listen, err := embeddedListenAddr(cfg.EmbeddedPeer)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.DataDir, "peer")
	lock, err := LockDataDir(dir, "embedded peer --data-dir")
	if err != nil {
		return nil, err
	}
	offer := peer.DefaultOffer(b.PreferProtobuf)
	embedded, err := peer.Start(peer.Options{
		ListenAddr: listen,
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
	log.Info("embedded peer listening", "addr", b.PeerAddr, "transport", cmp.Or(cfg.EmbeddedPeer, "inproc"))
	return func() {
		defer lock.Release()
		pctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if err := embedded.Shutdown(pctx); err != nil {
			log.Warn("embedded peer shutdown", "error", err)
		}
	}, nil
}

// embeddedListenAddr is where the embedded peer listens for transport
// (--embedded-peer-transport): in process, or QUIC on a loopback port.
func embeddedListenAddr(transport string) (string, error) {
	switch transport {
	case "", "inproc":
		return quicpeer.InProcessScheme + "0", nil
	case "quic":
		return "127.0.0.1:0", nil
	}
	return "", fmt.Errorf("--embedded-peer-transport %q: want inproc or quic", transport)
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

// reloadPeerCAsOnHUP reads every --peer-ca file again on SIGHUP until ctx
// ends (the bridge also reads them before every dial): a peer restarted
// with a new certificate is reached without restarting the gateway.
func reloadPeerCAsOnHUP(ctx context.Context, b *bridge.Bridge, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := b.ReloadPeerCAs(); err != nil {
					log.Warn("SIGHUP: a --peer-ca file could not be read again; that peer keeps its previous certificates", "error", err)
				} else {
					log.Info("SIGHUP: --peer-ca files read again")
				}
			}
		}
	}()
}
