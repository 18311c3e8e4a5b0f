package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestHelpTopicsAreTheDocsPages: `tailgate help` lists exactly the pages
// in docs/ (drafts in docs/_incoming aside), and `tailgate help TOPIC`
// prints the page as it is in the checkout.
func TestHelpTopicsAreTheDocsPages(t *testing.T) {
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var pages, topics []string
	for _, f := range files {
		pages = append(pages, strings.TrimSuffix(filepath.Base(f), ".md"))
	}
	for _, tp := range helpTopics {
		topics = append(topics, tp.name)
	}
	slices.Sort(pages)
	slices.Sort(topics)
	if !slices.Equal(pages, topics) {
		t.Fatalf("docs/ has pages %v, tailgate help lists %v", pages, topics)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	list := out.String()
	for _, tp := range helpTopics {
		if !strings.Contains(list, "\n  "+tp.name+" ") {
			t.Errorf("tailgate help does not list %s", tp.name)
		}
		out.Reset()
		if err := run(context.Background(), []string{"help", tp.name}, &out, &out); err != nil {
			t.Fatalf("help %s: %v", tp.name, err)
		}
		want, _ := os.ReadFile("docs/" + tp.name + ".md")
		if out.String() != string(want) {
			t.Errorf("tailgate help %s is not docs/%s.md", tp.name, tp.name)
		}
	}
	var errOut bytes.Buffer
	if err := run(context.Background(), []string{"help", "hedgehog"}, &out, &errOut); err != errUsage {
		t.Fatalf("help hedgehog: %v", err)
	}
	if last := testkit.LastLine(errOut.String()); !strings.Contains(last, `no topic "hedgehog"`) || !strings.Contains(last, "routing") {
		t.Errorf("help hedgehog: %q", last)
	}
}
