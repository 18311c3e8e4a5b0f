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
