package gateway

import (
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo says what a binary was built from (runtime/debug.ReadBuildInfo):
// `gateway --version`, the "build" member of /healthz and the
// pipestream_gateway_build_info metric show the same values.
type BuildInfo struct {
	// Version is the main module's version: a release tag, a pseudo-version
	// of the commit (go install module@version, or a build that stamped
	// VCS information), or "(devel)".
	Version string `json:"version"`
	// Revision and Time are the VCS commit and its time (vcs.revision,
	// vcs.time); empty when the build stamped no VCS information
	// (-buildvcs=false, go test, or a directory git does not know).
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	// Modified: the working tree had uncommitted changes (vcs.modified).
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"goVersion"`
}

// ReadBuildInfo returns the running binary's BuildInfo.
func ReadBuildInfo() BuildInfo {
	b := BuildInfo{Version: "(devel)", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if bi.Main.Version != "" {
		b.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		b.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the one line `gateway --version` prints:
//
//	gateway v0.0.0-20261127075527-7e1214750d94 revision 7e1214750d94... time 2026-11-27T07:55:27Z go1.26.8
//
// A build without VCS information says so instead of a revision.
func (b BuildInfo) String() string {
	parts := []string{"gateway", b.Version}
	if b.Revision == "" {
		parts = append(parts, "revision unknown (built without VCS stamping: -buildvcs=false, or not in a git checkout)")
	} else {
		rev := "revision " + b.Revision
		if b.Modified {
			rev += " (modified)"
		}
		parts = append(parts, rev)
	}
	if b.Time != "" {
		parts = append(parts, "time "+b.Time)
	}
	return strings.Join(append(parts, b.GoVersion), " ")
}

// registerBuildInfo registers pipestream_gateway_build_info: always 1, the
// build in its labels (the Prometheus build_info convention).
func registerBuildInfo(reg prometheus.Registerer, b BuildInfo) error {
	if reg == nil {
		return nil
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pipestream_gateway_build_info",
		Help: "The gateway's build: module version, VCS revision and time, Go version (always 1).",
	}, []string{"version", "revision", "vcs_time", "modified", "goversion"})
	g, err := register(reg, g)
	if err != nil {
		return err
	}
	mod := "false"
	if b.Modified {
		mod = "true"
	}
	g.WithLabelValues(b.Version, b.Revision, b.Time, mod, b.GoVersion).Set(1)
	return nil
}
