package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server/gateway"
	"github.com/tailgate-dev/tailgate/server/slo"
	"github.com/tailgate-dev/tailgate/serving/childlog"
)

// The helpers more than one command uses: flag sets and their parsing, the
// log flags, secrets from the environment, opening a deployment's database,
// printing.

// errUsage ends a command given wrong arguments (exit status 2); what was
// wrong is already printed.
var errUsage = errors.New("usage")

// newFlagSet returns the flag set of `tailgate SYNOPSIS`: -h prints the
// synopsis and the flags to know first on stderr, --help-all every flag
// (see printFlags). Parse it with parseFlags or parseArgs.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tailgate %s\n\n", synopsis)
		printFlags(fs, fs.Output(), false)
	}
	return fs
}

// parseFlags parses args of a command that takes flags only: any other
// argument is an error (with the flag package alone, a stray word would end
// the flags silently and drop every flag after it).
func parseFlags(fs *flag.FlagSet, args []string) error {
	_, err := parseArgs(fs, args, 0)
	return err
}

// parseArgs parses flags that may come before, between and after at most maxArgs
// positional arguments (`backup FILE --force`), and returns the positional
// ones; after "--" every argument is positional. -h prints the usage and
// returns flag.ErrHelp. A bad flag or an argument too many prints a short
// usage, then the error as the last line, and returns errUsage.
func parseArgs(fs *flag.FlagSet, args []string, maxArgs int) ([]string, error) {
	out, usage := fs.Output(), fs.Usage
	// The flag package would print its error first and the whole flag list
	// after it, burying the error; it is reported below instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	plainDurations := acceptDays(fs)
	defer func() { fs.SetOutput(out); fs.Usage = usage; plainDurations() }()
	if wantsHelpAll(args) {
		fmt.Fprintf(out, "%s\n\n", synopsisOf(fs, usage))
		printFlags(fs, out, true)
		return nil, flag.ErrHelp
	}
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(out)
			plainDurations() // -h names their type "duration"
			usage()
			return nil, err
		}
		if err != nil {
			if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
				err = fmt.Errorf("%w%s", err, didYouMean(fs, name))
			}
			return nil, usageError(fs, out, usage, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	if err := secretsFromEnv(fs, os.Getenv); err != nil {
		return nil, usageError(fs, out, usage, err)
	}
	if len(pos) > maxArgs {
		err := fmt.Errorf("unexpected argument %q", pos[maxArgs])
		if maxArgs == 0 {
			err = fmt.Errorf("unexpected argument %q: %s takes flags only", pos[maxArgs], fs.Name())
		}
		if v := pos[maxArgs]; v == "true" || v == "false" {
			err = fmt.Errorf("%w (a switch takes its value after '=', e.g. --json=%s)", err, v)
		}
		return nil, usageError(fs, out, usage, err)
	}
	return pos, nil
}

// parseDuration reads a duration as every command takes it, in flags and
// arguments alike: Go's syntax (90s, 15m, 1h30m) with whole or fractional
// days in front (7d, 1.5d, 1d12h; a day is 24 hours). Go's own parser has
// no days, and a user writing `--since 7d` should not have to know that.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	bad := fmt.Errorf("%q is not a duration: want e.g. 90s, 15m, 24h, 7d or 1d12h", s)
	days, rest, found := strings.Cut(s, "d")
	if !found {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		return d, nil
	}
	n, err := strconv.ParseFloat(days, 64)
	if err != nil || n < 0 || n > 100*365 || strings.ContainsAny(days, "eE+-") {
		return 0, bad
	}
	d := time.Duration(n * float64(24*time.Hour))
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil || r < 0 || strings.HasPrefix(rest, "+") {
			return 0, bad
		}
		d += r
	}
	return d, nil
}

// dayDuration is a duration flag read by parseDuration: it sets the flag
// package's own value, so defaults, -h and flag.Visit stay as they are.
type dayDuration struct{ flag.Value }

// String is the wrapped value's; the flag package calls it on a zero
// dayDuration (no value) to learn a flag's zero default, hence the nil check.
func (d dayDuration) String() string {
	if d.Value == nil {
		return ""
	}
	return d.Value.String()
}

func (d dayDuration) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	return d.Value.Set(v.String())
}

// acceptDays makes every duration flag of fs (whichever package registered
// it: the gateway's config, the sim knobs, a command's own) parse with
// parseDuration, and returns the function that puts the plain values back.
func acceptDays(fs *flag.FlagSet) (restore func()) {
	plain := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, ok := g.Get().(time.Duration); ok {
				plain[f] = f.Value
				f.Value = dayDuration{f.Value}
			}
		}
	})
	return func() {
		for f, v := range plain {
			f.Value = v
		}
	}
}

// usageError prints the synopsis of fs's usage (not its flag list), a hint
// to -h, and err as the last line, on w; it returns errUsage.
func usageError(fs *flag.FlagSet, w io.Writer, usage func(), err error) error {
	fmt.Fprintf(w, "%s\nRun 'tailgate %s -h' for its flags.\n\ntailgate %s: %v\n", synopsisOf(fs, usage), fs.Name(), fs.Name(), err)
	return errUsage
}

// synopsisOf returns the "Usage: ..." part of fs's usage, without its flags.
func synopsisOf(fs *flag.FlagSet, usage func()) string {
	var b strings.Builder
	prev := fs.Output()
	fs.SetOutput(&b)
	usage()
	fs.SetOutput(prev)
	synopsis, _, _ := strings.Cut(b.String(), "\n\nFlags")
	return synopsis
}

// logFlags are the logging flags every long-running command has. Its
// logger flattens the log lines of child processes that a command forwards
// (see childlog).
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

// parse registers the log flags on fs (after the command's own), parses
// args and returns the logger they ask for: every long-running command's
// prelude.
func (l *logFlags) parse(fs *flag.FlagSet, args []string, stderr io.Writer) (*slog.Logger, error) {
	l.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	return l.logger(stderr)
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	h, level, err := l.handler(w)
	if err != nil {
		return nil, err
	}
	return slog.New(childlog.NewHandler(h, level)), nil
}

// handler returns the handler that writes records on w in --log-format,
// at every level, and the --log-level to filter with: childlog filters
// (a child's line forwarded at INFO may be an error; see
// childlog.NewHandler).
func (l *logFlags) handler(w io.Writer) (slog.Handler, slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, 0, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: slog.Level(math.MinInt32)}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.NewTextHandler(w, opts), level, nil
	case "json":
		return slog.NewJSONHandler(w, opts), level, nil
	}
	return nil, 0, fmt.Errorf("--log-format must be text or json, not %q", l.format)
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// secretEnv lists the flags that carry a secret and the environment
// variable that supplies each when the command line does not: a flag is
// visible to every user of the box (ps, /proc/PID/cmdline) and stays in
// shell history; the environment is not (systemd's EnvironmentFile=,
// Kubernetes' secretKeyRef). The flag wins, and so does any flag of
// unless (a file that holds the same secret).
var secretEnv = []struct {
	flag, env string
	unless    []string
}{
	{"cluster-token", "TAILGATE_CLUSTER_TOKEN", []string{"cluster-token-file"}},
	{"join-token", "TAILGATE_JOIN_TOKEN", []string{"join-token-file"}},
	{"mesh-authkey", "TAILGATE_MESH_AUTHKEY", nil},
	{"key", "TAILGATE_API_KEY", []string{"key-file"}},
	{"key-b", "TAILGATE_API_KEY_B", []string{"key-file-b"}},
}

// secretsFromEnv sets each secret flag of fs that its command line left out
// from its environment variable (looked up by getenv). It sets the value,
// not the flag: flagGiven and warnSecretFlags still see only the command
// line.
func secretsFromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	for _, s := range secretEnv {
		f := fs.Lookup(s.flag)
		if f == nil || flagGiven(fs, s.flag) || slices.ContainsFunc(s.unless, func(n string) bool { return flagGiven(fs, n) }) {
			continue
		}
		if v := strings.TrimSpace(getenv(s.env)); v != "" {
			if err := f.Value.Set(v); err != nil {
				return fmt.Errorf("$%s (for --%s): %w", s.env, s.flag, err)
			}
		}
	}
	return nil
}

// flagGiven reports whether the flag name was set on fs's command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// warnSecretFlags warns about secrets given as command-line flags: any
// user of the box can read them in ps and /proc, and shells keep them in
// their history. Files and environment variables do not leak that way.
func warnSecretFlags(log *slog.Logger, fs *flag.FlagSet, names ...string) {
	fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			if f.Name == n && f.Value.String() != "" {
				alt := map[string]string{"cluster-token": "--cluster-token-file or TAILGATE_CLUSTER_TOKEN in the environment", "join-token": "--join-token-file or TAILGATE_JOIN_TOKEN in the environment", "mesh-authkey": "TAILGATE_MESH_AUTHKEY (or TS_AUTHKEY) in the environment"}[n]
				log.Warn("a secret on the command line is visible to every user of this box (ps, /proc); prefer "+alt, "flag", "--"+n)
			}
		}
	})
}

// openCommand finishes the prelude of a command on an existing deployment:
// it parses args with fs (which defines --data into dir), takes the one
// positional argument named want (none when want is ""), and opens the
// deployment's store, which the caller closes.
func openCommand(fs *flag.FlagSet, stderr io.Writer, args []string, dir *string, want string) (*data.Store, string, error) {
	var arg string
	if want == "" {
		if err := parseFlags(fs, args); err != nil {
			return nil, "", err
		}
	} else {
		pos, err := parseArgs(fs, args, 1)
		if err != nil {
			return nil, "", err
		}
		if len(pos) != 1 || pos[0] == "" {
			return nil, "", usageError(fs, stderr, fs.Usage, errors.New("want the "+want))
		}
		arg = pos[0]
	}
	st, err := openStore(*dir)
	return st, arg, err
}

// openStore opens the database of an existing deployment in dir.
func openStore(dir string) (*data.Store, error) {
	db, err := gateway.ExistingDatabase(dir)
	if err != nil {
		return nil, err
	}
	return data.Open(db)
}

func keyStatus(k data.Key, now time.Time) string {
	switch {
	case k.Revoked():
		return "revoked"
	case k.ExpiredAt(now):
		return "expired"
	}
	return "active"
}

// money is an amount of micro-dollars in dollars, as short as it is exact
// (1.5, 0.000001).
func money(micros int64) string {
	return strconv.FormatFloat(float64(micros)/1e6, 'f', -1, 64)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal tells whether w is a terminal, where progress is rewritten in
// place and a secret link may be shown.
func isTerminal(w io.Writer) bool {
	fl, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := fl.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// undoNewDir returns what removes dir again if it does not exist now: a
// start that fails (a busy port) leaves no data directory it made behind,
// so the next try is a first start again. One that exists is never touched.
func undoNewDir(dir string) (undo func()) {
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		return func() {}
	}
	return func() { _ = os.RemoveAll(dir) }
}

// readBenchSLO reads the latency budgets of a gateway config file (its slo
// and models.NAME.slo keys over the defaults, as the gateway reads them)
// for the bench.
func readBenchSLO(path string) (*load.SLO, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--slo: %w", err)
	}
	cfg, err := gateway.LoadSLO(raw)
	if err != nil {
		return nil, fmt.Errorf("--slo %s: %w", path, err)
	}
	objs := func(model string) []load.Objective {
		var out []load.Objective
		for _, d := range slo.Docs(cfg.Objectives(model)) {
			out = append(out, load.Objective{Kind: string(d.Kind), Stage: d.Stage, Name: d.Objective, Target: d.Target, BudgetMS: d.BudgetMS})
		}
		return out
	}
	s := &load.SLO{Default: objs(""), Models: map[string][]load.Objective{}}
	for name := range cfg.Models {
		s.Models[name] = objs(name)
	}
	return s, nil
}
