package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"
)

// ServePprof serves net/http/pprof on addr, which must be a loopback
// address (profiles expose memory contents and code paths), until stop is
// called. `gateway serve --pprof-addr` calls it; `gateway bench
// --pprof-addr` passes the flag to the gateway it starts.
func ServePprof(addr string) (bound net.Addr, stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--pprof-addr %q: want host:port, e.g. 127.0.0.1:6060", addr)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, nil, errors.New("--pprof-addr must be a loopback address (127.0.0.1:PORT): profiles expose the process's memory and code")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--pprof-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return l.Addr(), func() { srv.Close() }, nil
}

// startProfile starts a CPU profile of the started gateway for the next d
// (whole seconds, at least one: what net/http/pprof takes) when
// Options.ProfileDir is set, and returns the function that waits for it
// and writes it to <ProfileDir>/<name>.pb.gz. The profile covers the
// path's run from its start (the last fraction of a second of a run whose
// length is not whole seconds is left out; a run under a second is
// followed by idle time). Without ProfileDir it does nothing.
func (b *runner) startProfile(ctx context.Context, name string, d time.Duration) (wait func() error) {
	if b.o.ProfileDir == "" || b.gw == nil || b.gw.cmd == nil {
		return func() error { return nil }
	}
	secs := max(1, int(d/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", b.o.PprofAddr, secs)
	done := make(chan error, 1)
	go func() { done <- fetchProfile(ctx, url, filepath.Join(b.o.ProfileDir, name+".pb.gz")) }()
	return func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("gateway CPU profile %s: %w", name, err)
		}
		b.progress("  gateway CPU profile: %s", filepath.Join(b.o.ProfileDir, name+".pb.gz"))
		return nil
	}
}

// fetchProfile GETs a profile from url into file.
func fetchProfile(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(msg))
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
