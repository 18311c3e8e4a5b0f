package e2e

import (
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCommandsRefuseADataDirWithoutDatabase: the commands that read an
// existing deployment, given a --data that holds no database (a typo, or a
// directory that is not the gateway's), exit 1 saying so, and create
// nothing there — before, keys and usage made a fresh database whose keys
// no gateway knew.
func TestCommandsRefuseADataDirWithoutDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	for _, tc := range []struct {
		name string
		args func(dir string) []string
	}{
		{"keys create", func(dir string) []string { return []string{"keys", "create", "--data", dir, "--tenant", "acme"} }},
		{"keys list", func(dir string) []string { return []string{"keys", "list", "--data", dir} }},
		{"keys revoke", func(dir string) []string { return []string{"keys", "revoke", "--data", dir, "tg-abcdefgh"} }},
		{"keys edit", func(dir string) []string { return []string{"keys", "edit", "--data", dir, "tg-abcdefgh", "--rpm", "1"} }},
		{"tenants list", func(dir string) []string { return []string{"tenants", "list", "--data", dir} }},
		{"tenants show", func(dir string) []string { return []string{"tenants", "show", "--data", dir, "acme"} }},
		{"tenants set", func(dir string) []string {
			return []string{"tenants", "set", "--data", dir, "acme", "--budget-tokens", "5"}
		}},
		{"usage", func(dir string) []string { return []string{"usage", "--data", dir, "--json"} }},
		{"backup", func(dir string) []string {
			return []string{"backup", "--data", dir, filepath.Join(t.TempDir(), "copy.db")}
		}},
	} {
		for _, where := range []string{"missing", "empty"} {
			t.Run(tc.name+"/"+where, func(t *testing.T) {
				dir := t.TempDir()
				if where == "missing" {
					dir = filepath.Join(dir, "tailgate-dta")
				}
				code, stderr := runToExit(t, 30*time.Second, tc.args(dir)...)
				if code != 1 {
					t.Errorf("exit status %d, want 1", code)
				}
				line := errorLine(t, stderr)
				for _, w := range []string{"--data " + dir, "holds no database"} {
					if !strings.Contains(line, w) {
						t.Errorf("error line lacks %q", w)
					}
				}
				if _, err := os.Stat(filepath.Join(dir, "tailgate.db")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a database was created in %s (%v)", dir, err)
				}
				if where == "missing" {
					if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("the directory %s was created (%v)", dir, err)
					}
				}
				if t.Failed() {
					t.Logf("stderr:\n%s", stderr)
				}
			})
		}
	}
}

// TestCommandLineMistakesAreUsageErrors: a word where a flag belongs would
// end the flag package's parsing and drop every flag after it (`up foo
// --replicas 1` started two replicas), so every command refuses an
// argument it does not take; an unknown flag is reported last, after a
// short usage instead of under the whole flag list; exit status 2, and
// nothing starts.
func TestCommandLineMistakesAreUsageErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	dir := t.TempDir()
	listen := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		want string // the last line of stderr
	}{
		{"up with a stray word", append([]string{"up", "foo", "--replicas", "1", "--data", dir}, listen...),
			`tailgate up: unexpected argument "foo": up takes flags only`},
		{"up with a stray word after the flags", append([]string{"up", "--replicas", "1", "--data", dir, "foo"}, listen...),
			`tailgate up: unexpected argument "foo": up takes flags only`},
		{"gateway with a stray word", append([]string{"gateway", "--data", dir, "extra"}, listen...),
			`tailgate gateway: unexpected argument "extra": gateway takes flags only`},
		{"worker with a stray word", []string{"worker", "sim", "--engine", "sim"},
			`tailgate worker: unexpected argument "sim": worker takes flags only`},
		{"sim with a stray word", []string{"sim", "--listen", "127.0.0.1:0", "llama"},
			`tailgate sim: unexpected argument "llama": sim takes flags only`},
		{"keys create with a stray word", []string{"keys", "create", "acme", "--data", dir, "--tenant", "acme"},
			`tailgate keys create: unexpected argument "acme": keys create takes flags only`},
		{"usage with a switch given a separate value", []string{"usage", "--data", dir, "--json", "false"},
			`tailgate usage: unexpected argument "false": usage takes flags only (a switch takes its value after '=', e.g. --json=false)`},
		{"keys revoke with two keys", []string{"keys", "revoke", "--data", dir, "tg-aaaaaaaa", "tg-bbbbbbbb"},
			`tailgate keys revoke: unexpected argument "tg-bbbbbbbb"`},
		{"keys revoke without a key", []string{"keys", "revoke", "--data", dir},
			`tailgate keys revoke: want the KEY to revoke`},
		{"up with an unknown flag", []string{"up", "--replica", "1"},
			`tailgate up: flag provided but not defined: -replica (did you mean --replicas?)`},
		{"gateway with a flag missing its value", []string{"gateway", "--data"},
			`tailgate gateway: flag needs an argument: -data`},
		{"keys with an unknown subcommand", []string{"keys", "delete"},
			`tailgate keys: unknown subcommand "delete" (want create, list, edit, rotate or revoke)`},
		{"keys edit without a key", []string{"keys", "edit", "--data", dir, "--rpm", "1"},
			`tailgate keys edit: want the KEY to edit`},
		{"keys edit with nothing to change", []string{"keys", "edit", "--data", dir, "tg-aaaaaaaa"},
			`tailgate keys edit: nothing to change: give --rpm, --tpm, --max-concurrency, --models, --all-models, --expires, --class, --name, --owner or --note`},
		{"keys edit with empty models", []string{"keys", "edit", "--data", dir, "tg-aaaaaaaa", "--models", ""},
			`tailgate keys edit: --models is empty: to let the key use every model, give --all-models`},
		{"keys edit with a bad expiry", []string{"keys", "edit", "--data", dir, "tg-aaaaaaaa", "--expires", "soon"},
			`tailgate keys edit: --expires: expiry "soon": want a duration from now (30d, 720h), a time in RFC 3339 (2027-01-31T00:00:00Z) or never`},
		{"keys create with a bad expiry", []string{"keys", "create", "--data", dir, "--tenant", "acme", "--expires", "30x"},
			`tailgate keys create: --expires: expiry "30x": want a duration from now (30d, 720h), a time in RFC 3339 (2027-01-31T00:00:00Z) or never`},
		{"workers with an unknown subcommand", []string{"workers", "rm"},
			`tailgate workers: unknown subcommand "rm" (want list, invite, approve, revoke or code)`},
		{"tenants with an unknown subcommand", []string{"tenants", "rm"},
			`tailgate tenants: unknown subcommand "rm" (want list, show or set)`},
		{"tenants list with a stray word", []string{"tenants", "list", "--data", dir, "acme"},
			`tailgate tenants list: unexpected argument "acme": tenants list takes flags only`},
		{"tenants show without a name", []string{"tenants", "show", "--data", dir},
			`tailgate tenants show: want the NAME of the tenant`},
		{"tenants set with nothing to change", []string{"tenants", "set", "--data", dir, "acme"},
			`tailgate tenants set: nothing to change: give --budget-tokens, --budget, --budget-period or --budget-alert-percent`},
		{"tenants set with an unknown flag", []string{"tenants", "set", "--data", dir, "acme", "--period", "day"},
			`tailgate tenants set: flag provided but not defined: -period`},
		{"worker with a typo in a flag", []string{"worker", "--gatway", "http://127.0.0.1:1"},
			`tailgate worker: flag provided but not defined: -gatway (did you mean --gateway?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runToExit(t, 30*time.Second, tc.args...)
			if code != 2 {
				t.Errorf("exit status %d, want 2", code)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if last := lines[len(lines)-1]; last != tc.want {
				t.Errorf("last line of stderr:\n  %s\nwant\n  %s", last, tc.want)
			}
			if len(lines) > 12 {
				t.Errorf("%d lines on stderr; want a short usage, not the flag list", len(lines))
			}
			if !strings.HasPrefix(stderr, "Usage") {
				t.Errorf("stderr does not start with the usage")
			}
			if strings.Contains(stderr, "level=") {
				t.Errorf("the command started (it logged)")
			}
			if t.Failed() {
				t.Logf("stderr:\n%s", stderr)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "tailgate.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused command created a database (%v)", err)
	}
}

// TestHelpExitsZero: -h (and --help, help) prints the usage and exits 0 on
// every command, `keys` included.
func TestHelpExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	for _, args := range [][]string{
		{"keys", "-h"}, {"keys", "--help"}, {"keys", "help"}, {"keys", "create", "-h"}, {"keys", "revoke", "--help"},
		{"keys", "edit", "-h"}, {"tenants", "-h"}, {"tenants", "list", "-h"}, {"tenants", "show", "-h"}, {"tenants", "set", "--help"}, {"workers", "-h"},
		{"usage", "-h"}, {"backup", "-h"}, {"restore", "-h"}, {"up", "-h"}, {"gateway", "--help"}, {"worker", "-h"}, {"sim", "-h"}, {"bench", "-h"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stderr := runToExit(t, 30*time.Second, args...)
			if code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			if !strings.HasPrefix(stderr, "Usage") {
				t.Errorf("no usage printed:\n%s", stderr)
			}
		})
	}
}

// TestDashboardTokenNotPrintedWhenStdoutIsNotATerminal: `up` and `gateway`
// whose stdout is a pipe (as under systemd, where it lands in the journal,
// or a container runtime) print the dashboard link without the admin token
// and name DIR/dashboard.url, a 0600 file holding the link with the token
// (in the URL fragment, which a browser never sends); no log line carries
// the token either.
func TestDashboardTokenNotPrintedWhenStdoutIsNotATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	up := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	gw := startGateway(t)
	for _, c := range []struct {
		name, printed, admin, dir, logs string
	}{
		{"up", up.uiToken, up.admin, up.dir, up.stderr.String()},
		{"gateway", gw.uiToken, gw.admin, gw.dir, gw.stderr.String()},
	} {
		token := readToken(t, filepath.Join(c.dir, "admin.token"))
		if c.printed != "" {
			t.Errorf("%s prints the admin token on a stdout that is not a terminal: #token=%s", c.name, c.printed)
		}
		path := filepath.Join(c.dir, "dashboard.url")
		if !strings.Contains(c.logs, "path="+path) {
			t.Errorf("%s does not say where the link with the token is (%s):\n%s", c.name, path, c.logs)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %s has mode %04o, want 0600", c.name, path, fi.Mode().Perm())
		}
		link := readToken(t, path)
		if want := c.admin + "/ui/#token=" + url.QueryEscape(token); link != want {
			t.Errorf("%s: %s holds %q, want %q", c.name, path, link, want)
		}
		if strings.Contains(c.logs, token) {
			t.Errorf("%s logs its admin token:\n%s", c.name, c.logs)
		}
	}
}

// TestVersionCommand: `tailgate version` and `tailgate --version` print the
// release, the commit (or "unknown" when the build recorded none), the Go
// toolchain and the tailscale.com module in go.mod; -X main.version sets
// the release.
func TestVersionCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the built binary")
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	ts := regexp.MustCompile(`(?m)^\s*tailscale\.com (v\S+)`).FindSubmatch(gomod)
	if ts == nil {
		t.Fatal("no tailscale.com in go.mod")
	}
	stamped := filepath.Join(t.TempDir(), "tailgate")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-test", "-o", stamped, "..").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		bin, arg, version string
	}{
		{binPath, "version", ""}, {binPath, "--version", ""}, {stamped, "version", "v9.8.7-test"},
	} {
		out, err := exec.Command(tc.bin, tc.arg).Output()
		if err != nil {
			t.Fatalf("tailgate %s: %v", tc.arg, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		field := map[string]string{}
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			field[f[0]] = strings.Join(f[1:], " ")
		}
		ver := strings.TrimPrefix(lines[0], "tailgate ")
		switch {
		case tc.version != "" && ver != tc.version:
			t.Errorf("%s: version %q, want %q", tc.arg, ver, tc.version)
		case tc.version == "" && ver == "":
			t.Errorf("%s: no version on the first line %q", tc.arg, lines[0])
		}
		if field["go"] != runtime.Version() {
			t.Errorf("%s: go %q, want %q", tc.arg, field["go"], runtime.Version())
		}
		if field["tailscale"] != string(ts[1]) {
			t.Errorf("%s: tailscale %q, want %s (go.mod)", tc.arg, field["tailscale"], ts[1])
		}
		if rev := strings.TrimSuffix(field["revision"], "+dirty"); rev != "unknown" {
			head, _ := exec.Command("git", "rev-parse", "HEAD").Output()
			if rev != strings.TrimSpace(string(head)) {
				t.Errorf("%s: revision %q, want unknown or HEAD %s", tc.arg, rev, head)
			}
		}
	}
}

// TestHelpShowsTheFlagsToKnowFirst: `up -h` fits a screen with the flags
// a newcomer needs, under group headings, and points to --help-all, which
// lists every flag; a mistyped command gets the nearest one suggested.
func TestHelpShowsTheFlagsToKnowFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	code, short := runToExit(t, 30*time.Second, "up", "-h")
	if code != 0 {
		t.Errorf("up -h: exit status %d, want 0", code)
	}
	if n := strings.Count(short, "\n"); n > 70 {
		t.Errorf("up -h is %d lines, want a screen's worth", n)
	}
	at := func(s, w string) int {
		i := strings.Index(s, w)
		if i < 0 {
			t.Errorf("missing %q", w)
		}
		return i
	}
	if at(short, "Common:") > at(short, "  -replicas int") || at(short, "  -replicas int") > at(short, "Listeners:") ||
		at(short, "Listeners:") > at(short, "Limits:") || at(short, "Hedging and routing:") > at(short, "TLS:") || at(short, "TLS:") > at(short, "Engine:") {
		t.Error("up -h is not grouped common, listeners, limits, hedging, TLS, engine with --replicas under common")
	}
	for _, w := range []string{"  -engine string", "  -model string", "  -data string", "up --help-all"} {
		at(short, w)
	}
	if strings.Contains(short, "-acme-email") || strings.Contains(short, "-sim-429-rate") {
		t.Error("up -h lists the rarely needed flags")
	}
	code, all := runToExit(t, 30*time.Second, "up", "--help-all")
	if code != 0 {
		t.Errorf("up --help-all: exit status %d, want 0", code)
	}
	for _, w := range []string{"  -acme-email string", "  -sim-429-rate float", "  -batch-concurrency int", "  -replicas int", "Other:"} {
		at(all, w)
	}
	if n, m := strings.Count(all, "\n  -"), strings.Count(short, "\n  -"); n < 80 || n <= m {
		t.Errorf("up --help-all lists %d flags (-h: %d)", n, m)
	}

	code, stderr := runToExit(t, 30*time.Second, "gatway", "--data", t.TempDir())
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if want := `tailgate: unknown command "gatway" (did you mean gateway?)`; code != 2 || lines[len(lines)-1] != want {
		t.Errorf("exit status %d, last line %q; want 2, %q", code, lines[len(lines)-1], want)
	}
}
