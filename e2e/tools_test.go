package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Tool discovery. Every external client the suite drives is found here. A
// missing tool FAILS the test with the command that installs it: CI installs
// all of them (see README.md), so a skip would hide a broken pipeline.

// grpcurlVersion is the grpcurl release the suite and CI use. Later releases
// (v1.9.4+) need github.com/jhump/protoreflect/v2, which the module proxy
// used here does not serve.
const grpcurlVersion = "v1.9.3"

type tool struct {
	name       string   // what the failure message calls it
	env        string   // environment variable that overrides discovery
	candidates []string // executable names tried in PATH (and GOBIN/GOPATH/bin)
	install    string   // how to install it
}

var (
	toolCurl = tool{
		name: "curl", env: "E2E_CURL", candidates: []string{"curl"},
		install: "apt-get install -y curl",
	}
	toolGrpcurl = tool{
		name: "grpcurl", env: "E2E_GRPCURL", candidates: []string{"grpcurl"},
		install: "go install github.com/fullstorydev/grpcurl/cmd/grpcurl@" + grpcurlVersion,
	}
	toolChromium = tool{
		name: "headless Chromium", env: "E2E_CHROMIUM",
		candidates: []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"},
		install:    "apt-get update && apt-get install -y chromium   (as root; Debian package `chromium`)",
	}
)

var (
	toolMu    sync.Mutex
	toolPaths = map[string]string{}
)

// need returns the absolute path of tl or fails t with the install command.
func need(t testing.TB, tl tool) string {
	t.Helper()
	toolMu.Lock()
	defer toolMu.Unlock()
	if p, ok := toolPaths[tl.name]; ok {
		return p
	}
	p, tried := findTool(tl)
	if p == "" {
		t.Fatalf("e2e needs %s and could not find it (tried %s).\nInstall it with:\n    %s\nor point $%s at the executable. CI installs it; the test fails rather than skips so that a missing tool is noticed.",
			tl.name, strings.Join(tried, ", "), tl.install, tl.env)
	}
	toolPaths[tl.name] = p
	return p
}

func findTool(tl tool) (string, []string) {
	var tried []string
	if v := os.Getenv(tl.env); v != "" {
		tried = append(tried, "$"+tl.env+"="+v)
		if p, err := exec.LookPath(v); err == nil {
			return p, tried
		}
		return "", tried
	}
	var dirs []string
	if gobin := goEnv("GOBIN"); gobin != "" {
		dirs = append(dirs, gobin)
	}
	if gopath := goEnv("GOPATH"); gopath != "" {
		for _, d := range filepath.SplitList(gopath) {
			dirs = append(dirs, filepath.Join(d, "bin"))
		}
	}
	for _, c := range tl.candidates {
		tried = append(tried, c+" in $PATH")
		if p, err := exec.LookPath(c); err == nil {
			return p, tried
		}
		for _, d := range dirs {
			p := filepath.Join(d, c)
			tried = append(tried, p)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, tried
			}
		}
	}
	return "", tried
}

var (
	goEnvOnce sync.Once
	goEnvVals map[string]string
)

// goEnv returns `go env NAME` for GOBIN, GOPATH and GOMOD.
func goEnv(name string) string {
	goEnvOnce.Do(func() {
		goEnvVals = map[string]string{}
		out, err := exec.Command("go", "env", "GOBIN", "GOPATH", "GOMOD").Output()
		if err != nil {
			return
		}
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		for i, k := range []string{"GOBIN", "GOPATH", "GOMOD"} {
			if i < len(lines) {
				goEnvVals[k] = strings.TrimSpace(lines[i])
			}
		}
	})
	return goEnvVals[name]
}
