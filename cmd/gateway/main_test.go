package main_test

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fxamacker/cbor/v2"

	"github.com/pipestream/gateway/gateway"
	"github.com/pipestream/gateway/internal/pgtest"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gateway-bin")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := pgtest.Run(m) // stops the PostgreSQL cluster if a test started one
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// checkVersion: `gateway --version` prints what the binary's own build
// info says (debug/buildinfo of the file, as `go version -m` reads it).
func checkVersion(t *testing.T) {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("build info of %s: %v", bin, err)
	}
	want := gateway.BuildInfo{Version: info.Main.Version, GoVersion: info.GoVersion}
	if want.Version == "" {
		want.Version = "(devel)"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			want.Revision = s.Value
		case "vcs.time":
			want.Time = s.Value
		case "vcs.modified":
			want.Modified = s.Value == "true"
		}
	}
	out, _, code := run(t, nil, "--version")
	if code != 0 || strings.TrimSpace(out) != want.String() || !strings.Contains(out, info.GoVersion) {
		t.Errorf("gateway --version: exit %d %q, want %q (the binary's build info)", code, out, want.String())
	}
}

func TestHelpOfEveryVerb(t *testing.T) {
	verbs := map[string][]string{
		"serve": {"GATEWAY_GRPC_ADDR", "GATEWAY_HTTP_ADDR", "GATEWAY_DATA_DIR", "GATEWAY_PEER", "GATEWAY_PEER_CA",
			"GATEWAY_PEER_SERVER_NAME", "GATEWAY_PREFER_PROTOBUF", "GATEWAY_MAX_UPLOAD_BYTES", "GATEWAY_INLINE_THRESHOLD",
			"GATEWAY_SHUTDOWN_TIMEOUT", "GATEWAY_LOG_LEVEL", "GATEWAY_LOG_FORMAT",
			"GATEWAY_AUTH_TOKENS", "GATEWAY_INSECURE_NO_AUTH", "GATEWAY_TLS_CERT", "GATEWAY_TLS_KEY",
			"GATEWAY_PEER_CLIENT_CERT", "GATEWAY_PEER_CLIENT_KEY", "GATEWAY_RATE_LIMIT", "GATEWAY_RATE_BURST",
			"GATEWAY_MAX_UPLOADS_PER_TENANT", "GATEWAY_MAX_SUBSCRIBERS_PER_TENANT", "GATEWAY_UPLOAD_IDLE_TIMEOUT",
			"GATEWAY_READ_HEADER_TIMEOUT", "GATEWAY_IDLE_TIMEOUT", "GATEWAY_MAX_CONCURRENT_STREAMS",
			"GATEWAY_MAX_RECV_MSG_BYTES", "GATEWAY_MAX_JSON_BODY_BYTES"},
		"peer":       {"GATEWAY_PEER_LISTEN", "GATEWAY_PEER_CERT", "GATEWAY_PEER_KEY", "GATEWAY_PEER_DATA_DIR", "GATEWAY_PEER_CLIENT_CA"},
		"hash-token": {"GATEWAY_HASH_TOKEN_GENERATE"},
		"submit":     {"GATEWAY_ADDR", "GATEWAY_TOKEN", "GATEWAY_TLS_CA", "GATEWAY_SPLIT", "GATEWAY_CHUNK_BYTES", "GATEWAY_PROCESSOR", "GATEWAY_CONTENT_TYPE", "GATEWAY_REQUEST_ID", "GATEWAY_PROGRESS"},
		"get":        {"GATEWAY_ADDR", "GATEWAY_TOKEN"},
		"watch":      {"GATEWAY_ADDR", "GATEWAY_TOKEN"},
		"result":     {"GATEWAY_ADDR", "GATEWAY_TOKEN", "GATEWAY_OUTPUT"},
		"redeem":     {"GATEWAY_ADDR", "GATEWAY_TOKEN"},
	}
	for verb, envs := range verbs {
		t.Run(verb, func(t *testing.T) {
			help, _, code := run(t, nil, verb, "--help") // help goes to stdout
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			if !strings.Contains(help, "Usage: gateway") || !strings.Contains(help, "Example:") {
				t.Errorf("help lacks usage or example:\n%s", help)
			}
			for _, env := range envs {
				if !strings.Contains(help, "$"+env+"]") {
					t.Errorf("help does not name %s:\n%s", env, help)
				}
			}
		})
	}
	top, _, code := run(t, nil, "help")
	if code != 0 || !strings.Contains(top, "submit") || !strings.Contains(top, "redeem") {
		t.Errorf("gateway help: exit %d\n%s", code, top)
	}
	// --version: the module version, VCS revision and time (or why there
	// are none) and the Go version the binary's build info records.
	checkVersion(t)
	// An unknown flag is one line on stderr that says where to look, not
	// the whole help.
	if out, errb, code := run(t, nil, "get", "--frobnicate", "x"); code != 2 || out != "" ||
		strings.Count(errb, "\n") != 1 || !strings.Contains(errb, "frobnicate") || !strings.Contains(errb, "gateway get --help") {
		t.Errorf("unknown flag: exit %d stdout %q stderr %q, want 2 and one line naming the flag and the help", code, out, errb)
	}
	if _, _, code := run(t, nil, "frobnicate"); code != 2 {
		t.Errorf("unknown verb: exit %d, want 2", code)
	}
	if _, stderr, code := run(t, []string{"GATEWAY_PREFER_PROTOBUF=maybe"}, "serve"); code != 2 || !strings.Contains(stderr, "GATEWAY_PREFER_PROTOBUF") {
		t.Errorf("bad env value: exit %d %s, want 2 naming the variable", code, stderr)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestServeWithEmbeddedPeer runs `gateway` with no --peer: it starts the
// in-process peer, answers /healthz, and the client verbs, REST and the
// WebSocket stream work against it; SIGTERM shuts it down cleanly.
func TestServeWithEmbeddedPeer(t *testing.T) {
	dir := t.TempDir()
	grpcAddr, httpAddr := freePort(t), freePort(t)
	logs := newLockedBuffer()
	cmd := exec.Command(bin, "--grpc-addr", grpcAddr, "--data-dir", filepath.Join(dir, "data"), "--log-format", "json")
	cmd.Env = append(os.Environ(), "GATEWAY_HTTP_ADDR="+httpAddr, "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	base := "http://" + httpAddr
	waitUntil(t, 30*time.Second, func() bool {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Contains(string(b), "SERVING")
	}, logs)

	id := checkClientVerbs(t, dir, grpcAddr)
	checkRESTAndWebSocket(t, httpAddr, id)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit 30s after SIGTERM\n%s", logs.String())
	}
	for _, want := range []string{"embedded peer listening", "gateway listening", "gateway stopped"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// checkClientVerbs submits a file with metadata through 'gateway submit'
// (flags after the file, repeated), follows it with watch, fetches its
// result, reads it with get, and checks that get and redeem of unknown ids
// exit 1 with NotFound. It returns the document id.
func checkClientVerbs(t *testing.T, dir, grpcAddr string) string {
	t.Helper()
	in := filepath.Join(dir, "in.txt")
	content := strings.Repeat("the quick brown fox jumps over the lazy dog\n", 2000)
	if err := os.WriteFile(in, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run(t, nil, "submit", "--addr", grpcAddr, in, "--metadata", "owner=alice", "--metadata", "team=x=y")
	if code != 0 {
		t.Fatalf("submit: exit %d %s", code, stderr)
	}
	id := strings.TrimSpace(out)
	if id == "" {
		t.Fatal("submit printed no id")
	}
	out, stderr, code = run(t, nil, "watch", "--addr", grpcAddr, id)
	if code != 0 || !strings.Contains(out, "SUCCEEDED") {
		t.Fatalf("watch: exit %d\n%s%s", code, out, stderr)
	}
	resFile := filepath.Join(dir, "out.bin")
	if _, stderr, code = run(t, nil, "result", "--addr", grpcAddr, "-o", resFile, id); code != 0 {
		t.Fatalf("result: exit %d %s", code, stderr)
	}
	if got, _ := os.ReadFile(resFile); string(got) != content {
		t.Errorf("passthrough result is %d bytes, want the %d input bytes back", len(got), len(content))
	}
	out, _, code = run(t, nil, "get", "--addr", grpcAddr, id)
	if code != 0 || !strings.Contains(out, `"state": "SUCCEEDED"`) {
		t.Errorf("get: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, `"owner": "alice"`) || !strings.Contains(out, `"team": "x=y"`) {
		t.Errorf("submit --metadata (flags after the file, repeated): the document's metadata is missing\n%s", out)
	}
	if _, stderr, code = run(t, nil, "get", "--addr", grpcAddr, "does-not-exist"); code != 1 || !strings.Contains(stderr, "NotFound") {
		t.Errorf("get unknown: exit %d %s, want 1 with NotFound", code, stderr)
	}
	if _, stderr, code = run(t, nil, "redeem", "--addr", grpcAddr, "12345"); code != 1 || !strings.Contains(stderr, "NotFound") {
		t.Errorf("redeem unknown: exit %d %s, want 1 with NotFound", code, stderr)
	}
	return id
}

// checkRESTAndWebSocket reads document id over REST and the event log from
// cursor 0 over the WebSocket (AT sync frames: a CBOR header, then the
// payload).
func checkRESTAndWebSocket(t *testing.T, httpAddr, id string) {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/v1/documents/" + id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"SUCCEEDED"`) {
		t.Errorf("REST get: %d %s", resp.StatusCode, b)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+httpAddr+"/v1/events/ws?cursor=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(websocket.StatusNormalClosure, "")
	_, msg, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dec := cbor.NewDecoder(bytes.NewReader(msg))
	var hdr struct {
		Op int    `cbor:"op"`
		T  string `cbor:"t"`
	}
	var payload map[string]any
	if err := dec.Decode(&hdr); err != nil || dec.Decode(&payload) != nil {
		t.Fatalf("frame % x does not decode as header + payload: %v", msg, err)
	}
	if hdr.Op != 1 || !strings.HasPrefix(hdr.T, "#") || payload["seq"] != uint64(1) || payload["documentId"] != id {
		t.Errorf("first frame %+v %v, want op 1, a #kind, seq 1 of document %s", hdr, payload, id)
	}
}

// A second SIGTERM during a graceful shutdown ends serve at once with exit
// code 1. The shutdown is held open by a gRPC upload whose body stalls
// (the graceful path would wait for it up to --shutdown-timeout, 60 s).
func TestSecondSignalForcesExit(t *testing.T) {
	dir := t.TempDir()
	grpcAddr, httpAddr := freePort(t), freePort(t)
	logs := newLockedBuffer()
	cmd := exec.Command(bin, "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--data-dir", filepath.Join(dir, "data"),
		"--log-format", "json", "--shutdown-timeout", "60s", "--upload-idle-timeout", "60s", "--min-body-rate", "0")
	cmd.Env = append(os.Environ(), "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	base := "http://" + httpAddr
	waitUntil(t, 30*time.Second, func() bool {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, logs)
	// A gRPC upload (`gateway submit -`) whose stdin sends a little and then
	// nothing: GracefulStop waits for it.
	pr, pw := io.Pipe()
	sub := exec.Command(bin, "submit", "--addr", grpcAddr, "-")
	sub.Stdin = pr
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	// pw first: Wait waits for the copy of stdin, which ends only with it.
	defer func() { pw.Close(); _ = sub.Process.Kill(); _ = sub.Wait() }()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 4096)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `grpc_server_started_total{grpc_method="UploadDocument"`)
	}, logs)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() bool { return strings.Contains(logs.String(), "shutting down") }, logs)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(logs.String(), "second signal") {
			t.Fatalf("exit %v, want code 1 after the second signal\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the second SIGTERM did not end the process (the graceful shutdown could take 60 s)\n%s", logs.String())
	}
}

// waitUntil polls cond until it holds or d passes (then fails with logs).
func waitUntil(t *testing.T, d time.Duration, cond func() bool, logs *lockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached within %v\n%s", d, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Repeated --peer pairs with --peer-ca given once (for every peer) or once
// per --peer; other counts stop `gateway serve` with a usage error (exit 2)
// that names what to fix, before anything listens.
func TestServePeerFlagCounts(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--peer", "127.0.0.1:1", "--peer", "127.0.0.1:2", "--peer-ca", ca, "--peer-ca", ca, "--peer-ca", ca},
			"--peer-ca is given 3 times for 2 --peer: give it once"},
		{[]string{"GATEWAY_PEER=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"}, []string{"--peer-ca", ca, "--peer-ca", ca},
			"--peer-ca is given 2 times for 3 --peer"},
		{nil, []string{"--peer", "127.0.0.1:1", "--peer", "127.0.0.1:2"}, "--peer needs --peer-ca"},
		{nil, []string{"--peer", "127.0.0.1:1", "--peer", "127.0.0.1:2", "--peer-ca", ca, "--peer-server-name", "a", "--peer-server-name", "b", "--peer-server-name", "c"},
			"--peer-server-name is given 3 times for 2 --peer"},
		{nil, []string{"--peer", "127.0.0.1:1", "--peer", "127.0.0.1:1", "--peer-ca", ca}, "distinct"},
		{nil, []string{"--peer", "127.0.0.1:1", "--peer", "127.0.0.1:2", "--peer-ca", ca, "--peer-framing", "auto", "--peer-framing", "draft-04", "--peer-framing", "auto"},
			"--peer-framing is given 3 times for 2 --peer"},
		{nil, []string{"--peer-framing", "auto", "--peer-framing", "draft-04"}, "--peer-framing is given 2 times without --peer"},
	} {
		_, stderr, code := run(t, tc.env, append([]string{"serve", "--data-dir", dir}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("serve %v (env %v): exit %d, stderr %q; want exit 2 saying %q", tc.args, tc.env, code, stderr, tc.want)
		}
	}
}
