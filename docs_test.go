package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
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
		"router":         {"New", "Config", "Registry", "Replica", "HealthChecker", "Prober", "Selector", "P2C", "RoundRobin", "ParsePolicy", "Registry.Eject", "Call", "Registry.NewCall", "Registry.Do", "Call.Start", "Call.Whole", "Call.Progress", "Call.End", "Call.Finish", "OpenFunc", "AssembleFunc", "ErrBroke"},
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

// userDocs returns the user documentation by file name: README.md and the
// pages of docs/ (drafts in docs/_incoming are not pages yet).
func userDocs(t *testing.T) map[string]string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, p := range append(pages, "README.md") {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[p] = string(raw)
	}
	if len(docs) < 5 {
		t.Fatalf("found only %v", pages)
	}
	return docs
}

var (
	fencedBlock = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```")
	codeSpan    = regexp.MustCompile("`([^`\n]+)`")
)

// commandNames are tailgate's commands; those with subcommands list them.
var commandNames = map[string][]string{
	"up": nil, "gateway": nil, "worker": nil, "sim": nil, "usage": nil, "bench": nil, "backup": nil,
	"restore": nil, "version": nil, "healthcheck": nil, "init": nil, "help": nil, "edge": nil,
	"tune": nil,
	"keys": {"create", "list", "edit", "revoke", "rotate"}, "tenants": {"list", "show", "set"},
	"workers": {"list", "invite", "approve", "revoke", "code"},
}

// docCommand is one tailgate command line a document shows.
type docCommand struct {
	where string   // file:line
	path  []string // the command and its subcommand: ["keys", "create"]
	flags []string // the flag names given, without dashes
}

// tailgateCommands finds the tailgate command lines of a document: in
// shell code blocks (a line continued with a backslash joined to the next)
// and in inline code spans, written `tailgate CMD …` or `go run . CMD …`,
// also inside $( … ) and after sudo. A word in capitals (COMMAND) is a
// placeholder, not a command.
func tailgateCommands(file, text string) (cmds []docCommand, unknown []string) {
	type piece struct {
		line int
		text string
	}
	var pieces []piece
	lineOf := func(off int) int { return strings.Count(text[:off], "\n") + 1 }
	for _, m := range fencedBlock.FindAllStringSubmatchIndex(text, -1) {
		if lang := text[m[2]:m[3]]; lang != "sh" && lang != "bash" && lang != "" {
			continue
		}
		first := lineOf(m[4])
		var joined strings.Builder
		for k, l := range strings.Split(text[m[4]:m[5]], "\n") {
			if joined.Len() == 0 {
				first = lineOf(m[4]) + k
			}
			if c, ok := strings.CutSuffix(l, "\\"); ok {
				joined.WriteString(c + " ")
				continue
			}
			joined.WriteString(l)
			pieces = append(pieces, piece{first, joined.String()})
			joined.Reset()
		}
	}
	prose := fencedBlock.ReplaceAllStringFunc(text, func(b string) string { return strings.Repeat("\n", strings.Count(b, "\n")) })
	for _, m := range codeSpan.FindAllStringSubmatchIndex(prose, -1) {
		pieces = append(pieces, piece{lineOf(m[2]), prose[m[2]:m[3]]})
	}
	for _, p := range pieces {
		if i := strings.Index(" "+p.text, " #"); i >= 0 {
			p.text = p.text[:max(i-1, 0)] // a comment
		}
		words := strings.Fields(p.text)
		for i := 0; i < len(words); i++ {
			w := strings.TrimLeft(words[i], "$(")
			var cmdAt int
			switch {
			case w == "tailgate" && i+1 < len(words):
				cmdAt = i + 1
			case w == "go" && i+3 < len(words) && words[i+1] == "run" && words[i+2] == ".":
				cmdAt = i + 3
			default:
				continue
			}
			name := words[cmdAt]
			subs, known := commandNames[name]
			if !known {
				if commandWord.MatchString(name) && name != "tailgate" {
					unknown = append(unknown, fmt.Sprintf("%s:%d: tailgate %s", file, p.line, name))
				}
				continue
			}
			c := docCommand{where: fmt.Sprintf("%s:%d", file, p.line), path: []string{name}}
			j := cmdAt + 1
			if subs != nil && j < len(words) && slices.Contains(subs, words[j]) {
				c.path = append(c.path, words[j])
				j++
			}
			for ; j < len(words); j++ {
				w := words[j]
				if w == "|" || w == ";" || w == "&&" || w == "||" || strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>") {
					break
				}
				if q := w[:1]; q == `"` || q == `'` {
					// A quoted value, maybe flags for another command
					// (--worker-args "--sim-ttft 80ms"): skip to its end.
					for len(w) < 2 || !strings.HasSuffix(strings.TrimRight(w, ")"), q) {
						if j++; j == len(words) {
							break
						}
						w = words[j]
					}
					continue
				}
				if f := docFlag.FindStringSubmatch(w); f != nil {
					c.flags = append(c.flags, f[1])
				}
				if strings.HasSuffix(w, ")") {
					break
				}
			}
			cmds = append(cmds, c)
			i = j
		}
	}
	return cmds, unknown
}

var commandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

var docFlag = regexp.MustCompile(`^[\[(|]*--?([a-z][a-z0-9-]*)`)

// acceptsFlag reports whether `tailgate PATH --name=x -h` gets as far as
// the help (the flag exists and took x) or is refused for x as a value (the
// flag exists): only an unknown flag is refused otherwise. Nothing runs.
func acceptsFlag(path []string, name string) bool {
	var stderr strings.Builder
	err := run(context.Background(), append(slices.Clone(path), "--"+name+"=x", "-h"), io.Discard, &stderr)
	if errors.Is(err, flag.ErrHelp) {
		return true
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	return strings.Contains(lines[len(lines)-1], "invalid")
}

// TestDocumentedCommandLinesAreTrue: every tailgate command line in the
// README and docs/ names a command that exists, and every flag it gives
// exists on that command.
func TestDocumentedCommandLinesAreTrue(t *testing.T) {
	n := 0
	for file, text := range userDocs(t) {
		cmds, unknown := tailgateCommands(file, text)
		for _, u := range unknown {
			t.Errorf("%s: no such command", u)
		}
		for _, c := range cmds {
			if c.path[0] == "help" || c.path[0] == "version" {
				continue
			}
			for _, f := range c.flags {
				n++
				paths := [][]string{c.path}
				if subs := commandNames[c.path[0]]; subs != nil && len(c.path) == 1 {
					paths = nil // `tailgate keys … --data DIR`: any of its subcommands
					for _, s := range subs {
						paths = append(paths, []string{c.path[0], s})
					}
				}
				if !slices.ContainsFunc(paths, func(p []string) bool { return acceptsFlag(p, f) }) {
					t.Errorf("%s: `tailgate %s` has no flag --%s", c.where, strings.Join(c.path, " "), f)
				}
			}
		}
	}
	if n < 100 {
		t.Fatalf("checked only %d flags of documented command lines", n)
	}
}

// foreignFlags are flags the docs name that belong to other programs
// (vLLM's, which the worker sets or refuses; Headscale's; the scripts').
var foreignFlags = map[string]string{
	"host": "vLLM", "port": "vLLM", "disable-log-requests": "vLLM (removed)", "enable-prefix-caching": "vLLM",
	"stream-interval": "vLLM", "user": "headscale", "tags": "headscale", "ephemeral": "headscale",
	"reusable": "headscale", "expiration": "headscale", "only": "scripts/release.sh", "images": "scripts/release.sh",
	"out": "scripts/release.sh", "help": "scripts/gpu-check.sh", "gpus": "docker", "profile": "docker compose",
	"flag": "a placeholder (--flag or -flag)", "no-enable-prefix-caching": "vLLM", "otlp-traces-endpoint": "vLLM", "version": "tailgate --version, the version command",
	"enable-sleep-mode":       "vLLM (worker --sleep-mode sets it)",
	"scheduling-policy":       "vLLM (worker --engine-priority-scheduling sets it)",
	"metadata-from-file":      "gcloud compute instances create (docs/capacity.md, preemption notices)",
	"show":                    "bench/tailtrace (docs/operations.md, profiling the gateway)",
	"kv-sharing-fast-prefill": "vLLM (docs/tuning.md, passed with --vllm-arg)",
	"output-format":           "claude (Claude Code headless, README Clients)",
}

// TestDocumentedFlagsExist: a flag named anywhere in the README and docs/
// (`--name` in prose and tables) is a flag of some tailgate command, or one
// of another program's flags listed in foreignFlags.
func TestDocumentedFlagsExist(t *testing.T) {
	var paths [][]string
	for name, subs := range commandNames {
		if name == "help" || name == "version" {
			continue
		}
		if subs == nil {
			paths = append(paths, []string{name})
		}
		for _, s := range subs {
			paths = append(paths, []string{name, s})
		}
	}
	known := map[string]bool{}
	exists := func(name string) bool {
		if v, ok := known[name]; ok {
			return v
		}
		known[name] = slices.ContainsFunc(paths, func(p []string) bool { return acceptsFlag(p, name) })
		return known[name]
	}
	flagSpan := regexp.MustCompile("`--([a-z][a-z0-9-]*)")
	n := 0
	for file, text := range userDocs(t) {
		prose := fencedBlock.ReplaceAllString(text, "")
		for _, m := range flagSpan.FindAllStringSubmatch(prose, -1) {
			n++
			if strings.HasSuffix(m[1], "-") {
				continue // `--sim-*`, a family
			}
			if _, foreign := foreignFlags[m[1]]; !foreign && !exists(m[1]) {
				t.Errorf("%s names --%s, which no tailgate command has", file, m[1])
			}
		}
	}
	if n < 200 {
		t.Fatalf("checked only %d flags", n)
	}
}

// TestDocsLinksResolve: every relative link between the README and the
// docs pages names a file that exists and, with #anchor, a heading in it;
// the README links every page.
func TestDocsLinksResolve(t *testing.T) {
	docs := userDocs(t)
	anchors := map[string]map[string]bool{}
	heading := regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	for file, text := range docs {
		anchors[file] = map[string]bool{}
		prose := fencedBlock.ReplaceAllString(text, "")
		for _, h := range heading.FindAllStringSubmatch(prose, -1) {
			anchors[file][githubSlug(h[1])] = true
		}
	}
	link := regexp.MustCompile(`\]\(([^)#\s]*)(?:#([^)\s]+))?\)`)
	for file, text := range docs {
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target, anchor := m[1], m[2]
			if strings.Contains(target, "://") {
				continue
			}
			path := file
			if target != "" {
				path = filepath.Join(filepath.Dir(file), target)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links %s, which does not exist", file, target)
				continue
			}
			if anchor != "" && anchors[path] != nil && !anchors[path][anchor] {
				t.Errorf("%s links %s#%s: no such heading there", file, target, anchor)
			}
		}
	}
	for file := range docs {
		if file != "README.md" && !strings.Contains(docs["README.md"], "]("+file+")") {
			t.Errorf("the README does not link %s", file)
		}
	}
}

// TestREADMEIsAFrontPage: the README stays a front page a newcomer reads
// to the end — at most 15,000 characters, the install and the five-minute
// walk before the table of contents — and the reference lives in docs/.
func TestREADMEIsAFrontPage(t *testing.T) {
	readme := userDocs(t)["README.md"]
	if n := utf8.RuneCountInString(readme); n > 15000 {
		t.Errorf("the README is %d characters; a front page is at most 15,000 (move the detail into a docs/ page)", n)
	}
	install := strings.Index(readme, "\n## Install")
	walk := strings.Index(readme, "\n## Five minutes with tailgate")
	contents := strings.Index(readme, "\n## Documentation")
	if install < 0 || walk < install || contents < walk {
		t.Errorf("the README's sections Install (at %d), Five minutes with tailgate (at %d) and Documentation (at %d) are not there in that order",
			install, walk, contents)
	}
}

// githubSlug is the anchor GitHub gives a heading: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func githubSlug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// moduleIndex is what the module's Go code declares, for checking the
// names the documentation gives: by package name (the last element of its
// directory, or its package clause) the top-level names; by type name the
// methods and fields; and every .go file by its path.
type moduleIndex struct {
	pkgs    map[string]map[string]bool // package name → its top-level names, methods as Type.Method
	members map[string]map[string]bool // type name → its methods and fields
	files   map[string]bool            // slash-separated paths of .go files
	base    map[string]bool            // base names of .go files
	dirs    map[string]bool            // top-level directories
	docs    map[string]string          // package directory → its package doc
}

func indexModule(t *testing.T) *moduleIndex {
	t.Helper()
	ix := &moduleIndex{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{},
		files: map[string]bool{}, base: map[string]bool{}, dirs: map[string]bool{}, docs: map[string]string{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != "." && !strings.Contains(path, string(filepath.Separator)) {
				ix.dirs[name] = true
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		ix.files[filepath.ToSlash(path)], ix.base[name] = true, true
		if strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		if f.Doc != nil {
			ix.docs[filepath.Dir(path)] += f.Doc.Text()
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil || len(decl.Recv.List) != 1 {
					add(ix.pkgs, pkg, decl.Name.Name)
					continue
				}
				typ := decl.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if g, ok := typ.(*ast.IndexExpr); ok {
					typ = g.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					add(ix.pkgs, pkg, id.Name+"."+decl.Name.Name)
					add(ix.members, id.Name, decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range decl.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						add(ix.pkgs, pkg, s.Name.Name)
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								for _, n := range fl.Names {
									add(ix.members, s.Name.Name, n.Name)
									add(ix.pkgs, pkg, s.Name.Name+"."+n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(ix.pkgs, pkg, n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

var (
	goFileName   = regexp.MustCompile(`(?:^|[\s(,\x60])((?:[a-z0-9_]+/)*[a-z0-9][a-z0-9_]*\.go)\b`)
	qualifiedID  = regexp.MustCompile(`^\*?([A-Za-z_][A-Za-z0-9_]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?(?:\(\))?$`)
	docLink      = regexp.MustCompile(`\[(\*?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,2})\]`)
	foreignRepos = regexp.MustCompile(`[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+ (?:\x60|[A-Za-z0-9_./-]+\.go)`) // owner/repo file.go
)

// fileExists reports whether a .go file a document names is this module's:
// a path under one of its top-level directories must exist as written; a
// bare name must be some package's file. A path under a directory the
// module does not have is another repository's (vLLM's, tailscale's).
func (ix *moduleIndex) fileExists(name, pkgDir string) bool {
	if !strings.Contains(name, "/") {
		if pkgDir != "" {
			return ix.files[filepath.ToSlash(filepath.Join(pkgDir, name))]
		}
		return ix.base[name]
	}
	first, _, _ := strings.Cut(name, "/")
	if !ix.dirs[first] {
		return true // another repository's
	}
	return ix.files[name]
}

// nameExists reports whether pkg.Name[.Member] or Type.Member is declared
// in the module; known is false when the first part is neither one of the
// module's package names nor one of its types (http.Server, time.Duration:
// not the module's to check).
func (ix *moduleIndex) nameExists(first, second, third string) (exists, known bool) {
	if names, ok := ix.pkgs[first]; ok {
		if third != "" {
			return names[second+"."+third], true
		}
		return names[second], true
	}
	if members, ok := ix.members[first]; ok && third == "" {
		return members[second], true
	}
	return false, false
}

// TestDocsNameWhatExists: the Go names and files the documentation names
// exist — in the docs pages and the README, every code span that names a
// .go file of the module or a qualified name (`router.Call`,
// `Registry.NewCall`, `server/upstream.go`); in every package doc, the .go
// files it names (in its own directory unless given with a path) and its
// doc links ([Name], [Type.Method], [pkg.Name] of the module). A file
// renamed or a function removed fails here until its docs follow.
func TestDocsNameWhatExists(t *testing.T) {
	ix := indexModule(t)
	for file, text := range userDocs(t) {
		for _, m := range codeSpan.FindAllStringSubmatchIndex(text, -1) {
			span := text[m[2]:m[3]]
			line := strings.Count(text[:m[0]], "\n") + 1
			if strings.HasSuffix(span, ".go") && !strings.ContainsAny(span, " *") {
				// A foreign repository's file is written after its name.
				lineStart := strings.LastIndexByte(text[:m[0]], '\n') + 1
				if foreignRepos.MatchString(text[lineStart:m[1]]) && !ix.files[span] {
					continue
				}
				if !ix.fileExists(span, "") {
					t.Errorf("%s:%d: names `%s`, which is no file of this module", file, line, span)
				}
				continue
			}
			q := qualifiedID.FindStringSubmatch(span)
			if q == nil {
				continue
			}
			if exists, known := ix.nameExists(q[1], q[2], q[3]); known && !exists {
				t.Errorf("%s:%d: names `%s`, which the module does not declare", file, line, span)
			}
		}
	}
	for dir, doc := range ix.docs {
		pkgNames := ix.pkgs[filepath.Base(dir)]
		for _, m := range goFileName.FindAllStringSubmatch(doc, -1) {
			if !ix.fileExists(m[1], dir) {
				t.Errorf("%s: the package doc names %s, which is not there", dir, m[1])
			}
		}
		for _, m := range docLink.FindAllStringSubmatch(doc, -1) {
			parts := strings.Split(strings.TrimPrefix(m[1], "*"), ".")
			switch {
			case len(parts) == 1 && ix.pkgs[parts[0]] != nil:
				// [pkg]: a package of the module.
			case len(parts) == 1 || unicode.IsUpper(rune(parts[0][0])):
				// [Name] or [Type.Method] of the package itself.
				if pkgNames != nil && !pkgNames[strings.Join(parts, ".")] && !pkgNames[parts[0]] {
					t.Errorf("%s: the package doc links [%s], which the package does not declare", dir, m[1])
				}
				if len(parts) > 1 && pkgNames[parts[0]] && !pkgNames[strings.Join(parts, ".")] {
					t.Errorf("%s: the package doc links [%s], which the package does not declare", dir, m[1])
				}
			default:
				if exists, known := ix.nameExists(parts[0], parts[1], strings.Join(parts[2:], ".")); known && !exists {
					t.Errorf("%s: the package doc links [%s], which the module does not declare", dir, m[1])
				}
			}
		}
	}
}
