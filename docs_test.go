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
	"workers": {"list", "invite", "approve", "revoke"},
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
	"metadata-from-file":      "gcloud compute instances create (docs/capacity.md, preemption notices)",
	"show":                    "bench/tailtrace (docs/operations.md, profiling the gateway)",
	"kv-sharing-fast-prefill": "vLLM (docs/tuning.md, passed with --vllm-arg)",
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
