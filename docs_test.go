package main

import (
	"errors"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs: every package directory has exactly one package doc
// comment, in one of its non-test files, and it starts as go doc expects
// ("Package NAME ..." or, for a program, "Command NAME ...").
func TestPackageDocs(t *testing.T) {
	dirs := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(path, 0)
		if _, none := errors.AsType[*build.NoGoError](err); none {
			return nil
		}
		if err != nil {
			return err
		}
		dirs++
		var docs []string
		for _, name := range pkg.GoFiles {
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(path, name), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				return err
			}
			if f.Doc == nil {
				continue
			}
			docs = append(docs, name)
			text := f.Doc.Text()
			if !strings.HasPrefix(text, "Package "+pkg.Name+" ") && !(pkg.Name == "main" && strings.HasPrefix(text, "Command ")) {
				t.Errorf("%s: the package doc starts %q; want \"Package %s ...\"", filepath.Join(path, name), firstLine(text), pkg.Name)
			}
		}
		if len(docs) != 1 {
			t.Errorf("%s: %d package doc comments %v; want exactly one", path, len(docs), docs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if dirs < 10 {
		t.Fatalf("found only %d package directories", dirs)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
