package serve_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	"github.com/pipestream/gateway/internal/serve"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func config(t *testing.T, dataDir string) serve.Config {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return serve.Config{
		Gateway:         gateway.Config{GRPCAddr: freePort(t), HTTPAddr: freePort(t), DataDir: dataDir, Logger: log},
		Bridge:          bridge.Options{DataDir: dataDir},
		Logger:          log,
		ShutdownTimeout: 10 * time.Second,
	}
}

// TestRunLifecycle runs the whole server in-process with the embedded
// peer: it serves /healthz SERVING (the bridge has its peer session),
// holds both data directories' locks while it runs (a second Run on the
// same directory fails at once naming the lock), and when its context ends
// it drains, returns nil and releases the locks.
func TestRunLifecycle(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cfg := config(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve.Run(ctx, cfg) }()

	base := "http://" + cfg.Gateway.HTTPAddr
	deadline := time.Now().Add(30 * time.Second)
	for !serving(base) {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before serving", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("/healthz never answered 200 SERVING")
		}
		time.Sleep(50 * time.Millisecond)
	}

	second := config(t, dir)
	err := serve.Run(context.Background(), second)
	if !errors.Is(err, serve.ErrDirLocked) || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("second Run on the same data dir: %v, want ErrDirLocked naming --data-dir", err)
	}
	if _, err := serve.LockDataDir(filepath.Join(dir, "peer"), "peer dir"); !errors.Is(err, serve.ErrDirLocked) {
		t.Fatalf("the embedded peer's directory is not locked while Run runs: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after its context ended: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its context ending")
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the HTTP listener still answers after Run returned")
	}
	for _, d := range []string{dir, filepath.Join(dir, "peer")} {
		l, err := serve.LockDataDir(d, "dir")
		if err != nil {
			t.Fatalf("%s still locked after Run returned: %v", d, err)
		}
		l.Release()
	}
}

// TestRunRefusesBadConfig: errors in the configuration stop Run before it
// listens, each naming the flag to fix, and leave the data dir unlocked.
func TestRunRefusesBadConfig(t *testing.T) {
	cases := []struct {
		name string
		edit func(*serve.Config)
		want string
	}{
		{"peer without CA", func(c *serve.Config) { c.Bridge.PeerAddr = "127.0.0.1:1" }, "--peer needs --peer-ca"},
		{"CA without peer", func(c *serve.Config) { c.PeerCAFile = "ca.pem" }, "need --peer"},
		{"embedded transport with peer", func(c *serve.Config) {
			c.Bridge.PeerAddr, c.PeerCAFile, c.EmbeddedPeer = "127.0.0.1:1", "ca.pem", "quic"
		}, "--embedded-peer-transport quic applies to the embedded peer"},
		{"cert without key", func(c *serve.Config) { c.PeerCertFile = "c.pem" }, "--peer-cert and --peer-key"},
		{"missing token file", func(c *serve.Config) { c.AuthTokensFile = "/nonexistent/tokens" }, "--auth-tokens"},
		{"exposed without auth", func(c *serve.Config) { c.Gateway.HTTPAddr = "0.0.0.0:0" }, "auth"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := config(t, dir)
			c.edit(&cfg)
			err := serve.Run(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run: %v, want an error containing %q", err, c.want)
			}
			l, err := serve.LockDataDir(dir, "dir")
			if err != nil {
				t.Fatalf("data dir still locked after a refused Run: %v", err)
			}
			l.Release()
		})
	}
}

func serving(base string) bool {
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == 200 && strings.Contains(string(b), "SERVING")
}

// MatchPeers pairs repeated --peer with --peer-ca and --peer-server-name:
// once for every peer, or once per peer in the same order.
func TestMatchPeers(t *testing.T) {
	addrs := []string{"a:1", "b:2"}
	got, err := serve.MatchPeers(addrs, []string{"ca.pem"}, nil)
	if err != nil || len(got) != 2 || got[0] != (serve.PeerSpec{Addr: "a:1", CAFile: "ca.pem"}) || got[1] != (serve.PeerSpec{Addr: "b:2", CAFile: "ca.pem"}) {
		t.Fatalf("one CA for every peer: %+v %v", got, err)
	}
	got, err = serve.MatchPeers(addrs, []string{"a.pem", "b.pem"}, []string{"x", "y"})
	if err != nil || got[0] != (serve.PeerSpec{Addr: "a:1", CAFile: "a.pem", ServerName: "x"}) || got[1] != (serve.PeerSpec{Addr: "b:2", CAFile: "b.pem", ServerName: "y"}) {
		t.Fatalf("a CA and a name per peer: %+v %v", got, err)
	}
	got, err = serve.MatchPeers(addrs, []string{"a.pem", "b.pem"}, []string{"x"})
	if err != nil || got[0].ServerName != "x" || got[1].ServerName != "x" {
		t.Fatalf("one server name for every peer: %+v %v", got, err)
	}
	for _, bad := range []struct{ cas, names []string }{
		{nil, nil},
		{[]string{"a", "b", "c"}, nil},
		{[]string{"a"}, []string{"x", "y", "z"}},
	} {
		if _, err := serve.MatchPeers(addrs, bad.cas, bad.names); err == nil {
			t.Errorf("MatchPeers(%v, %v, %v) accepted", addrs, bad.cas, bad.names)
		}
	}
	if got, err := serve.MatchPeers(nil, nil, nil); err != nil || got != nil {
		t.Errorf("no peer: %v %v", got, err)
	}
}

// MatchFramings: --peer-framing once applies to every peer (through
// Bridge.PeerFraming), once per peer gives each its own; other counts and
// unknown framings are refused.
func TestMatchFramings(t *testing.T) {
	specs := func() []serve.PeerSpec { return []serve.PeerSpec{{Addr: "a:1"}, {Addr: "b:2"}} }
	s := specs()
	if err := serve.MatchFramings(s, []string{"draft-04"}); err != nil || s[0].Framing != "" || s[1].Framing != "" {
		t.Fatalf("once: %+v %v", s, err)
	}
	s = specs()
	if err := serve.MatchFramings(s, []string{"draft-04", "auto"}); err != nil || s[0].Framing != "draft-04" || s[1].Framing != "auto" {
		t.Fatalf("per peer: %+v %v", s, err)
	}
	if err := serve.MatchFramings(specs(), []string{"auto", "auto", "auto"}); err == nil || !strings.Contains(err.Error(), "--peer-framing is given 3 times for 2 --peer") {
		t.Errorf("3 framings for 2 peers: %v", err)
	}
	if err := serve.MatchFramings(specs(), []string{"auto", "draft-9"}); err == nil || !strings.Contains(err.Error(), "b:2") {
		t.Errorf("unknown framing: %v", err)
	}
}
