package bench

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
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
