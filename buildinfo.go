package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is the release this binary is, set at build time with
// -ldflags "-X main.version=v1.2.3"; empty: the main module's version as
// the go command stamped it (a tagged `go install`), else "devel".
var version string

// buildInfo says what a binary was built from. A field that the build did
// not record (go run, a build without VCS stamping) is "unknown", never a
// guess.
type buildInfo struct {
	Version   string // the release, or "devel"
	Revision  string // the VCS commit, "+dirty" appended when the tree had changes
	GoVersion string // the toolchain that built it
	Tailscale string // the tailscale.com module linked in (the embedded mesh node)
}

// readBuildInfo reads the binary's own build information.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: "devel", Revision: "unknown", GoVersion: runtime.Version(), Tailscale: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		b.Version = v
	}
	if version != "" {
		b.Version = version
	}
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Revision != "unknown" {
		b.Revision += "+dirty"
	}
	if bi.GoVersion != "" {
		b.GoVersion = bi.GoVersion
	}
	for _, d := range bi.Deps {
		if d.Path == "tailscale.com" {
			b.Tailscale = d.Version
			if d.Replace != nil {
				b.Tailscale = d.Replace.Version + " (replaced: " + d.Replace.Path + ")"
			}
		}
	}
	return b
}

func (b buildInfo) String() string {
	s := fmt.Sprintf("tailgate %s\n  revision   %s\n  go         %s\n  tailscale  %s\n  platform   %s/%s\n",
		b.Version, b.Revision, b.GoVersion, b.Tailscale, runtime.GOOS, runtime.GOARCH)
	switch {
	case b.Revision == "unknown":
		s += "  note       built without version control stamping (from a source archive, with -buildvcs=false, or by go run), so neither the release nor the commit is known; " +
			"a release archive's binary says both, and `go build` in a git checkout records the commit\n"
	case b.Version == "devel":
		s += "  note       an unreleased build of the commit above (a release build sets its version: -ldflags \"-X main.version=v1.2.3\")\n"
	}
	return s
}

// collector is the tailgate_build_info gauge: always 1, its labels say
// what is running (Prometheus' own build_info convention), so dashboards
// can join on it and alerts can tell versions apart during a rollout.
func (b buildInfo) collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailgate_build_info",
		Help: "A metric with a constant '1' value labeled by version, revision, goversion and tailscale (the tailscale.com module) of this binary.",
		ConstLabels: prometheus.Labels{
			"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion, "tailscale": b.Tailscale,
		},
	})
	g.Set(1)
	return g
}
