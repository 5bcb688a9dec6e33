package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/internal/cputime"
)

// gatewayProc is the gateway under test: a subprocess the bench started
// (cmd != nil) or a running one it only talks to.
type gatewayProc struct {
	grpcAddr, httpAddr, token string
	cmd                       *exec.Cmd
	dir                       string
	keepDir                   bool // a --snapshot-dir: not removed at close
	logPath                   string
	args                      []string
	exited                    chan struct{}

	conn   *grpc.ClientConn
	docs   gatewayv1.DocumentServiceClient
	events gatewayv1.EventServiceClient
	http   *http.Client
}

// connectGateway starts a gateway (Options.ServeCommand) in a temporary
// data dir, or connects to the running one at Options.GRPCAddr/HTTPAddr.
//
// A started gateway gets --rate-limit 0 (the default 200 req/s per tenant
// would cap every phase), no upload or subscriber caps, and enough
// concurrent streams for the fan-out phase's subscribers.
//
// extra flags are appended to a started gateway's serve command.
func connectGateway(ctx context.Context, o Options, extra ...string) (*gatewayProc, error) {
	return connectGatewayIn(ctx, o, "", extra...)
}

// connectGatewayIn is connectGateway with the started gateway's data in
// dir/data (dir is removed at close; "": a new temporary dir).
func connectGatewayIn(ctx context.Context, o Options, dir string, extra ...string) (*gatewayProc, error) {
	g := &gatewayProc{grpcAddr: o.GRPCAddr, httpAddr: o.HTTPAddr, token: o.Token, dir: dir}
	if g.grpcAddr == "" {
		if err := g.start(ctx, o, extra); err != nil {
			g.close()
			return nil, err
		}
	}
	conn, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		g.close()
		return nil, fmt.Errorf("connect to %s: %w", g.grpcAddr, err)
	}
	g.conn, g.docs, g.events = conn, gatewayv1.NewDocumentServiceClient(conn), gatewayv1.NewEventServiceClient(conn)
	// WriteBufferSize: a small document's request (head and ~5.5 KiB of
	// JSON) leaves in one write, as most HTTP clients send a small body
	// (Go's default 4 KiB buffer splits it in two, and the gateway then
	// reads it in two).
	g.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0, DisableCompression: true,
		WriteBufferSize: 16 << 10}}
	if g.cmd == nil {
		if err := g.waitHealthy(ctx); err != nil {
			g.close()
			return nil, err
		}
	}
	return g, nil
}

func (g *gatewayProc) start(ctx context.Context, o Options, extra []string) error {
	dir := g.dir // preset: a data dir the phase filled (snapshot)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "gateway-bench-"); err != nil {
			return err
		}
		g.dir = dir
	}
	ga, err := freePort()
	if err != nil {
		return err
	}
	ha, err := freePort()
	if err != nil {
		return err
	}
	g.grpcAddr, g.httpAddr = ga, ha
	maxUpload := max(int64(1<<30), o.BulkBytes+1)
	args := append(append([]string{}, o.ServeCommand[1:]...),
		"--grpc-addr", ga, "--http-addr", ha, "--data-dir", filepath.Join(dir, "data"),
		"--rate-limit", "0", "--max-uploads-per-tenant", "0", "--max-subscribers-per-tenant", "0",
		"--max-conns-per-ip", "0", "--max-downloads-per-tenant", "0",
		"--max-concurrent-streams", strconv.Itoa(max(4096, 2*o.Subscribers)),
		"--max-upload-bytes", strconv.FormatInt(maxUpload, 10), "--log-level", "warn")
	if o.PprofAddr != "" {
		args = append(args, "--pprof-addr", o.PprofAddr)
	}
	if o.EmbeddedPeerTransport != "" {
		args = append(args, "--embedded-peer-transport", o.EmbeddedPeerTransport)
	}
	args = append(args, extra...)
	g.args = args
	g.logPath = filepath.Join(dir, "gateway.log")
	logf, err := os.Create(g.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(o.ServeCommand[0], args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	// A bench that dies (SIGKILL, SIGQUIT) takes its gateway with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", o.ServeCommand[0], err)
	}
	g.cmd = cmd
	g.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(g.exited) }()
	if err := g.waitHealthy(ctx); err != nil {
		return fmt.Errorf("%w\n%s", err, g.logTail())
	}
	return nil
}

func (g *gatewayProc) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get("http://" + g.httpAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if g.exited != nil {
			select {
			case <-g.exited:
				return fmt.Errorf("the gateway exited before it was healthy")
			default:
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the gateway at %s did not become healthy within %s (last error: %v)", g.httpAddr, startTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (g *gatewayProc) describe() string {
	if g.cmd == nil {
		return fmt.Sprintf("running gateway at grpc=%s http=%s (no RSS/CPU figures)", g.grpcAddr, g.httpAddr)
	}
	return fmt.Sprintf("subprocess pid %d: %s %s", g.cmd.Process.Pid, filepath.Base(g.cmd.Path), strings.Join(g.args, " "))
}

// close stops a started gateway (SIGTERM, then SIGKILL after stopTimeout)
// and removes its data dir.
func (g *gatewayProc) close() {
	if g.conn != nil {
		g.conn.Close()
	}
	if g.http != nil {
		g.http.CloseIdleConnections()
	}
	if g.cmd != nil && g.cmd.Process != nil {
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.exited:
		case <-time.After(stopTimeout):
			_ = g.cmd.Process.Kill()
			<-g.exited
		}
	}
	if g.dir != "" && !g.keepDir {
		os.RemoveAll(g.dir)
	}
}

func (g *gatewayProc) logTail() string {
	b, _ := os.ReadFile(g.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return "gateway log (tail):\n" + string(b)
}

// ctx adds the bearer token, if any.
func (g *gatewayProc) ctx(ctx context.Context) context.Context {
	if g.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.token)
}

func (g *gatewayProc) authorize(r *http.Request) {
	if g.token != "" {
		r.Header.Set("Authorization", "Bearer "+g.token)
	}
}

// procStats are the gateway process's cumulative CPU time and peak RSS.
type procStats struct {
	cpu     time.Duration
	peakRSS int64 // bytes (VmHWM)
	writes  int64 // write-family system calls (syscw of /proc/<pid>/io; 0: unreadable)
}

// stats reads /proc/<pid>; ok is false for a gateway the bench did not start.
func (g *gatewayProc) stats() (procStats, bool) {
	if g.cmd == nil {
		return procStats{}, false
	}
	pid := g.cmd.Process.Pid
	var s procStats
	if cpu, err := cputime.Of(pid); err == nil {
		s.cpu = cpu
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid)); err == nil {
		s.writes = procField(string(b), "syscw:")
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				s.peakRSS = kb << 10
			}
		}
	}
	return s, true
}

// resetPeak resets VmHWM to the current RSS (clear_refs 5), so the next
// stats() reports the peak of what follows.
func (g *gatewayProc) resetPeak() {
	if g.cmd != nil {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", g.cmd.Process.Pid), []byte("5"), 0)
	}
}

// measure runs f and returns the gateway's CPU time and peak RSS over it.
func (g *gatewayProc) measure(f func() error) (procStats, bool, error) {
	g.resetPeak()
	before, ok := g.stats()
	err := f()
	after, _ := g.stats()
	return procStats{cpu: after.cpu - before.cpu, peakRSS: after.peakRSS, writes: after.writes - before.writes}, ok, err
}

// procField is the integer after name in a /proc file of "name value"
// lines (0 if absent).
func procField(text, name string) int64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// fill sets the gateway figures of r from a measure() outcome over ops
// operations lasting secs.
func fill(r *Result, ps procStats, ok bool, ops int64, secs float64) {
	if !ok {
		return
	}
	r.PeakRSSMiB = float64(ps.peakRSS) / (1 << 20)
	if ops > 0 {
		r.CPUPerOpUs = float64(ps.cpu.Microseconds()) / float64(ops)
	}
	r.GatewayCPUPc = 100 * ps.cpu.Seconds() / secs
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
