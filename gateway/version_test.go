package gateway_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pipestream/gateway/gateway"
)

// TestBuildInfoServed: /healthz's build and the
// pipestream_gateway_build_info metric show the binary's build info
// (module version, VCS revision and time when stamped, Go version), the
// same that `gateway --version` prints.
func TestBuildInfoServed(t *testing.T) {
	h := start(t, nil)
	bi := gateway.ReadBuildInfo()
	if bi.GoVersion == "" || bi.Version == "" {
		t.Fatalf("ReadBuildInfo() = %+v, want a version and a Go version", bi)
	}
	code, _, b := h.do("GET", "/healthz", nil)
	var health struct{ Build gateway.BuildInfo }
	if code != 200 || json.Unmarshal(b, &health) != nil || health.Build != bi {
		t.Errorf("/healthz: HTTP %d %s, want build %+v", code, b, bi)
	}
	_, _, m := h.do("GET", "/metrics", nil)
	want := `pipestream_gateway_build_info{goversion="` + bi.GoVersion + `",modified="false",revision="` + bi.Revision + `",vcs_time="` + bi.Time + `",version="` + bi.Version + `"} 1`
	if bi.Modified {
		want = strings.Replace(want, `modified="false"`, `modified="true"`, 1)
	}
	if !strings.Contains(string(m), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	s := bi.String()
	if !strings.HasPrefix(s, "gateway "+bi.Version+" revision ") || !strings.HasSuffix(s, " "+bi.GoVersion) {
		t.Errorf("BuildInfo.String() = %q", s)
	}
	stamped := gateway.BuildInfo{Version: "v1.2.3", Revision: "abc123", Time: "2026-11-27T07:55:27Z", Modified: true, GoVersion: "go1.26.8"}
	if got, want := stamped.String(), "gateway v1.2.3 revision abc123 (modified) time 2026-11-27T07:55:27Z go1.26.8"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
