package main

import (
	"errors"
	"os"
	"path/filepath"
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
			`tailgate up: flag provided but not defined: -replica`},
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
			`tailgate workers: unknown subcommand "rm" (want list, invite, approve or revoke)`},
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
