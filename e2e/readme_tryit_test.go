package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeTryItHeading names the README section TestReadmeTryIt runs.
const readmeTryItHeading = "## Try it"

// TestReadmeTryIt runs the commands of the README section "Try it" as
// written, with bash, against a gateway of its own: every curl, grpcurl
// and command-line client line of the first block, one at a time, and the
// claim-check block as one script. Only what a reader fills in is filled
// in: the ports (the gateway runs on free ones), <ID> (the document the
// first command submits), <CLAIM> (the claim of the block's deferred
// document, read with `gateway get`), and `go run ./cmd/gateway` is the
// binary the suite built. Each command must exit 0 (a stream that never
// ends by itself, events:subscribe, must print events within 5 s); a README
// edit that breaks a command breaks this test.
func TestReadmeTryIt(t *testing.T) {
	t.Parallel()
	root := filepath.Dir(goEnv("GOMOD"))
	blocks := readmeBlocks(t, root, readmeTryItHeading)
	if len(blocks) != 2 {
		t.Fatalf("README section %q has %d sh blocks, want 2 (the tour, the claim check): update TestReadmeTryIt", readmeTryItHeading, len(blocks))
	}
	g := startGateway(t, gwOpts{})
	r := &readmeRun{t: t, g: g, bin: gatewayBinary(t), dir: t.TempDir(),
		path: filepath.Dir(need(t, toolGrpcurl)) + ":" + filepath.Dir(need(t, toolCurl)) + ":" + os.Getenv("PATH")}

	cmds := readmeCommands(blocks[0])
	if len(cmds) < 20 {
		t.Fatalf("the README's tour has %d commands, want the whole tour (20 or more)", len(cmds))
	}
	first := r.run(cmds[0], 60*time.Second)
	var doc struct{ Id, State string }
	if err := json.Unmarshal(first, &doc); err != nil || doc.Id == "" {
		t.Fatalf("the README's first command printed %q, want a document with its id", first)
	}
	r.id = doc.Id
	for _, c := range cmds[1:] {
		if strings.Contains(c, "events:subscribe") {
			if out := r.stream(c, 5*time.Second); !bytes.Contains(out, []byte(`"kind"`)) { // NDJSON or Server-Sent Events
				t.Errorf("%s\nprinted %q within 5 s, want events", c, out)
			}
			continue
		}
		out := r.run(c, 90*time.Second)
		if msg := apiError(out); msg != "" {
			t.Errorf("%s\nanswered an error: %s", c, msg)
		}
		if strings.Contains(c, "grpcurl") && strings.Contains(c, "/GetDocument") && !strings.Contains(string(out), r.id) {
			t.Errorf("%s\nprinted %q, want the document", c, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(r.dir, "out.txt")); err != nil || !json.Valid(b) {
		t.Errorf("gateway result -o out.txt wrote %q, %v; want the textstats JSON", b, err)
	}

	// The claim check block, as one script: $id crosses its lines.
	claimOf := `claim_of() { for _ in $(seq 600); do c=$(` + r.bin + ` get "$1" | grep -o '"claimId": *"[0-9]*"' | grep -o '[0-9][0-9]*' | head -1); ` +
		`[ -n "$c" ] && { echo "$c"; return 0; }; sleep 0.1; done; echo "no claim on $1" >&2; return 1; }` + "\n"
	script := strings.ReplaceAll(blocks[1], "<CLAIM>", `"$(claim_of "$id")"`)
	out := r.run(claimOf+script, 2*time.Minute)
	for _, want := range []string{`"state": "REDEEMED"`, "SUCCEEDED"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the claim check block printed\n%s\nwant %q in it", out, want)
		}
	}
}

// apiError returns the first google.rpc.Status in out, a JSON answer or
// NDJSON lines ({"code": 5, "message": ...} or {"error": {...}}); "" when
// there is none. curl -s exits 0 on an HTTP error, so the answer is what
// tells.
func apiError(out []byte) string {
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var m struct {
			Code    *int            `json:"code"`
			Message string          `json:"message"`
			Error   json.RawMessage `json:"error"`
		}
		if json.Unmarshal(line, &m) != nil {
			if json.Unmarshal(out, &m) != nil { // one JSON document over several lines
				return ""
			}
		}
		if m.Code != nil && *m.Code != 0 && m.Message != "" || bytes.HasPrefix(m.Error, []byte("{")) {
			return string(line)
		}
	}
	return ""
}

// readmeRun runs README commands for TestReadmeTryIt.
type readmeRun struct {
	t    *testing.T
	g    *gatewayProc
	bin  string // the gateway binary, for go run ./cmd/gateway
	dir  string // the working directory (big.txt, out.txt...)
	path string // PATH with grpcurl and curl
	id   string // <ID>
}

var readmePorts = regexp.MustCompile(`\b(localhost|127\.0\.0\.1):(8080|9090)\b`)

// fill puts in what a reader fills in (package doc of TestReadmeTryIt).
func (r *readmeRun) fill(cmd string) string {
	cmd = readmePorts.ReplaceAllStringFunc(cmd, func(s string) string {
		if strings.HasSuffix(s, ":9090") {
			return r.g.grpcAddr
		}
		return r.g.httpAddr
	})
	cmd = strings.ReplaceAll(cmd, "go run ./cmd/gateway", r.bin)
	return strings.ReplaceAll(cmd, "<ID>", r.id)
}

func (r *readmeRun) command(ctx context.Context, cmd string) *exec.Cmd {
	c := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", r.fill(cmd))
	c.Dir = r.dir
	c.Env = append(os.Environ(), "PATH="+r.path, "GATEWAY_ADDR="+r.g.grpcAddr, "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	return c
}

// run runs cmd and fails the test unless it exits 0 within d.
func (r *readmeRun) run(cmd string, d time.Duration) []byte {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c := r.command(ctx, cmd)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		r.t.Fatalf("the README command\n%s\nfailed: %v (within %v)\n--- stdout ---\n%.3000s\n--- stderr ---\n%.3000s", r.fill(cmd), err, d, out.String(), errb.String())
	}
	return out.Bytes()
}

// stream runs a command that does not end by itself for d and returns
// what it printed; it fails the test if the command ends with an error
// before that.
func (r *readmeRun) stream(cmd string, d time.Duration) []byte {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c := r.command(ctx, cmd)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.t.Fatalf("the README command\n%s\nfailed: %v\n--- stderr ---\n%.3000s", r.fill(cmd), err, errb.String())
	}
	return out.Bytes()
}

// readmeBlocks returns the ```sh blocks of the README section that starts
// with heading (up to the next section of the same or a higher level).
func readmeBlocks(t *testing.T, root, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	if i := strings.Index(sec, "\n"+level); i >= 0 {
		sec = sec[:i]
	}
	var blocks []string
	for {
		_, rest, ok := strings.Cut(sec, "```sh\n")
		if !ok {
			return blocks
		}
		block, after, ok := strings.Cut(rest, "```\n")
		if !ok {
			t.Fatalf("README section %q: a ```sh block does not end", heading)
		}
		blocks = append(blocks, block)
		sec = after
	}
}

// readmeCommands splits a block into commands: one per line, lines ending
// with a backslash joined; blank lines and comment lines are skipped.
func readmeCommands(block string) []string {
	var cmds []string
	cur := ""
	for _, line := range strings.Split(block, "\n") {
		if cur == "" && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")) {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur += s
			continue
		}
		cmds = append(cmds, cur+line)
		cur = ""
	}
	return cmds
}
