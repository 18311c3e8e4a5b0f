package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is the release this binary is, set at build time with
// -ldflags "-X main.version=v1.2.3"; empty: the main module's version as
// the go command stamped it (a tagged `go install`), else "devel".
var version string

// revision is the commit this binary was built from, set at build time with
// -ldflags "-X main.revision=COMMIT" where the go command cannot stamp it:
// a container build whose context leaves .git out (deploy/Dockerfile's
// REVISION build argument), a source archive. The go command's own stamp
// (vcs.revision) wins when there is one.
var revision string

// buildInfo says what a binary was built from. A field that the build did
// not record (go run, a build without VCS stamping) is "unknown", never a
// guess.
type buildInfo struct {
	Version   string // the release, or "devel"
	Revision  string // the VCS commit, "+dirty" appended when the tree had changes
	GoVersion string // the toolchain that built it
	Tailscale string // the tailscale.com module linked in (the embedded mesh node)
	// Binary is the SHA-256 of the executable, hex, when `tailgate
	// version` reads it for a build that knows no revision: it still names
	// the exact build, so two boxes' binaries can be told apart. "" when
	// not read.
	Binary string
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
	if b.Revision == "unknown" && revision != "" {
		b.Revision = revision
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
	if b.Binary != "" {
		s += "  binary     sha256:" + b.Binary + "\n"
	}
	switch {
	case b.Revision == "unknown":
		s += "  note       built without version control stamping (from a source archive, a container build without .git, with -buildvcs=false, or by go run), so neither the release nor the commit is known" +
			"; the binary's sha256 above still tells this build from another. `go build` in a git checkout records the commit; elsewhere pass it: " +
			"-ldflags \"-X main.version=v1.2.3 -X main.revision=COMMIT\" (deploy/Dockerfile: --build-arg VERSION=… --build-arg REVISION=$(git rev-parse HEAD)); a release archive's binary says both\n"
	case b.Version == "devel":
		s += "  note       an unreleased build of the commit above (a release build sets its version: -ldflags \"-X main.version=v1.2.3\")\n"
	}
	return s
}

// withBinaryHash fills b.Binary from the running executable when the build
// knows no revision (a read of the binary, tens of milliseconds: done for
// `tailgate version`, not at every start).
func (b buildInfo) withBinaryHash() buildInfo {
	if b.Revision != "unknown" {
		return b
	}
	exe, err := os.Executable()
	if err != nil {
		return b
	}
	f, err := os.Open(exe)
	if err != nil {
		return b
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err == nil {
		b.Binary = hex.EncodeToString(h.Sum(nil))
	}
	return b
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
