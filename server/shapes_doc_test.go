package server

import (
	"os"
	"strings"
	"testing"
)

// TestAPIDocStatesEveryShape: docs/api.md's request shapes name every
// path, union member, key field, option and refused field of the table the
// readers follow, and every field of the audio forms.
func TestAPIDocStatesEveryShape(t *testing.T) {
	raw, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i := strings.Index(doc, "## Request shapes")
	if i < 0 {
		t.Fatal("docs/api.md has no Request shapes section")
	}
	doc = doc[i:]
	want := func(what, s string) {
		if !strings.Contains(doc, "`"+s+"`") {
			t.Errorf("docs/api.md's request shapes do not name the %s `%s`", what, s)
		}
	}
	for _, sh := range shapes {
		for _, p := range sh.paths {
			want("path", p)
		}
		for _, m := range sh.members {
			want("member", m.model)
			for _, k := range m.keys {
				want("key field", k)
			}
			for _, f := range m.fields {
				want("field", f)
			}
		}
		for _, f := range sh.options {
			want("field", f)
		}
		for f := range sh.refused {
			want("refused field", f)
		}
	}
	for f := range audioFields {
		want("audio field", f)
	}
}
