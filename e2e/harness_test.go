package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Process harness: build the binary once, start gateway/peer processes on
// free loopback ports with their output captured to a log file, wait until
// they are ready, kill them at test end and print the log tail of every
// process a failed test used.

const (
	startTimeout = 30 * time.Second // build cache warm: the gateway is ready in well under a second
	logTailLines = 80
)

var (
	binDir   string // holds the built binary; removed by TestMain
	buildMu  sync.Mutex
	binPath  string
	buildErr error

	sharedMu  sync.Mutex
	sharedGW  *gatewayProc
	sharedErr error
	sharedDir string // the shared gateway's data dir; removed by TestMain
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped with -short (the suite builds and starts real processes)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "pipestream-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	if raceGateway {
		// Every gateway process (started with os.Environ) writes its race
		// reports to a file of its own here; checked after the run.
		os.Setenv("GORACE", "log_path="+filepath.Join(binDir, "race")+" halt_on_error=0")
	}
	code := m.Run()
	sharedMu.Lock()
	if sharedGW != nil {
		sharedGW.proc.stop()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "\n--- tail of the shared gateway's log (%s) ---\n%s\n", sharedGW.proc.logPath, sharedGW.proc.tail(logTailLines))
		}
	}
	if raceGateway && reportRaces(binDir) {
		code = 1
	}
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	sharedMu.Unlock()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// raceGateway (PIPESTREAM_E2E_RACE=1) builds the gateway binary with the
// race detector: every process the suite starts from it (gateways,
// peers, replicas, the torture test's partners' gateways) reports data
// races, and the run fails if any did (reportRaces). The torture and
// history tests run so in CI (.ci/test.sh); other tests can too.
var raceGateway = os.Getenv("PIPESTREAM_E2E_RACE") == "1"

// reportRaces prints the race reports the gateway processes wrote under
// dir (GORACE log_path, one file per process) and says whether there
// were any.
func reportRaces(dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "race.*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		fmt.Fprintf(os.Stderr, "\n--- e2e: a gateway process built with -race reported data races (%s) ---\n%s\n", filepath.Base(f), b)
	}
	return len(files) > 0
}

// gatewayBinary builds ./cmd/gateway once per run (from the module root
// found via `go env GOMOD`) and returns its path.
func gatewayBinary(t testing.TB) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if binPath == "" && buildErr == nil {
		gomod := goEnv("GOMOD")
		if gomod == "" || gomod == os.DevNull {
			buildErr = errors.New("go env GOMOD is empty: run the tests inside the module")
		} else {
			out := filepath.Join(binDir, "gateway")
			args := []string{"build", "-o", out}
			if raceGateway {
				args = append(args, "-race")
			}
			cmd := exec.Command("go", append(args, "./cmd/gateway")...)
			cmd.Dir = filepath.Dir(gomod)
			if b, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build ./cmd/gateway: %v\n%s", err, b)
			} else {
				binPath = out
			}
		}
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// freeTCPAddr returns a loopback address with a port that was free a moment
// ago (listen on :0, close).
func freeTCPAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// freeUDPAddr is freeTCPAddr for UDP (the QUIC peer).
func freeUDPAddr(t testing.TB) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// proc is one started process with its output in logPath.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed when the process has exited
	waitErr error
	once    sync.Once
}

// startProc starts bin args... with stdout and stderr in a log file under
// logDir. It does not register cleanup; callers do.
func startProc(t testing.TB, name, logDir string, args ...string) *proc {
	t.Helper()
	f, err := os.CreateTemp(logDir, name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBinary(t), args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: f.Name(), logFile: f, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL (a crash, nothing flushed) and waits for the exit.
func (p *proc) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// stop sends SIGTERM, waits up to 10 s for a graceful exit, then SIGKILL.
// signalProc sends sig to p (SIGSTOP and SIGCONT pause and resume it).
func signalProc(t testing.TB, p *proc, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

func (p *proc) stop() {
	p.once.Do(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				p.kill()
			}
		}
		p.logFile.Close()
	})
}

// tail returns the last n lines of the process log.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// logContains reports whether the process log contains s.
func (p *proc) logContains(s string) bool {
	b, _ := os.ReadFile(p.logPath)
	return bytes.Contains(b, []byte(s))
}

// attachLog prints p's log tail when t fails. Register it after the stop
// cleanup so that it runs first (cleanups are LIFO) while the file is whole.
func attachLog(t testing.TB, p *proc) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- tail of %s log (%s) ---\n%s", p.name, p.logPath, p.tail(logTailLines))
		}
	})
}

// gatewayProc is a running `gateway serve`.
type gatewayProc struct {
	proc     *proc
	grpcAddr string
	httpAddr string
	dataDir  string
	args     []string // extra flags, kept for restart
}

// baseURL is the REST root, e.g. http://127.0.0.1:41234.
func (g *gatewayProc) baseURL() string { return "http://" + g.httpAddr }

type gwOpts struct {
	dataDir string   // empty: a new temp dir
	args    []string // extra serve flags, e.g. --max-upload-bytes 1MiB
}

// startGateway starts a gateway owned by t: killed at test end, its log
// printed if t failed.
func startGateway(t testing.TB, o gwOpts) *gatewayProc {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	g, err := launchGateway(t, t.TempDir(), o)
	if g != nil {
		t.Cleanup(g.proc.stop)
		attachLog(t, g.proc)
	}
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// launchGateway starts `gateway serve` on fresh ports and waits for
// /healthz to answer 200.
func launchGateway(t testing.TB, logDir string, o gwOpts) (*gatewayProc, error) {
	t.Helper()
	g := &gatewayProc{grpcAddr: freeTCPAddr(t), httpAddr: freeTCPAddr(t), dataDir: o.dataDir, args: o.args}
	args := append([]string{"serve", "--grpc-addr", g.grpcAddr, "--http-addr", g.httpAddr, "--data-dir", g.dataDir, "--shutdown-timeout", "5s"}, o.args...)
	g.proc = startProc(t, "gateway", logDir, args...)
	if err := waitHealthy(g.proc, g.baseURL()+"/healthz"); err != nil {
		return g, fmt.Errorf("gateway %v did not become healthy: %v\n--- log ---\n%s", args, err, g.proc.tail(logTailLines))
	}
	return g, nil
}

// restart starts a new gateway on the same data dir and flags (new ports);
// the old process must have exited (callers kill it first).
func (g *gatewayProc) restart(t testing.TB) *gatewayProc {
	t.Helper()
	if !g.proc.exited() {
		t.Fatal("restart: the old gateway is still running")
	}
	return startGateway(t, gwOpts{dataDir: g.dataDir, args: g.args})
}

func waitHealthy(p *proc, url string) error {
	deadline := time.Now().Add(startTimeout)
	client := &http.Client{Timeout: time.Second}
	var last string
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("process exited early: %v", p.waitErr)
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no 200 from %s within %v (last: %s)", url, startTimeout, last)
}

// shared returns the gateway that independent tests share (default flags,
// embedded peer). It lives until TestMain ends; tests that use it get its
// log tail on failure.
func shared(t testing.TB) *gatewayProc {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedGW == nil && sharedErr == nil {
		dir, err := os.MkdirTemp("", "pipestream-e2e-shared-")
		if err != nil {
			t.Fatal(err)
		}
		sharedDir = dir
		sharedErr = errors.New("the shared gateway failed to start (see the first test that used it)")
		sharedGW, sharedErr = launchGateway(t, binDir, gwOpts{dataDir: dir})
		if sharedErr != nil && sharedGW != nil {
			sharedGW.proc.stop()
		}
	}
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	attachLog(t, sharedGW.proc)
	return sharedGW
}

// waitFor polls ok every 50 ms until it returns true, or fails t.
func waitFor(t testing.TB, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grpcClients dials g's gRPC port with the generated clients.
type grpcClients struct {
	docs   gatewayv1.DocumentServiceClient
	events gatewayv1.EventServiceClient
}

func dialGRPC(t testing.TB, g *gatewayProc) grpcClients {
	t.Helper()
	conn, err := grpc.NewClient(g.grpcAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return grpcClients{docs: gatewayv1.NewDocumentServiceClient(conn), events: gatewayv1.NewEventServiceClient(conn)}
}

// ctxT is a context that ends with the test or after d.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// scanLines splits b into non-empty lines.
func scanLines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
