package main

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// listedPackage is what `go list -json` says of a package of this module.
type listedPackage struct {
	ImportPath   string
	Imports      []string // direct, production code
	Deps         []string // transitive, production code
	TestImports  []string
	XTestImports []string
}

// goList lists the module's packages.
func goList(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", "./...")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// under reports whether path is pkg or inside it (pkg "github.com/tailgate-dev/tailgate/serving"
// holds "github.com/tailgate-dev/tailgate/serving/sim").
func under(path, pkg string) bool {
	return path == pkg || strings.HasPrefix(path, pkg+"/")
}

func underAny(path string, pkgs []string) bool {
	return slices.ContainsFunc(pkgs, func(p string) bool { return under(path, p) })
}

// room is a top-level package of DESIGN's package map with its
// sub-packages, and the project packages it may depend on.
type room struct {
	path    string
	allowed []string
	why     string
}

// packageMap is DESIGN's package map: the project packages each room may
// depend on (directly or not), besides its own sub-packages. main may import
// everything.
var packageMap = []room{
	{"github.com/tailgate-dev/tailgate/server", []string{"github.com/tailgate-dev/tailgate/policy", "github.com/tailgate-dev/tailgate/router", "github.com/tailgate-dev/tailgate/serving", "github.com/tailgate-dev/tailgate/data", "github.com/tailgate-dev/tailgate/web", "github.com/tailgate-dev/tailgate/mesh"},
		"the echo app assembles the domain packages; serving on the client side only"},
	{"github.com/tailgate-dev/tailgate/policy", []string{"github.com/tailgate-dev/tailgate/data"}, "who may do what, over the store"},
	{"github.com/tailgate-dev/tailgate/router", nil, "talks to replicas through the caller's functions"},
	{"github.com/tailgate-dev/tailgate/mesh", nil, "the tsnet node stands alone"},
	{"github.com/tailgate-dev/tailgate/serving", []string{"github.com/tailgate-dev/tailgate/router", "github.com/tailgate-dev/tailgate/mesh", "github.com/tailgate-dev/tailgate/server/connlimit"},
		"the worker side: never the gateway's server, policy or data (router's wire types and the mesh node at most; the edge shares the listeners' connection caps, server/connlimit, a leaf of stdlib and prometheus)"},
	{"github.com/tailgate-dev/tailgate/web", nil, "embedded assets and their handler"},
	{"github.com/tailgate-dev/tailgate/data", nil, "SQLite and PostgreSQL below everything"},
	{"github.com/tailgate-dev/tailgate/bench", []string{"github.com/tailgate-dev/tailgate/serving/proc"},
		"the benchmark measures what a client sees, so it uses nothing of the product (but the process-group helper)"},
	{"github.com/tailgate-dev/tailgate/e2e", nil, "the end-to-end tests run the built binary; their shared helpers (testkit) use nothing of the product"},
}

// TestDeps pins DESIGN's import directions on the production code.
func TestDeps(t *testing.T) {
	pkgs := goList(t)
	for _, p := range pkgs {
		if p.ImportPath == "github.com/tailgate-dev/tailgate" {
			continue
		}
		i := slices.IndexFunc(packageMap, func(r room) bool { return under(p.ImportPath, r.path) })
		if i < 0 {
			t.Errorf("%s is in no room of DESIGN's package map (its top level is fixed)", p.ImportPath)
			continue
		}
		r := packageMap[i]
		for _, d := range p.Deps {
			if under(d, "github.com/tailgate-dev/tailgate") && !under(d, r.path) && !underAny(d, r.allowed) {
				t.Errorf("%s depends on %s; %s may import only %v (%s)", p.ImportPath, d, r.path, r.allowed, r.why)
			}
		}
	}

	for _, p := range pkgs {
		// Only the role that assembles the server imports it (and the
		// server's internal test gateway); main reaches it through the role.
		if slices.Contains(p.Imports, "github.com/tailgate-dev/tailgate/server") && p.ImportPath != "github.com/tailgate-dev/tailgate/server/gateway" && p.ImportPath != "github.com/tailgate-dev/tailgate/server/internal/servertest" {
			t.Errorf("%s imports tailgate/server; only the gateway role (tailgate/server/gateway) may", p.ImportPath)
		}
		// A role is assembled by main alone: no package builds on another's.
		for _, role := range []string{"github.com/tailgate-dev/tailgate/server/gateway", "github.com/tailgate-dev/tailgate/serving/worker"} {
			if slices.Contains(p.Imports, role) && p.ImportPath != "github.com/tailgate-dev/tailgate" {
				t.Errorf("%s imports the role %s; only main runs a role", p.ImportPath, role)
			}
		}
		if under(p.ImportPath, "github.com/tailgate-dev/tailgate/router") || under(p.ImportPath, "github.com/tailgate-dev/tailgate/data") {
			for _, d := range p.Deps {
				if under(d, "github.com/labstack/echo") {
					t.Errorf("%s depends on %s; router and data stay free of HTTP framework types", p.ImportPath, d)
				}
			}
		}
		tests := slices.Concat(p.TestImports, p.XTestImports)
		for _, d := range slices.Concat(p.Imports, tests) {
			switch {
			case under(d, "tailscale.com") && !under(p.ImportPath, "github.com/tailgate-dev/tailgate/mesh"):
				t.Errorf("%s imports %s; only tailgate/mesh (and its tests' meshtest) imports tailscale.com", p.ImportPath, d)
			case under(d, "modernc.org/sqlite") && !under(p.ImportPath, "github.com/tailgate-dev/tailgate/data"):
				t.Errorf("%s imports %s; only tailgate/data imports modernc.org/sqlite", p.ImportPath, d)
			case under(d, "github.com/jackc/pgx") && p.ImportPath != "github.com/tailgate-dev/tailgate/data":
				t.Errorf("%s imports %s; only tailgate/data imports the PostgreSQL driver", p.ImportPath, d)
			}
		}
		if slices.Contains(p.Imports, "github.com/tailgate-dev/tailgate/mesh/meshtest") {
			t.Errorf("%s imports tailgate/mesh/meshtest outside its tests; meshtest is test support", p.ImportPath)
		}
		if slices.Contains(p.Imports, "github.com/tailgate-dev/tailgate/e2e/testkit") {
			t.Errorf("%s imports tailgate/e2e/testkit outside its tests; testkit is test support", p.ImportPath)
		}
		if slices.Contains(p.Imports, "github.com/tailgate-dev/tailgate/data/pgtest") {
			t.Errorf("%s imports tailgate/data/pgtest outside its tests; pgtest is test support", p.ImportPath)
		}
	}
}

// sharedFiles are the files of package main that every command may use:
// dispatch and the usage text (main.go), the helpers more than one command
// uses (cli_shared.go), subcommand dispatch (cli_dispatch.go), flag help and
// did-you-mean (cli_usage.go) and the build info (buildinfo.go).
var sharedFiles = []string{"main.go", "cli_shared.go", "cli_dispatch.go", "cli_usage.go", "buildinfo.go"}

// commandOf is the command a file of package main belongs to: cli_up.go and
// cli_up_screen.go are up's, cli_bench_fanout.go is bench's; "" for a shared
// file.
func commandOf(file string) string {
	if slices.Contains(sharedFiles, file) {
		return ""
	}
	cmd, _, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(file, "cli_"), ".go"), "_")
	return cmd
}

// TestCommandFilesBorrowNothing pins the root's layout: main.go plus one file
// (or a few, named cli_CMD_*.go) per command, where a command's files use
// their own names and the shared files' only, never another command's
// helpers, and a shared file uses no command's names (main.go only
// dispatches to each command's entry point, cmdNAME).
func TestCommandFilesBorrowNothing(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	definedIn := map[string]string{} // package-level name -> its file
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					definedIn[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						definedIn[sp.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							definedIn[n.Name] = name
						}
					}
				}
			}
		}
	}
	if len(files) < 10 || definedIn["cmdGateway"] == "" || definedIn["newFlagSet"] == "" {
		t.Fatalf("read %d files; cmdGateway in %q, newFlagSet in %q: the root is not what this test knows", len(files), definedIn["cmdGateway"], definedIn["newFlagSet"])
	}
	for name, f := range files {
		user := commandOf(name)
		// Names a file resolves itself (locals, parameters) have an Obj;
		// a selector's name and a struct literal's field key are no
		// package-level names.
		skip := map[*ast.Ident]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				skip[n.Sel] = true
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok {
					skip[id] = true
				}
			case *ast.Ident:
				if n.Obj != nil || skip[n] || n.Name == "_" || n == f.Name {
					return true
				}
				owner, ok := definedIn[n.Name]
				if !ok || owner == name {
					return true
				}
				switch cmd := commandOf(owner); {
				case cmd == "" || cmd == user:
				case name == "main.go" && strings.HasPrefix(n.Name, "cmd"):
				case user == "":
					t.Errorf("%s (shared) uses %s of %s; a shared file uses no command's names", fset.Position(n.Pos()), n.Name, owner)
				default:
					t.Errorf("%s (%s) uses %s of %s (%s); move what two commands use to cli_shared.go", fset.Position(n.Pos()), user, n.Name, owner, cmd)
				}
			}
			return true
		})
	}
}
