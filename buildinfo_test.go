package main

import (
	"strings"
	"testing"
)

// TestVersionSaysWhyItKnowsNoRevision: a binary built without VCS
// stamping says why `version` shows devel and an unknown revision, and how
// a build records them; a stamped release says no more than its fields.
func TestVersionSaysWhyItKnowsNoRevision(t *testing.T) {
	for _, tc := range []struct {
		b    buildInfo
		want string
	}{
		{buildInfo{Version: "devel", Revision: "unknown"}, "built without version control stamping"},
		{buildInfo{Version: "devel", Revision: "0123abcd"}, "an unreleased build of the commit above"},
		{buildInfo{Version: "v1.2.3", Revision: "0123abcd"}, ""},
	} {
		got := tc.b.String()
		if tc.want == "" && strings.Contains(got, "note") || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%+v:\n%s\nwant a note saying %q", tc.b, got, tc.want)
		}
	}
}

// TestUnstampedBuildNamesItself: a build the go command could not stamp
// takes the commit passed with -X main.revision, and without one `tailgate
// version` prints the binary's SHA-256, which still tells two builds apart.
func TestUnstampedBuildNamesItself(t *testing.T) {
	if b := readBuildInfo(); b.Revision != "unknown" {
		t.Skipf("this test binary is stamped (revision %s)", b.Revision)
	}
	b := readBuildInfo().withBinaryHash()
	if len(b.Binary) != 64 || !strings.Contains(b.String(), "binary     sha256:"+b.Binary) {
		t.Errorf("unstamped build without -X main.revision:\n%s\nwant its binary's sha256", b)
	}
	revision = "0123abcd"
	t.Cleanup(func() { revision = "" })
	b = readBuildInfo().withBinaryHash()
	if b.Revision != "0123abcd" || b.Binary != "" || strings.Contains(b.String(), "built without version control") {
		t.Errorf("unstamped build with -X main.revision=0123abcd:\n%s\nwant that revision, no hash, no note about stamping", b)
	}
}
