package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/internal/serve"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
)

const peerHelp = `Run a standalone PipeStream processing peer: QUIC (TLS 1.3, ALPN pipestream/1)
on --listen, processors passthrough, textstats, sentences and fault. Without
--cert/--key it creates a self-signed certificate in --data-dir
(peer-cert.pem); give that file to the gateway as --peer-ca. SIGTERM sends
GOAWAY, drains accepted work and closes with code 0x00. With --client-ca the
peer requires mutual TLS: a gateway must present a certificate issued by
that CA (gateway serve --peer-cert/--peer-key) or the handshake fails.

Example:
  gateway peer --listen 0.0.0.0:4433 --data-dir /var/lib/pipestream-peer
  gateway --peer 127.0.0.1:4433 --peer-ca /var/lib/pipestream-peer/peer-cert.pem`

func runPeer(args []string) int {
	fs := newFlags("peer", "gateway peer [flags]", peerHelp)
	listen := fs.String("listen", "GATEWAY_PEER_LISTEN", "127.0.0.1:4433", "UDP listen address")
	cert := fs.String("cert", "GATEWAY_PEER_CERT", "", "PEM certificate file (with --key; default: self-signed in --data-dir)")
	key := fs.String("key", "GATEWAY_PEER_KEY", "", "PEM private key file (with --cert)")
	clientCA := fs.String("client-ca", "GATEWAY_PEER_CLIENT_CA", "", "PEM CA bundle; when set, clients must present a certificate it verifies (mutual TLS)")
	dataDir := fs.String("data-dir", "GATEWAY_PEER_DATA_DIR", filepath.Join("data", "peer"), "directory for the claim-check store and the generated certificate")
	preferPB := fs.Bool("prefer-protobuf", "GATEWAY_PREFER_PROTOBUF", false, "prefer the Protobuf serialization format")
	framing := fs.String("framing", "GATEWAY_PEER_FRAMING", "auto", "control-stream framing: auto (answer each client in the framing of its first STATUS), draft-02 or draft-04")
	drain := fs.Duration("drain-timeout", "GATEWAY_PEER_DRAIN_TIMEOUT", 15*time.Second, "how long to drain accepted work after GOAWAY")
	maxConns := fs.Uint("max-connections", "GATEWAY_PEER_MAX_CONNECTIONS", 256, "QUIC connections held at once; one more is closed after its handshake with PIPESTREAM_INTERNAL_ERROR (0x01)")
	logLevel := fs.String("log-level", "GATEWAY_LOG_LEVEL", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "GATEWAY_LOG_FORMAT", "text", "text or json")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gateway peer: unexpected argument %q (flags only; see --help)\n", fs.Arg(0))
		return 2
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return fail(os.Stderr, "peer", err)
	}
	var clientCAs *x509.CertPool
	if *clientCA != "" {
		b, err := os.ReadFile(*clientCA)
		if err != nil {
			return fail(os.Stderr, "peer", fmt.Errorf("read --client-ca: %w", err))
		}
		clientCAs = x509.NewCertPool()
		if !clientCAs.AppendCertsFromPEM(b) {
			return fail(os.Stderr, "peer", fmt.Errorf("--client-ca %s holds no PEM certificate", *clientCA))
		}
	}
	fr, err := bridge.ParseFraming(*framing)
	if err != nil {
		return fail(os.Stderr, "peer", fmt.Errorf("--framing: %w", err))
	}
	err = serve.RunPeer(context.Background(), peer.Options{
		ClientCAs:    clientCAs,
		ListenAddr:   *listen,
		CertFile:     *cert,
		KeyFile:      *key,
		DataDir:      *dataDir,
		Logger:       log,
		Offer:        ptr(peer.DefaultOffer(*preferPB)),
		DrainTimeout: *drain,
		Framing:      fr,
		Limits:       quicpeer.Limits{MaxConnections: int(min(*maxConns, 1<<20))},
	})
	if err != nil {
		return fail(os.Stderr, "peer", err)
	}
	return 0
}
