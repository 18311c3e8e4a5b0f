package main

import (
	"errors"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
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

// TestPackageDocsNameTheirEntryPoints: the big packages' docs are guides
// that name their main exported entry points as doc links ([Name]); each
// name must be in the doc and still exist in the package, so the guide
// cannot drift from the code in either direction.
func TestPackageDocsNameTheirEntryPoints(t *testing.T) {
	for dir, names := range map[string][]string{
		"data":           {"Open", "Store", "IsPostgres", "LedgerWriter", "LedgerWriter.Commit", "LedgerWriter.OpenCommitLog", "Store.SettleOpen", "Store.Usage", "Store.Backup"},
		"policy":         {"New", "Config", "Gate", "Gate.Authenticate", "Gate.Admit", "Gate.Run", "Ticket", "Ticket.Settle", "Principal", "CreateKey", "RevokeKey"},
		"router":         {"New", "Config", "Registry", "Replica", "HealthChecker", "Prober", "Selector", "P2C", "RoundRobin", "ParsePolicy", "Registry.Eject"},
		"server":         {"New", "Config", "Deps", "Server.Public", "Server.Admin", "Server.Generate", "Server.RunBatches", "Server.RunHistory", "NewTransport", "Prober"},
		"server/gateway": {"Config", "Open", "Gateway", "Gateway.Run", "Gateway.Close", "Config.Load"},
	} {
		fset := token.NewFileSet()
		doc, exported := "", map[string]bool{}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc != nil {
				doc += f.Doc.Text()
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					n := d.Name.Name
					if d.Recv != nil && len(d.Recv.List) == 1 {
						typ := d.Recv.List[0].Type
						if s, ok := typ.(*ast.StarExpr); ok {
							typ = s.X
						}
						if id, ok := typ.(*ast.Ident); ok {
							n = id.Name + "." + n
						}
					}
					exported[n] = true
				case *ast.GenDecl:
					for _, s := range d.Specs {
						if ts, ok := s.(*ast.TypeSpec); ok {
							exported[ts.Name.Name] = true
						}
					}
				}
			}
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("%s: %s is not in the package any more; update its doc and this list", dir, n)
			}
			if !strings.Contains(doc, "["+n+"]") {
				t.Errorf("%s: the package doc does not name [%s], one of its entry points", dir, n)
			}
		}
	}
}
