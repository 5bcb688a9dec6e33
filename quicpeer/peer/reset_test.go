package peer_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
)

// TestResetKeyPersisted: the peer creates <data-dir>/peer-reset.key once
// (32 octets, 0600) and reuses it on every later start; a file of another
// size is refused with a message that says what to do.
func TestResetKeyPersisted(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, peer.ResetKeyFileName)
	srv := startPeer(t, peer.Options{DataDir: dir})
	key, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(key) != 32 || fi.Mode().Perm() != 0o600 || bytes.Equal(key, make([]byte, 32)) {
		t.Fatalf("%s: %d octets, mode %v, want 32 random octets, 0600", path, len(key), fi.Mode().Perm())
	}
	srv.Shutdown(context.Background())
	startPeer(t, peer.Options{DataDir: dir}).Shutdown(context.Background())
	if again, _ := os.ReadFile(path); !bytes.Equal(again, key) {
		t.Fatal("a restarted peer replaced its stateless reset key: the old connections would not be reset")
	}

	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = peer.Start(peer.Options{DataDir: dir, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Fatalf("Start with a 5-octet reset key file: %v, want an error that says to delete it", err)
	}
}

// TestRestartedPeerResetsOldConnections: a connection to an earlier run of
// the peer (on the same address, with the key from the data dir) that
// ended without a CONNECTION_CLOSE (a killed process) is answered with a
// stateless reset by the restarted peer at the client's next packet.
func TestRestartedPeerResetsOldConnections(t *testing.T) {
	dir := t.TempDir()
	first := startPeer(t, peer.Options{DataDir: dir})
	addr := first.Addr().String()
	certPEM := first.CertPEM()
	first.Shutdown(context.Background())
	key, err := os.ReadFile(filepath.Join(dir, peer.ResetKeyFileName))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, peer.CertFileName), filepath.Join(dir, peer.KeyFileName))
	if err != nil {
		t.Fatal(err)
	}

	// The "killed run": plain quic-go on the peer's address and key.
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		t.Fatal(err)
	}
	qk := quic.StatelessResetKey(key)
	// 8-octet connection IDs as quicpeer listeners issue: the reset token
	// is derived from the connection ID the restarted peer parses.
	tr := &quic.Transport{Conn: udp, StatelessResetKey: &qk, ConnectionIDLength: 8}
	ln, err := tr.Listen(quicpeer.ServerTLS(cert), &quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctls, err := quicpeer.ClientTLS(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := quic.DialAddr(ctx, addr, ctls, &quic.Config{MaxIdleTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	if _, err := ln.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	tr.Close() // no CONNECTION_CLOSE
	udp.Close()

	startPeer(t, peer.Options{DataDir: dir, ListenAddr: addr})
	// The client's next packet carries data (a bare PING is too small to
	// be answered with a reset).
	if st, err := conn.OpenUniStream(); err == nil {
		st.Write(make([]byte, 64))
	}
	select {
	case <-conn.Context().Done():
		var sre *quic.StatelessResetError
		if err := context.Cause(conn.Context()); !errors.As(err, &sre) {
			t.Fatalf("old connection ended with %v, want a stateless reset", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the restarted peer did not reset the old connection within 5 s")
	}
}
